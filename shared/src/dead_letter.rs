//! The dead-letter store, `core.dead_letters`: every failure, with its payload.
//!
//! Invariants: a letter is a true record. [`record_unless_processed`] settles through the fence,
//! in the letter's own transaction, that the job's effect did not commit (a copy still inside
//! its transaction is waited for, not missed), so a committed job gets no letter. One letter per
//! (consumer, SQS message id): a redelivery of a message whose letter is already written (the
//! ack was lost) finds it instead of writing a second one. The table is append-only; the
//! database rejects anything but the review transition.

use crate::envelope::JobDigest;
use crate::fence::{FenceClaim, FenceError, claim_job_fence};
use crate::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};
use std::fmt;

/// `last_error` is cut to this many bytes (at a character boundary).
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Why a job ended up as a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The message can never be parsed or is meaningless; no retry was made.
    Poison,
    /// The handler reported a failure that can never succeed.
    Permanent,
    /// Every attempt failed transiently.
    Exhausted,
    /// Attempts ended without an outcome (timeout, crash, out of memory).
    Crashed,
    /// A copy arrived too late to settle through the fence (older than the fence's TTL less
    /// its margin, by its own send time): whether the job committed cannot be known, so the
    /// letter is not replayable. Check the effect by hand, then discard it with a reason.
    Unsettled,
    /// A copy of a processed job whose payload differs from the committed one's (by the
    /// digest its fence keeps): another job under a reused id, a producer's bug. It never ran;
    /// the letter keeps it whole. No retry.
    Conflict,
}

impl ErrorKind {
    /// Every kind, in a stable order.
    pub const ALL: [ErrorKind; 6] = [
        Self::Poison,
        Self::Permanent,
        Self::Exhausted,
        Self::Crashed,
        Self::Unsettled,
        Self::Conflict,
    ];

    /// The value stored in `core.dead_letters.error_kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poison => "poison",
            Self::Permanent => "permanent",
            Self::Exhausted => "exhausted",
            Self::Crashed => "crashed",
            Self::Unsettled => "unsettled",
            Self::Conflict => "conflict",
        }
    }

    /// The kind stored as `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

crate::ids::text_column!(
    ErrorKind,
    |s: &str| ErrorKind::parse(s).ok_or_else(|| format!("unknown error kind {s:?}")),
    |k: &ErrorKind| k.as_str()
);

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dead letter about to be written.
#[derive(Debug, Clone)]
pub struct NewDeadLetter<'a> {
    /// The job, unless the message was too broken to carry one.
    pub job_id: Option<JobId>,
    /// The tenant, if readable.
    pub tenant_id: Option<TenantId>,
    /// The consumer that gave up.
    pub consumer: &'a ConsumerName,
    /// The queue the message came from (and where a replay sends it).
    pub queue: &'a str,
    /// The SQS message id.
    pub message_id: &'a str,
    /// The body as received: kept exactly (what a replay sends), and as JSON in `payload`
    /// where `jsonb` can hold it (see [`crate::envelope::body_as_json`]).
    pub body: &'a str,
    /// The attempt on which the letter was written.
    pub attempts: u32,
    /// Why.
    pub kind: ErrorKind,
    /// The last error, as a sentence; cut to [`MAX_ERROR_BYTES`].
    pub last_error: &'a str,
    /// The correlation id, if readable.
    pub correlation_id: Option<&'a str>,
    /// The letter whose replay produced this message, if any.
    pub replay_of: Option<DeadLetterId>,
}

/// The result of [`record_dead_letter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A new row.
    New(DeadLetterId),
    /// The message already had its letter (a redelivery after a lost ack).
    AlreadyRecorded(DeadLetterId),
}

impl Recorded {
    /// The letter's id, new or not.
    pub fn id(self) -> DeadLetterId {
        match self {
            Recorded::New(id) | Recorded::AlreadyRecorded(id) => id,
        }
    }
}

/// The most bytes a producer-controlled identifier (`correlation_id`, the message id, the
/// queue) keeps in a letter's indexed columns; the body keeps every value whole. A btree index
/// row holds at most 2,704 bytes, so an identifier as it came could make a letter unwritable.
pub const MAX_ID_BYTES: usize = 256;

/// How a letter's body is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Storage {
    /// `payload` is the body's JSON where `jsonb` can hold it.
    Parsed,
    /// PostgreSQL refused the letter as parsed: `payload` is the body as a JSON string, and
    /// the identifiers are cut shorter. Written only after a refusal.
    AsReceived,
}

/// Writes `letter` as `pending_review`, created at `now`, unless its message already has one.
/// Every value the message carried is bounded first (see [`MAX_ID_BYTES`]), so nothing a
/// producer sends can make the write fail.
pub async fn record_dead_letter(
    conn: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<Recorded> {
    record_stored(conn, letter, None, now, Storage::Parsed).await
}

async fn record_stored(
    conn: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    storage: Storage,
) -> sqlx::Result<Recorded> {
    let (payload, id_bytes) = match storage {
        Storage::Parsed => (crate::envelope::body_as_json(letter.body), MAX_ID_BYTES),
        Storage::AsReceived => (Value::String(letter.body.replace('\0', "\u{fffd}")), 64),
    };
    let message_id = bounded_id(letter.message_id, "message");
    let inserted: Option<uuid::Uuid> = sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
             job_digest)
         -- replay_of comes from a message attribute any producer can set: it links only to a
         -- letter of the same job, so a stray id can never make the letter unwritable.
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                 (SELECT id FROM core.dead_letters WHERE id = $12 AND job_id IS NOT DISTINCT FROM $1), $13,
                 $14)
         ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
         RETURNING id",
    )
    .bind(letter.job_id.map(|j| j.0))
    .bind(letter.tenant_id.map(|t| t.0))
    .bind(letter.consumer.as_str())
    .bind(bounded_id(letter.queue, "unknown"))
    .bind(&*message_id)
    .bind(&payload)
    .bind(without_nul(letter.body))
    .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
    .bind(letter.kind)
    .bind(storable_error(letter.last_error))
    .bind(letter.correlation_id.map(|c| storable(c, id_bytes)))
    .bind(letter.replay_of.map(|r| r.0))
    .bind(now)
    .bind(digest.map(|d| d.0.as_slice()))
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(id) = inserted {
        return Ok(Recorded::New(DeadLetterId(id)));
    }
    let existing: uuid::Uuid = sqlx::query_scalar(
        "SELECT id FROM core.dead_letters WHERE consumer = $1 AND message_id = $2",
    )
    .bind(letter.consumer.as_str())
    .bind(&*message_id)
    .fetch_one(conn)
    .await?;
    Ok(Recorded::AlreadyRecorded(DeadLetterId(existing)))
}

/// An identifier as a letter's indexed column keeps it: at most [`MAX_ID_BYTES`], never blank,
/// no NUL. A longer one keeps its start and a digest of the whole, so two long ids that share
/// their start stay two ids (one letter per message).
pub fn bounded_id<'s>(id: &'s str, if_blank: &'static str) -> std::borrow::Cow<'s, str> {
    if id.trim().is_empty() {
        return if_blank.into();
    }
    if id.len() <= MAX_ID_BYTES && !id.contains('\0') {
        return id.into();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~sha256:{hex}", storable(id, MAX_ID_BYTES - 48)).into()
}

/// A correlation id as a letter (and every log line of its job) keeps it: its first
/// [`MAX_ID_BYTES`] at a character boundary, NUL replaced. The body keeps it whole.
pub fn bounded_correlation_id(id: &str) -> std::borrow::Cow<'_, str> {
    storable(id, MAX_ID_BYTES)
}

/// Whether PostgreSQL refused a letter for what it holds rather than for its own state: a data
/// exception (class 22: a value out of range, text it cannot store), a program limit (class
/// 54: an index row or a value too large, nesting too deep) or a check (23514).
fn refused_for_its_content(e: &FenceError) -> bool {
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

/// Writes `letter` without settling through the fence, with [`record_unless_processed`]'s
/// fallback: for a letter whose fence cannot say anything (an `unsettled` copy) or says the
/// wrong thing (a `conflict`, another job under a processed job's id).
pub async fn record_without_settling(
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
async fn record_with_fallback(
    pool: &sqlx::PgPool,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
) -> Result<Settled, FenceError> {
    match settle_and_record(pool, letter, digest, now, settle, Storage::Parsed).await {
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
            settle_and_record(pool, &as_received, digest, now, settle, Storage::AsReceived).await
        }
        settled => settled,
    }
}

/// One transaction: the settle, then the letter. Whatever fails, its `ROLLBACK` has been
/// answered before this returns, so a caller that tries again (the as-received fallback, the
/// next delivery) never meets this attempt's placeholder fence.
async fn settle_and_record(
    pool: &sqlx::PgPool,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    settle: Option<std::time::Duration>,
    storage: Storage,
) -> Result<Settled, FenceError> {
    let mut tx = pool.begin().await?;
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
            let error = format!(
                "{CONFLICT_ERROR}; this job's own failure: {}",
                truncate(letter.last_error, MAX_ERROR_BYTES / 2)
            );
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
            sqlx::query(
                "WITH claim AS (DELETE FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2)
                 DELETE FROM core.job_executions WHERE job_id = $1 AND consumer = $2",
            )
            .bind(job_id.0)
            .bind(letter.consumer.as_str())
            .execute(&mut *tx)
            .await?;
            Ok(Settled::Recorded(recorded))
        }
    }
}

/// What a `conflict` letter says.
pub const CONFLICT_ERROR: &str = "this job id was already processed with another payload (its \
     fence keeps the digest of what made up the job): a producer reused the id for another job, \
     which did not run; send it under a new job id, then discard this letter";

/// A stored dead letter, read back as the domain's types.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    /// Primary key.
    pub id: DeadLetterId,
    /// The job, if the message carried one.
    pub job_id: Option<JobId>,
    /// The tenant, if readable.
    pub tenant_id: Option<TenantId>,
    /// The consumer.
    pub consumer: ConsumerName,
    /// The source queue.
    pub queue: String,
    /// The SQS message id.
    pub message_id: String,
    /// The body as JSON (a JSON string where it is not JSON, or not JSON `jsonb` can hold).
    pub payload: Value,
    /// The body exactly as received, what a replay sends (none for a letter older than it).
    #[serde(skip)]
    pub body: Option<String>,
    /// The digest of the job it stands for (none where it was not known).
    #[serde(skip)]
    pub job_digest: Option<Vec<u8>>,
    /// The attempt on which it was written (executions; 0 for a redriven job that never ran).
    pub attempts: i32,
    /// Why.
    pub error_kind: ErrorKind,
    /// The last error.
    pub last_error: String,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// The letter whose replay produced this one.
    pub replay_of: Option<DeadLetterId>,
    /// Where its review stands.
    pub status: crate::review::ReviewStatus,
    /// Why it was discarded.
    pub discard_reason: Option<String>,
    /// Who reviewed it.
    pub reviewed_by: Option<String>,
    /// When it was reviewed.
    pub reviewed_at: Option<DateTime<Utc>>,
    /// When it was written.
    pub created_at: DateTime<Utc>,
    /// For a replayed letter: queued (recorded, not yet accepted by the queue), sent, or
    /// already processed (the job's fence existed, so nothing was sent).
    pub replay_outcome: Option<crate::review::ReplayOutcome>,
    /// The message the queue accepted for the replay.
    pub replay_message_id: Option<String>,
    /// When the queue accepted it.
    pub replay_sent_at: Option<DateTime<Utc>>,
    /// Why it was replayed, if the operator said.
    pub replay_reason: Option<String>,
    /// The failure group it belongs to (none for a letter older than groups).
    pub group_id: Option<crate::ids::GroupId>,
}

/// The letters of one job for one consumer, oldest first.
pub async fn letters_for_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Vec<DeadLetter>> {
    sqlx::query_as(
        "SELECT * FROM core.dead_letters WHERE job_id = $1 AND consumer = $2
         ORDER BY created_at, id",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .fetch_all(db)
    .await
}

/// The letter written for one SQS message, if any.
pub async fn letter_for_message(
    db: impl PgExecutor<'_>,
    consumer: &ConsumerName,
    message_id: &str,
) -> sqlx::Result<Option<DeadLetter>> {
    sqlx::query_as("SELECT * FROM core.dead_letters WHERE consumer = $1 AND message_id = $2")
        .bind(consumer.as_str())
        .bind(&*bounded_id(message_id, "message"))
        .fetch_optional(db)
        .await
}

/// An error as a letter stores it: cut to [`MAX_ERROR_BYTES`], NUL replaced.
pub fn storable_error(error: &str) -> std::borrow::Cow<'_, str> {
    storable(error, MAX_ERROR_BYTES)
}

/// `s` with NUL replaced by U+FFFD: PostgreSQL text cannot store NUL, and a letter must be
/// writable whatever the error or the message said.
/// `s` with NUL replaced, then cut to `max` bytes at a character boundary (in that order: a
/// replaced NUL takes three bytes).
fn storable(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match without_nul(s) {
        std::borrow::Cow::Borrowed(clean) => truncate(clean, max).into(),
        std::borrow::Cow::Owned(clean) => truncate(&clean, max).to_owned().into(),
    }
}

fn without_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}").into()
    } else {
        s.into()
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_value_stays_within_its_bound_whatever_it_holds() {
        let nuls = "\0".repeat(300);
        assert_eq!(
            bounded_correlation_id(&nuls).len(),
            MAX_ID_BYTES - MAX_ID_BYTES % 3
        );
        assert!(bounded_id(&nuls, "m").len() <= MAX_ID_BYTES);
        assert!(storable_error(&"\0".repeat(MAX_ERROR_BYTES)).len() <= MAX_ERROR_BYTES);
        assert_eq!(bounded_id("   ", "blank"), "blank");
        let long = "é".repeat(1_000);
        let longer = format!("{long}x");
        let (a, b) = (bounded_id(&long, "m"), bounded_id(&longer, "m"));
        assert!(
            a.len() <= MAX_ID_BYTES && a != b,
            "two long ids stay two ids"
        );
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("short", 100), "short");
    }

    #[test]
    fn kinds_match_the_schema_check() {
        let names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "poison",
                "permanent",
                "exhausted",
                "crashed",
                "unsettled",
                "conflict"
            ]
        );
    }
}
