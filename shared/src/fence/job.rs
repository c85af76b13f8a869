//! A job's transaction opened by its fence's claim and closed by its commit, in one round trip
//! each (`core.open_job(s)`, `core.close_job(s)`).

use super::{FenceClaim, FenceError, LOCK_NOT_AVAILABLE, claim_error, expiry, lock_wait};
use crate::envelope::JobDigest;
use crate::ids::{ConsumerName, JobId, TenantId, bounded_id};
use crate::literal;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::time::Duration;

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
    check_and_commit(conn, &[&check]).await.map(drop)
}

/// [`close_job`] for a commit group: `SELECT core.finish_jobs_of(…); COMMIT`, whose check
/// passes only when every fence of `jobs` is this transaction's own.
pub async fn close_jobs(
    conn: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, Option<JobDigest>)],
    now: DateTime<Utc>,
) -> Result<(), CloseError> {
    close_jobs_after(conn, consumer, jobs, now, None)
        .await
        .map(drop)
}

/// [`close_jobs`] with one more statement of the transaction's, `also` (whose values are
/// literals), sent before the check in the same round trip: it commits with the jobs or not at
/// all, and a refusal of it is the check's (the transaction is rolled back, nothing of it
/// committed). Returns the rows `also` answers (none without it).
pub async fn close_jobs_after(
    conn: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, Option<JobDigest>)],
    now: DateTime<Utc>,
    also: Option<&str>,
) -> Result<Vec<sqlx::postgres::PgRow>, CloseError> {
    let check = format!(
        "SELECT core.finish_jobs_of({}, {}, {}, {})",
        literal::uuids(jobs.iter().map(|j| j.0.0)),
        literal::text(consumer.as_str()),
        literal::timestamptz(now),
        literal::byteas(jobs.iter().map(|j| j.1.as_ref().map(|d| d.0.as_slice()))),
    );
    match also {
        Some(also) => check_and_commit(conn, &[also, &check]).await,
        None => check_and_commit(conn, &[&check]).await,
    }
}

/// Sends `checks; COMMIT` as one query. The checks' results arrive before `COMMIT`'s: an error
/// of the database before the last of them is a check refusing (`COMMIT` was skipped, and so was
/// the rest); any later error, and a failed connection at any point, leaves the commit unknown.
/// Returns the first check's rows when there is more than one check (the first is then a
/// statement whose answers the caller wants).
async fn check_and_commit(
    conn: &mut PgConnection,
    checks: &[&str],
) -> Result<Vec<sqlx::postgres::PgRow>, CloseError> {
    use futures_util::TryStreamExt;
    // The lane's session reset rides with the COMMIT (see `harness::lanes`).
    let sql = format!(
        "{}; COMMIT; {}",
        checks.join("; "),
        crate::db::RESET_SESSION
    );
    let mut results = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_many(conn);
    let (mut done, mut answers) = (0, Vec::new());
    loop {
        let checked = done >= checks.len();
        match results.try_next().await {
            Ok(Some(sqlx::Either::Left(_done))) => done += 1,
            Ok(Some(sqlx::Either::Right(row))) if done == 0 && checks.len() > 1 => {
                answers.push(row)
            }
            Ok(Some(sqlx::Either::Right(_row))) => {}
            Ok(None) if checked => return Ok(answers),
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
