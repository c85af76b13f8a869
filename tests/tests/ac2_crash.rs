//! AC2: a crash between the work and the commit leaves neither effect nor fence, proven twice:
//! with a real SIGKILL of a consumer process, and with a failpoint (a panic) inside one.
//! In both, the retry that follows applies the work exactly once.

use consumer::{AwardPoints, count_awards};
use e2e::{AfterWork, FailAfterWork, consumer_name, harness};
use shared::fence::fence_exists;
use shared::harness::{IncomingMessage, RecordOutcome};
use shared::ids::{JobId, TenantId};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

fn new_job() -> (JobId, String) {
    let job_id = JobId(Uuid::new_v4());
    let body = serde_json::json!({
        "job_id": job_id,
        "tenant_id": TenantId(Uuid::new_v4()),
        "correlation_id": "crash-test",
        "payload": {"account_id": "acct-9", "points": 50},
    });
    (job_id, body.to_string())
}

fn delivery(body: &str, receive_count: u32) -> IncomingMessage {
    IncomingMessage {
        message_id: "m-1".into(),
        queue: "q".into(),
        body: body.into(),
        receive_count,
        replay_of: None,
    }
}

async fn assert_neither_then_one_on_retry(pool: &PgPool, job_id: JobId, body: &str) {
    assert_eq!(
        count_awards(pool, job_id).await.unwrap(),
        0,
        "no effect survives"
    );
    assert!(
        !fence_exists(pool, job_id, &consumer_name()).await.unwrap(),
        "no fence survives"
    );
    // The redelivery finds no fence (the dead transaction's lock is gone) and does the work once.
    let retried = harness(pool.clone(), AwardPoints::new(consumer_name()))
        .process(&delivery(body, 2))
        .await;
    assert_eq!(retried, RecordOutcome::Processed);
    assert_eq!(count_awards(pool, job_id).await.unwrap(), 1);
    assert!(fence_exists(pool, job_id, &consumer_name()).await.unwrap());
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac2_consumer_killed_between_work_and_commit_leaves_neither_effect_nor_fence(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let (job_id, body) = new_job();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hang-after-work"))
        .arg(&body)
        .env("DATABASE_URL", e2e::test_database_url(&connect))
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
    assert!(!child.wait().await.unwrap().success());
    assert_neither_then_one_on_retry(&pool, job_id, &body).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac2_failpoint_between_work_and_commit_leaves_neither_effect_nor_fence(pool: PgPool) {
    let (job_id, body) = new_job();
    let consumer = FailAfterWork(AwardPoints::new(consumer_name()), AfterWork::Panic);
    let outcome = harness(pool.clone(), consumer)
        .process(&delivery(&body, 1))
        .await;
    assert!(
        matches!(&outcome, RecordOutcome::Retry { attempt: 1, error, .. } if error.contains("failpoint")),
        "a panic is a transient failure, retried: {outcome:?}"
    );
    assert!(!outcome.is_ack());
    assert_neither_then_one_on_retry(&pool, job_id, &body).await;
}
