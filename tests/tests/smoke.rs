//! The deployer's smoke test (`scripts/smoke.sh`, the `smoke` binary) against the local stack:
//! the real consumer, ingester and API binaries behind a local gateway with its tokens, fed from
//! the real (local) SQS queue while the smoke test runs.

use e2e::gateway::{DevToken, Gateway};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;

/// Runs the smoke binary against `stack` through `gateway` with `token`, feeding the stack's
/// queues until it exits; its exit status and stdout.
async fn smoke(
    stack: &e2e::stack::Stack,
    gateway: &Gateway,
    token: &str,
    extra: &[&str],
) -> (i32, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smoke"))
        .args(["--consumer", &stack.consumer_name, "--timeout", "60"])
        .args(extra)
        .env("SMOKE_QUEUE_URL", &stack.jobs.url)
        .env("DLQ_API_URL", &gateway.url)
        .env("DLQ_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the smoke binary");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        stack.poll().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut out = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut out)
        .await
        .unwrap();
    (status.code().unwrap_or(-1), out)
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_smoke_test_passes_on_a_working_stack_and_cleans_its_letter_up(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (operator, reader) = DevToken::local_pair();
    let gateway = Gateway::start(
        stack.api.clone(),
        &[operator.clone(), reader.clone()],
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();

    let (status, out) = smoke(&stack, &gateway, &operator.token, &[]).await;
    assert_eq!(status, 0, "{out}");
    for said in [
        "ok   the API answers a read",
        "ok   a canary job reaches its fence",
        "ok   a poison job becomes a letter, then is discarded",
        "smoke test passed",
    ] {
        assert!(out.contains(said), "{said:?}: {out}");
    }
    // What it said is what the database holds: one fence, one letter, discarded with a reason.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        1
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters
              WHERE status = 'discarded' AND error_kind = 'poison' AND discard_reason LIKE 'smoke test %'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'"
        )
        .await,
        0,
        "nothing left for on-call"
    );

    // A token that may only read: the letter is written but cannot be discarded, and it says so.
    let (status, out) = smoke(&stack, &gateway, &reader.token, &[]).await;
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("FAIL a poison job becomes a letter, then is discarded")
            && out.contains("discard it by hand")
            && out.contains("smoke test FAILED"),
        "{out}"
    );

    // A queue no consumer reads: the canary times out naming what to look at.
    let (status, out) = tokio::time::timeout(Duration::from_secs(90), async {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smoke"))
            .args([
                "--consumer",
                &stack.consumer_name,
                "--timeout",
                "3",
                "--no-letter",
            ])
            .env("SMOKE_QUEUE_URL", &stack.dlq.url) // the ingester is not polled here
            .env("DLQ_API_URL", &gateway.url)
            .env("DLQ_TOKEN", &operator.token)
            .output()
            .await
            .unwrap();
        (
            child.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&child.stdout).into_owned(),
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("FAIL a canary job reaches its fence") && out.contains("no fence"),
        "{out}"
    );
}
