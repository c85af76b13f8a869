//! Issue 22, item 7: a job that commits closes the letters still pending for it
//! (`core.finish_job`, `core.finish_jobs`). A letter row held locked by someone else (a review,
//! an operator's open `psql` transaction) must not stall the consumer: the close waits a
//! bounded time, then the job's transaction fails whole and the job is retried, so no job ever
//! commits with its letter left pending (a letter is a true record).

use consumer::AwardPoints;
use shared::dead_letter::ReviewStatus;
use shared::harness::{CommitMode, RecordOutcome};
use shared::ids::{DeadLetterId, JobId};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::time::Duration;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// Far longer than the bounded wait: only a close that waits without bound runs into it.
const STALL: Duration = Duration::from_secs(60);

/// A letter pending for `job_id`, as a failed copy of the job left it.
async fn pending_letter(pool: &PgPool, job_id: JobId, body: &str) -> DeadLetterId {
    let letter = TestLetter {
        last_error: "partner ledger offline".into(),
        ..TestLetter::new(Some(job_id), &reference_name(), QUEUE, body)
    };
    record_letter(pool, &letter, t0()).await
}

/// Another session holding the letter's row lock until it is dropped or rolled back.
async fn hold(pool: &PgPool, letter: DeadLetterId) -> Transaction<'static, Postgres> {
    let mut tx = shared::db::begin(pool).await.unwrap();
    sqlx::query("SELECT 1 FROM core.dead_letters WHERE id = $1 FOR UPDATE")
        .bind(letter.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

async fn status(pool: &PgPool, letter: DeadLetterId) -> ReviewStatus {
    shared::dead_letter::letter(pool, letter)
        .await
        .unwrap()
        .unwrap()
        .status
}

async fn fenced(pool: &PgPool, job_id: JobId) -> bool {
    fence_committed(pool, job_id, &reference_name()).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_locked_letter_does_not_stall_finish_job(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = own_pool(connect, 8).await;
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(award(5));
    let letter = pending_letter(&pool, job_id, &body).await;
    let holder = hold(&pool, letter).await;

    let outcome = tokio::time::timeout(STALL, harness.process(&message(&body, 1)))
        .await
        .expect("finish_job waited without bound for a letter someone else holds");
    assert!(
        matches!(&outcome, RecordOutcome::Retry { error, .. } if error.contains("another session holds the letter")),
        "the job is retried, not committed, saying why: {outcome:?}"
    );
    assert!(!fenced(&pool, job_id).await, "nothing committed");
    holder.rollback().await.unwrap();
    assert_eq!(status(&pool, letter).await, ReviewStatus::PendingReview);

    // Once the lock is gone, the next delivery commits the job and closes its letter with it.
    assert_eq!(
        harness.process(&message(&body, 2)).await,
        RecordOutcome::Processed
    );
    assert!(fenced(&pool, job_id).await);
    assert_eq!(status(&pool, letter).await, ReviewStatus::Discarded);
}

/// In batch mode the whole batch's transaction closes its jobs' letters: one locked letter must
/// not hold the batch's other jobs back.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_locked_letter_does_not_stall_a_batch(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = own_pool(connect, 8).await;
    let harness = harness_in(&pool, award_points(), CommitMode::Batch);
    let (locked_job, locked_body) = job(award(5));
    let letter = pending_letter(&pool, locked_job, &locked_body).await;
    let (others, bodies): (Vec<JobId>, Vec<String>) = (0..3).map(|_| job(award(1))).unzip();
    let mut batch = vec![message(&locked_body, 1)];
    batch.extend(bodies.iter().map(|b| message(b, 1)));
    let holder = hold(&pool, letter).await;

    let outcomes = tokio::time::timeout(STALL, harness.process_batch(&batch, &|| true, 4))
        .await
        .expect("the batch waited without bound for a letter someone else holds");
    assert!(
        matches!(outcomes[0], Some(RecordOutcome::Retry { .. })),
        "{outcomes:?}"
    );
    for (job_id, outcome) in others.iter().zip(&outcomes[1..]) {
        assert_eq!(outcome, &Some(RecordOutcome::Processed), "{outcomes:?}");
        assert!(fenced(&pool, *job_id).await);
    }
    assert!(!fenced(&pool, locked_job).await);
    holder.rollback().await.unwrap();
    assert_eq!(status(&pool, letter).await, ReviewStatus::PendingReview);
}
