//! AC2 with a real crash: a consumer process is killed with SIGKILL after writing its effect
//! and before committing. Neither the effect nor the fence may survive, and the retry that
//! follows must apply the work exactly once.

use shared::fence::fence_exists;
use shared::harness::{IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::reference::{AwardPoints, count_awards};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

/// `DATABASE_URL` (credentials and all) pointed at the test's own database.
fn url_of(opts: &PgConnectOptions) -> String {
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let server = server.split('?').next().unwrap_or_default();
    let (head, _) = server
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    format!(
        "{head}/{}",
        opts.get_database().expect("test database name")
    )
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn ac2_consumer_killed_between_work_and_commit_leaves_neither_effect_nor_fence(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let job_id = JobId(Uuid::new_v4());
    let body = serde_json::json!({
        "job_id": job_id,
        "tenant_id": TenantId(Uuid::new_v4()),
        "correlation_id": "crash-test",
        "payload": {"account_id": "acct-9", "points": 50},
    })
    .to_string();

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hang-after-work"))
        .arg(&body)
        .env("DATABASE_URL", url_of(&connect))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let announced = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the child wrote its work within 60 s")
        .unwrap()
        .expect("the child announced its work");
    assert_eq!(announced, format!("{} {job_id}", e2e::WORK_WRITTEN));

    // The work is written inside the child's open transaction: invisible from outside.
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);

    child.start_kill().unwrap(); // SIGKILL: no destructor, no rollback from the client side.
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "killed: {status:?}");

    let consumer = ConsumerName::new("award-points").unwrap();
    assert_eq!(
        count_awards(&pool, job_id).await.unwrap(),
        0,
        "no effect survives the crash"
    );
    assert!(
        !fence_exists(&pool, job_id, &consumer).await.unwrap(),
        "no fence survives the crash"
    );

    // The redelivery finds no fence (PostgreSQL released the dead session's lock) and applies
    // the work exactly once.
    let harness = shared::harness::Harness::new(
        AwardPoints::new(consumer.clone()),
        pool.clone(),
        shared::harness::HarnessSettings {
            policy: Default::default(),
            fence_ttl: Duration::from_secs(7 * 86_400),
            lock_timeout: Duration::from_secs(30),
            contended_retry_after: Duration::from_secs(2),
        },
        Arc::new(shared::clock::SystemClock),
        rand::SeedableRng::seed_from_u64(5),
    );
    let redelivery = IncomingMessage {
        message_id: "m-1".into(),
        queue: "q".into(),
        body,
        receive_count: 2,
        replay_of: None,
    };
    assert_eq!(harness.process(&redelivery).await, RecordOutcome::Processed);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    assert!(fence_exists(&pool, job_id, &consumer).await.unwrap());
}
