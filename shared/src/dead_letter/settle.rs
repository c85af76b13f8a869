//! A letter settled through the fence in its own transaction: none for a job that committed, a
//! conflict for another job under its id, and as received where PostgreSQL refuses it as parsed.

use super::record::{Recorded, Storage, record_stored, write_letters};
use super::{ErrorKind, MAX_ERROR_BYTES, NewDeadLetter};
use crate::envelope::JobDigest;
use crate::fence::{FenceClaim, FenceError, claim_job_fence};
use crate::ids::{ConsumerName, JobId, TenantId, truncate};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Whether PostgreSQL refused a letter for what it holds rather than for its own state: a data
/// exception (class 22: a value out of range, text it cannot store), a program limit (class
/// 54: an index row or a value too large, nesting too deep) or a check (23514).
pub(super) fn refused_for_its_content(e: &FenceError) -> bool {
    let FenceError::Database(e) = e else {
        return false;
    };
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code.starts_with("22") || code.starts_with("54") || code == "23514")
}

/// What [`record_unless_processed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The job's effect had not committed: the letter is written (or already was).
    Recorded(Recorded),
    /// Another job committed under this job id (its fence keeps another digest): this one never
    /// ran, and its letter is written as a `conflict` (or already was).
    Conflict(Recorded),
    /// The job's effect committed (through this message or another copy): no letter.
    AlreadyProcessed,
}

/// Writes `letter` only if its job's effect did not commit, as one transaction: it claims the
/// job's fence first (waiting at most `wait` for a copy still inside its transaction), writes
/// the letter while holding it, then removes the claim, and the job's execution ledger with it.
/// A letter without a job id (unreadable poison) is written as it is. A wait that runs out is
/// [`FenceError::Contended`]: nothing is written, try again later. With the job's `digest`
/// (kept with the letter), a fence of another job under the same id is no commit of this one:
/// the letter is written as a [`ErrorKind::Conflict`].
///
/// A letter PostgreSQL refuses for what it holds (see [`Storage::AsReceived`]) is written again
/// as received, its body a JSON string and its error saying why: a message is never handed
/// back forever for its content. Any other failure is returned, for the caller to retry.
pub async fn record_unless_processed(
    pool: &sqlx::PgPool,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    wait: std::time::Duration,
) -> Result<Settled, FenceError> {
    record_with_fallback(pool, letter, digest, now, Some(wait)).await
}

/// [`record_unless_processed`] for several letters in one statement (a batch's poison, written
/// together): each settled through its job's fence as it would be alone, in job id order (so
/// two batches claim shared ids in one order); the answers in `letters`' order. Any failure
/// writes none of them and is returned: the caller then writes each alone, with the
/// as-received fallback.
pub async fn record_all_unless_processed(
    pool: &sqlx::PgPool,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    wait: std::time::Duration,
) -> Result<Vec<Settled>, FenceError> {
    let mut conn = crate::db::acquire(pool).await?;
    let written = write_letters(&mut conn, letters, now, Some(wait)).await;
    conn.give_back();
    written
}

/// Writes `letter` without settling through the fence, with [`record_unless_processed`]'s
/// fallback: for a letter whose fence cannot say anything (an `unsettled` copy) or says the
/// wrong thing (a `conflict`, another job under a processed job's id).
pub(crate) async fn record_without_settling(
    pool: &sqlx::PgPool,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
) -> Result<Recorded, FenceError> {
    match record_with_fallback(pool, letter, digest, now, None).await? {
        Settled::Recorded(recorded) | Settled::Conflict(recorded) => Ok(recorded),
        Settled::AlreadyProcessed => unreachable!("nothing was settled"),
    }
}

/// Settles through the fence waiting at most `settle` (or not at all, for `None`), then writes
/// the letter; as received if PostgreSQL refuses it as parsed.
pub(super) async fn record_with_fallback(
    pool: &sqlx::PgPool,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
) -> Result<Settled, FenceError> {
    let mut conn = crate::db::acquire(pool).await?;
    let settled = record_with_fallback_on(&mut conn, letter, digest, now, settle).await;
    conn.give_back();
    settled
}

/// [`record_with_fallback`] on `conn`: each attempt a transaction of its own, or a savepoint
/// where `conn` is in a transaction already (a settler's fallback, which holds the settle lock
/// in it: on one connection, so that a pool of one serves it).
pub(super) async fn record_with_fallback_on(
    conn: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
) -> Result<Settled, FenceError> {
    match settle_and_record(conn, letter, digest, now, settle, Storage::Parsed).await {
        Err(refused) if refused_for_its_content(&refused) => {
            tracing::warn!(message_id = letter.message_id, error = %refused,
                "the letter was refused as parsed; writing it as received");
            let error = format!(
                "{} [stored as received: PostgreSQL refused the parsed letter: {refused}]",
                truncate(letter.last_error, MAX_ERROR_BYTES / 2)
            );
            let as_received = NewDeadLetter {
                last_error: &error,
                ..letter.clone()
            };
            settle_and_record(conn, &as_received, digest, now, settle, Storage::AsReceived).await
        }
        settled => settled,
    }
}

/// One transaction (or savepoint): the settle, then the letter. Whatever fails, its `ROLLBACK`
/// has been answered before this returns, so a caller that tries again (the as-received
/// fallback, the next delivery) never meets this attempt's placeholder fence.
async fn settle_and_record(
    conn: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
    storage: Storage,
) -> Result<Settled, FenceError> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    match settle_in(&mut tx, letter, digest, now, settle, storage).await {
        Ok(Settled::AlreadyProcessed) => {
            tx.rollback().await?;
            Ok(Settled::AlreadyProcessed)
        }
        Ok(settled) => {
            tx.commit().await?;
            Ok(settled)
        }
        Err(e) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(error = %rollback, "a letter's ROLLBACK failed");
            }
            Err(e)
        }
    }
}

async fn settle_in(
    tx: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
    storage: Storage,
) -> Result<Settled, FenceError> {
    let (Some(job_id), Some(wait)) = (letter.job_id, settle) else {
        return Ok(Settled::Recorded(
            record_stored(tx, letter, digest, now, storage).await?,
        ));
    };
    // The claim is a placeholder: it exists only inside this transaction, so any copy of the
    // job that tries to claim meanwhile waits and then finds no fence.
    let tenant = letter.tenant_id.unwrap_or(TenantId(uuid::Uuid::nil()));
    let ttl = std::time::Duration::from_secs(60);
    let claim = claim_job_fence(tx, job_id, letter.consumer, tenant, digest, now, ttl, wait);
    match claim.await? {
        FenceClaim::Duplicate => Ok(Settled::AlreadyProcessed),
        FenceClaim::Conflict => {
            let error = conflict_error(letter.last_error);
            let conflict = NewDeadLetter {
                kind: ErrorKind::Conflict,
                last_error: &error,
                ..letter.clone()
            };
            let recorded = record_stored(tx, &conflict, digest, now, storage).await?;
            Ok(Settled::Conflict(recorded))
        }
        FenceClaim::Claimed => {
            let recorded = record_stored(tx, letter, digest, now, storage).await?;
            // The claim goes; the job's execution ledger goes with it only when this letter
            // ends the job's budget: a new letter of a body that ran (a replay then starts
            // afresh). A poison copy never ran, and a redelivery acked by the letter it has
            // changes nothing: either would wipe the count of a copy still between its attempts.
            let ends_the_budget =
                matches!(recorded, Recorded::New(_)) && letter.kind != ErrorKind::Poison;
            drop_placeholder(tx, job_id, letter.consumer, ends_the_budget).await?;
            Ok(Settled::Recorded(recorded))
        }
    }
}

/// Deletes the placeholder claim, and the job's execution ledger with it when `ledger_too`.
async fn drop_placeholder(
    tx: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    ledger_too: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "WITH claim AS (DELETE FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2)
         DELETE FROM core.job_executions WHERE $3 AND job_id = $1 AND consumer = $2",
        job_id.0,
        consumer.as_str(),
        ledger_too,
    )
    .execute(tx)
    .await
    .map(drop)
}

/// A conflict letter's error: [`CONFLICT_ERROR`], and the job's own failure.
pub(crate) fn conflict_error(own: &str) -> String {
    let own = truncate(own, MAX_ERROR_BYTES / 2);
    format!("{CONFLICT_ERROR}; this job's own failure: {own}")
}

/// What a `conflict` letter says.
pub(crate) const CONFLICT_ERROR: &str = "this job id was already processed with another payload (its \
     fence keeps the digest of what made up the job): a producer reused the id for another job, \
     which did not run; send it under a new job id, then discard this letter";
