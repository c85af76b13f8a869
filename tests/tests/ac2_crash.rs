//! AC2: a crash between the work and the commit leaves neither effect nor fence, proven twice:
//! with a real SIGKILL of a consumer process, and with a failpoint (a panic) inside one; each in
//! per-job and in batch mode (a batch of three, killed after the batch's work). In all, the
//! retry that follows applies each job's work exactly once.

use consumer::{AwardPoints, count_awards};
use e2e::{AfterWork, FailAfterWork, consumer_name, harness};
use shared::fence::fence_exists;
use shared::harness::{CommitMode, IncomingMessage, RecordOutcome};
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
        ..shared_testkit::message_on("q", body, receive_count)
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
    killed(pool_opts, connect, CommitMode::PerJob, 1).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac2_consumer_killed_between_work_and_commit_leaves_neither_effect_nor_fence_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    killed(pool_opts, connect, CommitMode::Batch, 3).await;
}

async fn killed(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
    jobs: usize,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let batch: Vec<(JobId, String)> = (0..jobs).map(|_| new_job()).collect();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hang-after-work"))
        .args(batch.iter().map(|(_, body)| body))
        .env("DATABASE_URL", e2e::test_database_url(&connect))
        .env("COMMIT_MODE", mode.as_str())
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
    let mut ids: Vec<JobId> = batch.iter().map(|(j, _)| *j).collect();
    ids.sort();
    let expected: Vec<String> = match mode {
        // One job at a time: the first hangs after its own work.
        CommitMode::PerJob => vec![batch[0].0.to_string()],
        // Together: the whole batch's work is written, in job id order.
        CommitMode::Batch => ids.iter().map(|j| j.to_string()).collect(),
    };
    assert_eq!(
        announced,
        format!("{} {}", e2e::WORK_WRITTEN, expected.join(" "))
    );
    // The work is written inside the child's open transaction: invisible from outside.
    for (job_id, _) in &batch {
        assert_eq!(count_awards(&pool, *job_id).await.unwrap(), 0);
    }

    child.start_kill().unwrap(); // SIGKILL: no destructor, no rollback from the client side.
    assert!(!child.wait().await.unwrap().success());
    for (job_id, body) in &batch {
        assert_neither_then_one_on_retry(&pool, *job_id, body).await;
    }
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

/// The failpoint inside a batch's work: the batch rolls back whole, its jobs go one by one and
/// meet the failpoint again, each a transient failure; nothing of any of them remains.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac2_failpoint_between_work_and_commit_leaves_neither_effect_nor_fence_in_batch_mode(
    pool: PgPool,
) {
    let batch: Vec<(JobId, String)> = (0..3).map(|_| new_job()).collect();
    let msgs: Vec<IncomingMessage> = batch
        .iter()
        .enumerate()
        .map(|(i, (_, body))| IncomingMessage {
            message_id: format!("m-{i}"),
            ..delivery(body, 1)
        })
        .collect();
    let consumer = FailAfterWork(AwardPoints::new(consumer_name()), AfterWork::Panic);
    let harness = e2e::harness_in(pool.clone(), consumer, CommitMode::Batch);
    let outcomes = harness.process_batch(&msgs, &|| true, 1).await;
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Some(RecordOutcome::Retry { attempt: 1, error, .. }) if error.contains("failpoint")),
            "{outcome:?}"
        );
    }
    assert_eq!(
        harness
            .metrics()
            .get(shared::metrics::Metric::BatchFellBack),
        1
    );
    for (job_id, body) in &batch {
        assert_neither_then_one_on_retry(&pool, *job_id, body).await;
    }
}
