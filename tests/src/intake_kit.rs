//! What the letters' intake tests share (`letter_intake.rs` and its outside attacks): the
//! reference consumer's harness with a lock wait of its own, a batch every record of which is
//! acked, a settle of everything received, a settler at work, and a copy of a job inside its
//! transaction.

use consumer::AwardPoints;
use shared::clock::SystemClock;
use shared::dead_letter::{Settling, settle_behind};
use shared::envelope::JobDigest;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{JobId, TenantId};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;

/// The claims' lock wait of [`settle_all`].
pub const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// The reference consumer's harness in `mode`, its claims waiting at most `wait`.
pub fn harness_waiting(pool: &PgPool, mode: CommitMode, wait: Duration) -> Harness<AwardPoints> {
    let settings = HarnessSettings {
        lock_timeout: wait,
        commit: mode,
        ..shared_testkit::settings()
    };
    shared_testkit::harness_on(
        pool,
        AwardPoints::new(crate::consumer_name()),
        settings,
        Arc::new(SystemClock),
    )
}

/// `batch` through `harness`, every record acked.
pub async fn run(harness: &Harness<AwardPoints>, batch: &[IncomingMessage]) -> Vec<RecordOutcome> {
    let outcomes = shared_testkit::run_batch(harness, batch).await;
    assert!(
        outcomes.iter().all(RecordOutcome::is_ack),
        "every record acked: {outcomes:?}"
    );
    outcomes
}

/// Everything the reference consumer has received, settled.
pub async fn settle_all(pool: &PgPool) -> Settling {
    settle_behind(
        pool,
        &crate::consumer_name(),
        chrono::Utc::now(),
        SETTLE_WAIT,
        1_000,
    )
    .await
    .expect("settling")
}

/// Holds the reference consumer's settle lock in an open transaction, as a settler at work does.
pub async fn hold_settle_lock(pool: &PgPool) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.unwrap();
    shared::dead_letter::take_settle_lock(&mut tx, &crate::consumer_name())
        .await
        .unwrap();
    tx
}

/// A transaction inside a copy of `job`: its fence claimed with `digest` and its award written,
/// not committed.
pub async fn copy_inside_its_transaction(
    pool: &PgPool,
    job: JobId,
    tenant: TenantId,
    digest: &JobDigest,
) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.unwrap();
    let claim: String = sqlx::query_scalar(
        "SELECT core.claim_job_fence($1, $2, $3, now(), now() + interval '1 day', '1s', $4)",
    )
    .bind(job.0)
    .bind(crate::consumer_name().as_str())
    .bind(tenant.0)
    .bind(&digest.0[..])
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(claim, "claimed");
    sqlx::query(
        "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
         VALUES ($1, $2, 'a', 5, now())",
    )
    .bind(job.0)
    .bind(tenant.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Waits (up to 30 s) until a session of the test's database waits on a lock: a copy blocked
/// on a fence or a letter held by the test.
pub async fn until_a_session_waits_on_a_lock(pool: &PgPool) {
    let waiting = async {
        loop {
            let locked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .expect("reading pg_stat_activity");
            if locked > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("a session waits on a lock");
}

/// The scheduled run on `pool` (no alerts, no replays sent, the system clock).
pub fn scheduled_run(pool: &PgPool) -> shared::upkeep::ScheduledRun {
    shared::upkeep::ScheduledRun {
        pool: pool.clone(),
        clock: Arc::new(SystemClock),
        alerter: None,
        sweep: shared_testkit::SWEEP,
        escalate_after: Duration::from_secs(3 * 86_400),
        replayer: None,
        heartbeat: None,
        replay_alert_after: shared::config::REPLAY_ALERT_AFTER,
    }
}
