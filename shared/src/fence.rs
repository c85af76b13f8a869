//! The idempotency fence, `core.processed_jobs`.
//!
//! Invariant: [`claim_fence`] runs first inside the work's transaction. The row commits with the
//! work, so a committed fence means committed work and vice versa. A concurrent copy of the same
//! job blocks on the row until the holder commits (then sees a duplicate) or rolls back (then
//! claims it); `lock_timeout` bounds that wait.

use crate::envelope::JobDigest;
use crate::ids::{ConsumerName, JobId, TenantId, bounded_id};
use crate::literal;
use crate::retry::RetryPolicy;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use std::time::Duration;

/// Extra time a fence outlives every copy of its job that can still arrive.
pub(crate) const TTL_MARGIN: Duration = Duration::from_secs(24 * 60 * 60);

/// PostgreSQL's `lock_not_available`, raised when `lock_timeout` expires.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The result of trying to claim a job's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceClaim {
    /// This transaction holds the fence; do the work and commit.
    Claimed,
    /// The job was already processed by this consumer: ack and skip.
    Duplicate,
    /// A job was already processed under this id, but another one: what makes it up (its
    /// [`JobDigest`]) differs. Nothing runs; the copy becomes a `conflict` letter.
    Conflict,
}

/// Why the fence could not be claimed or refused.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Another transaction holds this job's fence and did not finish within the lock timeout.
    #[error("a concurrent copy of the job holds its fence")]
    Contended,
    /// Any other database failure.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The shortest fence TTL that is safe: it outlives every copy of a job that can still arrive,
/// by every path a copy takes, with some margin:
/// - by the job queue: up to its retention after the send (the retry window lies within it);
/// - by the DLQ: up to the DLQ's retention after the *original* send (a standard queue's
///   redrive keeps the message's enqueue time);
/// - by a redrive of the DLQ back to its source (SQS's DLQ redrive, or an operator moving the
///   messages): the moved message is a new one, sent again at the end of the DLQ's retention at
///   the latest, and from then on it can arrive by the job queue (its retention) or, failing
///   again, by the DLQ (its retention, counted from that new send).
///
/// So: DLQ retention + the longer of the two retentions + the retry window + [`TTL_MARGIN`].
///
/// A FIFO queue's DLQ resets a message's enqueue time when it moves it (SQS documents it), so
/// its DLQ stay counts from the move, not the send: a copy lives up to the queue's retention,
/// then the DLQ's, and redriven back, both again. So with `fifo`: twice (queue retention + DLQ
/// retention) + the retry window + [`TTL_MARGIN`].
/// (A second move back is not covered: replay letters instead, which checks the fence.)
pub fn ttl_floor(
    queue_retention: Duration,
    dlq_retention: Duration,
    policy: &RetryPolicy,
    fifo: bool,
) -> Duration {
    let one_life = if fifo {
        queue_retention + dlq_retention
    } else {
        dlq_retention
    };
    let after_a_redrive = if fifo {
        queue_retention + dlq_retention
    } else {
        queue_retention.max(dlq_retention)
    };
    one_life + after_a_redrive + policy.max_retry_window() + TTL_MARGIN
}

/// How old (from its own send) a copy of a job may be for its fence to be still there if the
/// job committed: a fence lives `ttl` from its commit, which came after the send. An older copy
/// cannot be settled through the fence (see [`crate::dead_letter::ErrorKind::Unsettled`]).
pub(crate) fn settle_horizon(ttl: Duration) -> Duration {
    ttl.saturating_sub(TTL_MARGIN)
}

/// Inserts the fence of (`job_id`, `consumer`) in the caller's transaction, expiring at
/// `now + ttl`. Waits at most `wait` for a concurrent copy holding the fence; that bound
/// applies to the claim only, and the rest of the transaction (the work) waits as it needs.
/// A claim without a digest (a placeholder, rolled back) never finds a conflict.
pub async fn claim_fence(
    tx: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<FenceClaim, FenceError> {
    claim_job_fence(tx, job_id, consumer, tenant_id, None, now, ttl, wait).await
}

/// [`claim_fence`] for a job whose `digest` the fence keeps, and compares: an existing fence
/// with another digest is [`FenceClaim::Conflict`] (one written without a digest, by an older
/// version, compares equal to any).
#[allow(clippy::too_many_arguments)]
pub async fn claim_job_fence(
    tx: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<FenceClaim, FenceError> {
    // One round trip: `core.claim_job_fence` sets the lock timeout for the insert only, and
    // compares the digest only when the fence was there (see migrations 0007 and 0014), so
    // the transaction is BEGIN, claim, work, COMMIT.
    let claim: String =
        sqlx::query_scalar("SELECT core.claim_job_fence($1, $2, $3, $4, $5, $6, $7)")
            .bind(job_id.0)
            .bind(consumer.as_str())
            .bind(tenant_id.0)
            .bind(now)
            .bind(expiry(now, ttl))
            .bind(lock_wait(wait))
            .bind(digest.map(|d| d.0.as_slice()))
            .fetch_one(&mut *tx)
            .await
            .map_err(claim_error)?;
    Ok(match claim.as_str() {
        "claimed" => FenceClaim::Claimed,
        "conflict" => FenceClaim::Conflict,
        _ => FenceClaim::Duplicate,
    })
}

/// Whether `committed`, the digest a fence keeps, says a copy with `digest` is another job.
pub fn conflicts(committed: Option<&JobDigest>, digest: &JobDigest) -> bool {
    committed.is_some_and(|c| c != digest)
}

/// Whether the job's effect committed, settled through its fence rather than read: a claim
/// waits (at most `wait`) for a copy still inside its transaction, so an in-flight commit is
/// seen as it ends. The claim is rolled back. For a `COMMIT` whose reply was lost. With the
/// job's `digest`, a fence of another job under its id is not this job committed.
pub(crate) async fn settle_committed(
    pool: &sqlx::PgPool,
    job_id: JobId,
    consumer: &ConsumerName,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    wait: Duration,
) -> Result<bool, FenceError> {
    let mut tx = pool.begin().await?;
    let placeholder = TenantId(uuid::Uuid::nil());
    let claim = claim_job_fence(
        &mut tx,
        job_id,
        consumer,
        placeholder,
        digest,
        now,
        Duration::from_secs(60),
        wait,
    )
    .await;
    // Answered before the caller goes on: a dropped transaction's ROLLBACK would go out later.
    tx.rollback().await?;
    Ok(claim? == FenceClaim::Duplicate)
}

/// Claims, in the caller's transaction and in job id order, the fences of a batch's jobs
/// (`(job, tenant, digest)`, the digest kept in the fence), expiring at `now + ttl`; returns the
/// jobs whose fence this transaction inserted. A job left out had a fence already: a duplicate,
/// or another job under its id, which the caller tells apart on its own. Waits at most `wait`
/// for a concurrent copy holding one of the fences ([`FenceError::Contended`] after that: the
/// transaction is aborted). Two batches that share jobs claim them in the same order, so they
/// wait on each other and never deadlock.
pub async fn claim_job_fences(
    tx: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, TenantId, Option<JobDigest>)],
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<std::collections::HashSet<JobId>, FenceError> {
    let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.0.0).collect();
    let tenants: Vec<uuid::Uuid> = jobs.iter().map(|j| j.1.0).collect();
    let digests: Vec<Option<Vec<u8>>> = jobs.iter().map(|j| j.2.map(|d| d.0.to_vec())).collect();
    let claimed: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT core.claim_job_fences($1, $2, $3, $4, $5, $6, $7)")
            .bind(&ids)
            .bind(consumer.as_str())
            .bind(&tenants)
            .bind(now)
            .bind(expiry(now, ttl))
            .bind(lock_wait(wait))
            .bind(&digests)
            .fetch_all(&mut *tx)
            .await
            .map_err(claim_error)?;
    Ok(claimed.into_iter().map(JobId).collect())
}

/// A fence's `expires_at`: `now + ttl`, saturating.
fn expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
}

/// A claim's bounded wait as the claim functions take it (a `lock_timeout` value, at least 1 ms:
/// 0 would mean no bound).
fn lock_wait(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

/// A claim that ran out of its wait is contended; anything else is the database's error.
fn claim_error(e: sqlx::Error) -> FenceError {
    if is_lock_timeout(&e) {
        FenceError::Contended
    } else {
        FenceError::Database(e)
    }
}

/// Whether `e` is a bounded lock wait that ran out (`lock_not_available`).
pub fn is_lock_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == LOCK_NOT_AVAILABLE)
}

/// How the statements that open and close a job's transaction say a claim did not take:
/// `core.open_job`'s own SQLSTATEs.
const ALREADY_PROCESSED: &str = "JF001";
const OTHER_JOB: &str = "JF002";
/// `core.close_job`'s: the fence is not this transaction's own.
const NOT_OWN: &str = "JF003";

/// The job's transaction, opened by its claim in one round trip: `SELECT core.open_job(…);
/// BEGIN`. [`FenceClaim::Claimed`] leaves `conn` inside the job's transaction, holding the fence
/// (inserted first in it, as [`claim_job_fence`] does); anything else leaves no transaction
/// open (the claim failed before `BEGIN`, and its implicit block rolled back), so a duplicate
/// costs this one round trip and nothing else.
#[allow(clippy::too_many_arguments)]
pub async fn open_job(
    conn: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<FenceClaim, FenceError> {
    let sql = format!(
        "SELECT core.open_job({}, {}, {}, {}, {}, {}, {}); BEGIN",
        literal::uuid(job_id.0),
        literal::text(consumer.as_str()),
        literal::uuid(tenant_id.0),
        literal::timestamptz(now),
        literal::timestamptz(expiry(now, ttl)),
        literal::text(&lock_wait(wait)),
        literal::bytea(digest.map(|d| d.0.as_slice())),
    );
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(conn).await {
        Ok(_) => Ok(FenceClaim::Claimed),
        Err(e) => match sqlstate(&e).as_deref() {
            Some(ALREADY_PROCESSED) => Ok(FenceClaim::Duplicate),
            Some(OTHER_JOB) => Ok(FenceClaim::Conflict),
            _ => Err(claim_error(e)),
        },
    }
}

/// A commit group's transaction, opened by its claim in one round trip: `SELECT
/// core.claim_job_fences(…); BEGIN`. Returns the jobs whose fences it claimed (in job id order,
/// see [`claim_job_fences`]); `conn` is then inside the group's transaction, even when it
/// claimed none. A claim that fails leaves no transaction open.
pub async fn open_jobs(
    conn: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, TenantId, Option<JobDigest>)],
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<std::collections::HashSet<JobId>, FenceError> {
    let sql = format!(
        "SELECT core.claim_job_fences({}, {}, {}, {}, {}, {}, {}); BEGIN",
        literal::uuids(jobs.iter().map(|j| j.0.0)),
        literal::text(consumer.as_str()),
        literal::uuids(jobs.iter().map(|j| j.1.0)),
        literal::timestamptz(now),
        literal::timestamptz(expiry(now, ttl)),
        literal::text(&lock_wait(wait)),
        literal::byteas(jobs.iter().map(|j| j.2.as_ref().map(|d| d.0.as_slice()))),
    );
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_all(conn)
        .await
        .map_err(claim_error)?;
    rows.iter()
        .map(|row| Ok(JobId(sqlx::Row::try_get::<uuid::Uuid, _>(row, 0)?)))
        .collect::<sqlx::Result<_>>()
        .map_err(FenceError::Database)
}

/// Why a job's transaction did not end in a `COMMIT` known to have succeeded: its check refused
/// (`F` says how; the harness carries its work's failure here too), or its `COMMIT` failed.
#[derive(Debug, thiserror::Error)]
pub enum CloseError<F: std::error::Error = CheckFailed> {
    /// The check before `COMMIT` refused, so `COMMIT` was not run and the transaction is still
    /// open (or was ended by the work): roll it back.
    #[error(transparent)]
    Check(F),
    /// The check passed and `COMMIT` failed, or the connection failed: the job may or may not
    /// have committed (settle through the fence).
    #[error(transparent)]
    Commit(sqlx::Error),
}

/// How the check before `COMMIT` refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckFailed {
    /// A fence is not this transaction's own: the work committed or rolled back the harness's
    /// transaction itself.
    #[error("{0}")]
    NotOwn(sqlx::Error),
    /// Closing a letter still pending for the job waited past its lock timeout.
    #[error("{0}")]
    LetterLocked(sqlx::Error),
    /// The transaction cannot commit (`25P02`: an SQL error inside the work was not returned),
    /// or another database error.
    #[error("{0}")]
    Aborted(sqlx::Error),
}

/// The last statement of a job's transaction and its `COMMIT`, in one round trip: `SELECT
/// core.close_job(…); COMMIT`. The check passes when the fence is this transaction's own and
/// the transaction is alive (an aborted one fails it with `25P02`, where PostgreSQL would have
/// answered a bare `COMMIT` with a silent `ROLLBACK`); it then clears the job's execution
/// ledger and closes any letter still pending for the job `digest` stands for (see
/// `core.finish_job_of`), and only then is `COMMIT` run.
pub async fn close_job(
    conn: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    message_id: &str,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
) -> Result<(), CloseError> {
    let check = format!(
        "SELECT core.close_job({}, {}, {}, {}, {})",
        literal::uuid(job_id.0),
        literal::text(consumer.as_str()),
        literal::text(&bounded_id(message_id, "message")),
        literal::timestamptz(now),
        literal::bytea(digest.map(|d| d.0.as_slice())),
    );
    check_and_commit(conn, check).await
}

/// [`close_job`] for a commit group: `SELECT core.finish_jobs_of(…); COMMIT`, whose check
/// passes only when every fence of `jobs` is this transaction's own.
pub async fn close_jobs(
    conn: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, Option<JobDigest>)],
    now: DateTime<Utc>,
) -> Result<(), CloseError> {
    let check = format!(
        "SELECT core.finish_jobs_of({}, {}, {}, {})",
        literal::uuids(jobs.iter().map(|j| j.0.0)),
        literal::text(consumer.as_str()),
        literal::timestamptz(now),
        literal::byteas(jobs.iter().map(|j| j.1.as_ref().map(|d| d.0.as_slice()))),
    );
    check_and_commit(conn, check).await
}

/// Sends `check; COMMIT` as one query. The check's result arrives before `COMMIT`'s: an error
/// of the database before it is the check refusing (`COMMIT` was skipped); any later error, and
/// a failed connection at any point, leaves the commit unknown.
async fn check_and_commit(conn: &mut PgConnection, check: String) -> Result<(), CloseError> {
    use futures_util::TryStreamExt;
    // The lane's session reset rides with the COMMIT (see `harness::lanes`).
    let sql = sqlx::AssertSqlSafe(format!("{check}; COMMIT; {}", crate::db::RESET_SESSION));
    let mut results = sqlx::raw_sql(sql).fetch_many(conn);
    let mut checked = false;
    loop {
        match results.try_next().await {
            Ok(Some(sqlx::Either::Left(_done))) => checked = true,
            Ok(Some(sqlx::Either::Right(_row))) => {}
            Ok(None) if checked => return Ok(()),
            Ok(None) => {
                return Err(CloseError::Commit(sqlx::Error::Protocol(
                    "no reply to the check before COMMIT".into(),
                )));
            }
            Err(e) if checked || e.as_database_error().is_none() => {
                return Err(CloseError::Commit(e));
            }
            Err(e) => {
                return Err(CloseError::Check(match sqlstate(&e).as_deref() {
                    Some(NOT_OWN) => CheckFailed::NotOwn(e),
                    Some(LOCK_NOT_AVAILABLE) => CheckFailed::LetterLocked(e),
                    _ => CheckFailed::Aborted(e),
                }));
            }
        }
    }
}

/// The SQLSTATE of a database error.
fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// The committed fences among `jobs` for `consumer`, each with the digest it keeps (none for a
/// fence an older version wrote): one statement for a whole batch.
pub async fn processed_digests(
    db: impl PgExecutor<'_>,
    consumer: &ConsumerName,
    jobs: &[JobId],
) -> sqlx::Result<std::collections::HashMap<JobId, Option<JobDigest>>> {
    let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.0).collect();
    let found: Vec<(uuid::Uuid, Option<Vec<u8>>)> = sqlx::query_as(
        "SELECT job_id, payload_digest FROM core.processed_jobs
         WHERE consumer = $1 AND job_id = ANY($2)",
    )
    .bind(consumer.as_str())
    .bind(&ids)
    .fetch_all(db)
    .await?;
    Ok(found
        .into_iter()
        .map(|(job, digest)| (JobId(job), digest.as_deref().and_then(digest_of)))
        .collect())
}

/// A stored digest as a [`JobDigest`] (anything but 32 bytes is no digest).
pub(crate) fn digest_of(bytes: &[u8]) -> Option<JobDigest> {
    bytes.try_into().ok().map(JobDigest)
}

/// Whether a committed fence exists for (`job_id`, `consumer`): if so, a replay will be a no-op.
pub async fn fence_exists(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2)",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .fetch_one(db)
    .await
}

/// Whether the committed fence of (`job_id`, `consumer`) stands for the job whose digest is
/// `digest`: the same digest, or one of its family of edits (`core.same_job`). False without
/// a fence.
pub async fn fenced_as_the_same_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
    digest: &JobDigest,
) -> sqlx::Result<bool> {
    let same: Option<bool> = sqlx::query_scalar(
        "SELECT core.same_job($1, $2, $3, payload_digest) FROM core.processed_jobs
         WHERE job_id = $1 AND consumer = $2",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .bind(digest.0.as_slice())
    .fetch_optional(db)
    .await?;
    Ok(same == Some(true))
}

/// A committed fence, as operators see it (the API's `GET /v1/core/processed-jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ProcessedJob {
    /// The job.
    pub job_id: uuid::Uuid,
    /// The consumer whose work committed with it.
    pub consumer: String,
    /// The job's tenant.
    pub tenant_id: uuid::Uuid,
    /// When the work committed.
    pub processed_at: chrono::DateTime<chrono::Utc>,
    /// Until when a copy of the job is skipped as a duplicate (then the sweep removes it).
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// The committed fence of (`job_id`, `consumer`), if any.
pub async fn processed_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Option<ProcessedJob>> {
    sqlx::query_as(
        "SELECT job_id, consumer, tenant_id, processed_at, expires_at
           FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .fetch_optional(db)
    .await
}

/// When the fence of (`job_id`, `consumer`) expires, if it exists.
pub async fn fence_expiry(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar(
        "SELECT expires_at FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .fetch_optional(db)
    .await
}

/// How many fences exist for `job_id` across all consumers.
pub async fn count_fences(db: impl PgExecutor<'_>, job_id: JobId) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM core.processed_jobs WHERE job_id = $1")
        .bind(job_id.0)
        .fetch_one(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_floor_fits_under_the_default_ttl_of_fourteen_days() {
        let floor = ttl_floor(
            Duration::from_secs(4 * 86_400),
            Duration::from_secs(5 * 86_400),
            &RetryPolicy::default(),
            false,
        );
        assert_eq!(floor, Duration::from_secs(11 * 86_400 + 675));
        assert!(floor < Duration::from_secs(14 * 86_400));
    }

    /// Issue 34, item 4: a FIFO queue's DLQ resets the enqueue time on the move, so each stay
    /// counts from it: the queue's retention, the DLQ's, and both again after a redrive back.
    #[test]
    fn a_fifo_floor_counts_each_dlq_stay_from_the_move() {
        let (queue, dlq) = (
            Duration::from_secs(4 * 86_400),
            Duration::from_secs(5 * 86_400),
        );
        let floor = ttl_floor(queue, dlq, &RetryPolicy::default(), true);
        assert_eq!(floor, Duration::from_secs(19 * 86_400 + 675));
        assert!(floor > ttl_floor(queue, dlq, &RetryPolicy::default(), false));
        assert!(
            floor < Duration::from_secs(21 * 86_400),
            "the FIFO default TTL"
        );
    }
}
