//! The consumer as it is deployed: built as its own package (as `sam build` / cargo-lambda build
//! it), without this test crate's `demo-faults` feature. Nothing in it can be asked to fail or
//! to crash its own process: a message that asks is poison.

use consumer::count_awards;
use e2e::stack::{Stack, StackSpec};
use serde_json::json;
use shared::dead_letter::letters_for_job;
use shared::ids::{ConsumerName, JobId, TenantId};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

/// Builds `-p consumer --bin consumer` alone and returns the executable cargo reports.
fn build_deployed_consumer() -> PathBuf {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "consumer",
            "--bin",
            "consumer",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cargo build");
    assert!(
        output.status.success(),
        "cargo build -p consumer failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "consumer")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("the consumer executable")
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_deployed_consumer_treats_a_fault_request_as_poison(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let binary = build_deployed_consumer();
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let mut spec = StackSpec::time_scaled(
        e2e::test_binaries!(),
        &e2e::test_database_url(&connect),
        &format!("deployed-{}", &Uuid::new_v4().simple().to_string()[..12]),
    );
    spec.binaries.consumer = binary;
    let stack = Stack::start(spec).await;
    let job_id = JobId(Uuid::new_v4());
    let body = json!({"job_id": job_id, "tenant_id": TenantId(Uuid::new_v4()), "correlation_id": "attack",
        "payload": {"account_id": "a", "points": 5, "demo_fault": "crash_before_commit"}});
    stack.send(&body.to_string()).await;
    let consumer = ConsumerName::new("award-points").unwrap();
    let polls = stack
        .run_until(Duration::from_secs(60), || async {
            !letters_for_job(&pool, job_id, &consumer)
                .await
                .unwrap()
                .is_empty()
        })
        .await;
    assert!(
        polls.iter().all(|(_, p)| p.invoke_error.is_none()),
        "the process never crashed: {polls:?}"
    );
    let letters = letters_for_job(&pool, job_id, &consumer).await.unwrap();
    assert_eq!(
        (letters[0].error_kind.as_str(), letters[0].attempts),
        ("poison", 1)
    );
    assert!(
        letters[0].last_error.contains("demo_fault"),
        "{}",
        letters[0].last_error
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
}
