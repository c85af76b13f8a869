//! Writing a letter's row: once per message, its values bounded, as parsed or as received; and
//! a batch's letters in one call, each settled through its job's fence (`core.record_letters`,
//! migrations 0028 and 0029).

use super::settle::{Settled, conflict_error};
use super::{NewDeadLetter, storable_error};
use crate::envelope::JobDigest;
use crate::fence::{FenceError, claim_error, lock_wait};
use crate::ids::{ConsumerName, DeadLetterId, MAX_ID_BYTES, bounded_id, storable, without_nul};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use std::borrow::Cow;
use std::time::Duration;

/// The result of [`record_dead_letter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A new row.
    New(DeadLetterId),
    /// The message already had its letter (a redelivery after a lost ack).
    AlreadyRecorded(DeadLetterId),
    /// Received into the intake (`core.letter_intake`) while another settler was at work: its
    /// letter is written behind, in bulk (or none, if its job is found committed meanwhile).
    Received(super::IntakeSeq),
}

impl Recorded {
    /// The letter's id, new or not; none yet for one received.
    pub fn id(self) -> Option<DeadLetterId> {
        match self {
            Recorded::New(id) | Recorded::AlreadyRecorded(id) => Some(id),
            Recorded::Received(_) => None,
        }
    }
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recorded::New(id) | Recorded::AlreadyRecorded(id) => write!(f, "{id}"),
            Recorded::Received(seq) => write!(f, "received #{}", seq.0),
        }
    }
}

/// How a letter's body is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Storage {
    /// The body kept once: `payload` is read back from it ([`super::DeadLetter`]), and
    /// written apart only for a body holding a NUL (which the stored body replaces).
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

// Long for its one statement: the SQL is most of it, and reads best whole.
pub(super) async fn record_stored(
    conn: &mut PgConnection,
    letter: &NewDeadLetter<'_>,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    storage: Storage,
) -> sqlx::Result<Recorded> {
    let Bounded {
        payload,
        message_id,
        queue,
        body,
        last_error,
        correlation_id,
        message_group,
    } = Bounded::of(letter, storage);
    let digest_fields =
        (digest.is_some() && !letter.digest_fields.is_empty()).then_some(letter.digest_fields);
    let inserted = sqlx::query_scalar!(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
             job_digest, message_group, digest_fields, trace_parent)
         -- replay_of comes from a message attribute any producer can set: it links only to a
         -- letter of the same job, so a stray id can never make the letter unwritable.
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                 (SELECT id FROM core.dead_letters WHERE id = $12 AND job_id = $1), $13,
                 $14, $15, $16, $17)
         ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
         RETURNING id",
        letter.job_id.map(|j| j.0),
        letter.tenant_id.map(|t| t.0),
        letter.consumer.as_str(),
        &*queue,
        &*message_id,
        payload as _,
        &*body,
        i32::try_from(letter.attempts).unwrap_or(i32::MAX),
        letter.kind.as_str(),
        &*last_error,
        correlation_id.as_deref(),
        letter.replay_of.map(|r| r.0),
        now,
        digest.map(|d| d.0.as_slice()),
        message_group,
        // `&[&str]` for `text[]`, which the macro's check knows only as `&[String]`.
        digest_fields as _,
        letter.trace.map(|t| t.to_w3c()),
    )
    .fetch_optional(&mut *conn)
    .await?;
    match inserted {
        Some(id) => Ok(Recorded::New(DeadLetterId(id))),
        None => existing_letter(conn, letter.consumer, &message_id).await,
    }
}

/// What `core.record_letters` answered for one letter: its verdict, its letter (if it has one)
/// and whether that letter is new.
pub(super) fn settled_of(verdict: &str, letter_id: Option<uuid::Uuid>, fresh: bool) -> Settled {
    let recorded = || {
        let id = DeadLetterId(letter_id.expect("a written letter has its id"));
        if fresh {
            Recorded::New(id)
        } else {
            Recorded::AlreadyRecorded(id)
        }
    };
    match verdict {
        "already_processed" => Settled::AlreadyProcessed,
        "conflict" => Settled::Conflict(recorded()),
        _ => Settled::Recorded(recorded()),
    }
}

/// A letter's values as its row keeps them, each bounded so that nothing a producer sends can
/// make the write fail: what both writers ([`record_stored`], [`write_letters`]) store.
struct Bounded<'a> {
    /// The body as JSON where the row's `body` does not give it back (none: it does, by the
    /// same rule, [`crate::envelope::body_as_json`]: the body is kept once).
    payload: Option<Value>,
    message_id: Cow<'a, str>,
    queue: Cow<'a, str>,
    body: Cow<'a, str>,
    last_error: Cow<'a, str>,
    correlation_id: Option<Cow<'a, str>>,
    message_group: Option<&'a str>,
}

impl<'a> Bounded<'a> {
    fn of(letter: &NewDeadLetter<'a>, storage: Storage) -> Self {
        let (payload, id_bytes) = match storage {
            // The stored body is the message's unless it held a NUL (replaced there, or before
            // the letter's intake), so its JSON is read back from it.
            Storage::Parsed if !letter.body.contains('\0') && !letter.nul_replaced => {
                (None, MAX_ID_BYTES)
            }
            // A NUL makes any text invalid JSON: the body as a JSON string, NUL replaced (as
            // `body_as_json` gives it for the message's body).
            Storage::Parsed => {
                let payload = Value::String(letter.body.replace('\0', "\u{fffd}"));
                (Some(payload), MAX_ID_BYTES)
            }
            Storage::AsReceived => {
                let payload = Value::String(letter.body.replace('\0', "\u{fffd}"));
                (Some(payload), 64)
            }
        };
        let Parts {
            message_id,
            queue,
            body,
            last_error,
            correlation_id,
            message_group,
        } = Parts::of(letter, id_bytes);
        Bounded {
            payload,
            message_id,
            queue,
            body,
            last_error,
            correlation_id,
            message_group,
        }
    }
}

/// A letter's values bounded as parsed, but its payload: what the intake keeps
/// ([`super::intake`]), which a letter then bounds again to the same values.
pub(super) struct Parts<'a> {
    pub(super) message_id: Cow<'a, str>,
    pub(super) queue: Cow<'a, str>,
    pub(super) body: Cow<'a, str>,
    pub(super) last_error: Cow<'a, str>,
    pub(super) correlation_id: Option<Cow<'a, str>>,
    pub(super) message_group: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn of(letter: &NewDeadLetter<'a>, id_bytes: usize) -> Self {
        Parts {
            message_id: bounded_id(letter.message_id, "message"),
            queue: bounded_id(letter.queue, "unknown"),
            body: without_nul(letter.body),
            last_error: storable_error(letter.last_error),
            correlation_id: letter.correlation_id.map(|c| storable(c, id_bytes)),
            message_group: letter.message_group.and_then(crate::ids::message_group),
        }
    }
}

/// [`Parts`] of `letter` as parsed.
pub(super) fn storable_parts<'a>(letter: &NewDeadLetter<'a>) -> Parts<'a> {
    Parts::of(letter, MAX_ID_BYTES)
}

/// The letter already written for the message.
async fn existing_letter(
    conn: &mut PgConnection,
    consumer: &ConsumerName,
    message_id: &str,
) -> sqlx::Result<Recorded> {
    let existing = sqlx::query_scalar!(
        "SELECT id FROM core.dead_letters WHERE consumer = $1 AND message_id = $2",
        consumer.as_str(),
        message_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(Recorded::AlreadyRecorded(DeadLetterId(existing)))
}

/// Writes `letters` (of one consumer) in one statement, as parsed, in job id order: each settled
/// through its job's fence first when `settle` says how long a claim may wait for a copy inside
/// its transaction (the placeholder claim, the letter, the claim's removal; see
/// [`super::record_unless_processed`]), or written as it is for `None`; each of their failure
/// groups joined and counted once. For a batch's letters: a letter alone costs the server less
/// as the statements of [`super::settle`] (pgbench, docs/performance.md). The answers in
/// `letters`' order. Any failure writes none of them: one statement is its own transaction,
/// and letters of several sets of digest fields (one statement a set) share one transaction
/// (a savepoint if `conn` is in one). The call's claims wait within `settle` in all, not each:
/// one that waited past it is [`FenceError::Contended`].
pub(super) async fn write_letters(
    conn: &mut PgConnection,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    settle: Option<Duration>,
) -> Result<Vec<Settled>, FenceError> {
    let first_fields = letters.first().map(|(l, _)| l.digest_fields);
    if letters
        .iter()
        .all(|(l, _)| Some(l.digest_fields) == first_fields)
    {
        return write_letters_by_fields(conn, letters, now, settle).await;
    }
    let mut tx = sqlx::Connection::begin(conn).await?;
    match write_letters_by_fields(&mut tx, letters, now, settle).await {
        Ok(settled) => {
            tx.commit().await?;
            Ok(settled)
        }
        Err(e) => {
            // Answered before this returns: the caller's next attempt meets none of its claims.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// [`write_letters`] a call of `core.record_letters` per run of letters of one set of digest
/// fields.
async fn write_letters_by_fields(
    conn: &mut PgConnection,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    settle: Option<Duration>,
) -> Result<Vec<Settled>, FenceError> {
    // A call digests its letters over one set of fields: letters of other fields (a row
    // received before a consumer's JOB_FIELDS changed) go in a call of their own, in order.
    let mut settled = Vec::with_capacity(letters.len());
    let mut rest = letters;
    while let Some((first, _)) = rest.first() {
        let same = rest
            .iter()
            .take_while(|(l, _)| l.digest_fields == first.digest_fields)
            .count();
        let (these, after) = rest.split_at(same);
        settled.extend(write_letters_of_fields(conn, these, now, settle).await?);
        rest = after;
    }
    Ok(settled)
}

/// [`write_letters`] for letters of one set of digest fields: one call.
async fn write_letters_of_fields(
    conn: &mut PgConnection,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    settle: Option<Duration>,
) -> Result<Vec<Settled>, FenceError> {
    let Some((first, _)) = letters.first() else {
        return Ok(Vec::new());
    };
    let consumer = first.consumer;
    assert!(
        letters.iter().all(|(l, _)| l.consumer == consumer),
        "one consumer writes a call's letters"
    );
    let columns = Columns::of(letters);
    let rows = sqlx::query!(
        r#"SELECT ord AS "ord!", verdict AS "verdict!", letter_id, fresh AS "fresh!"
             FROM core.record_letters($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                                      $15, $16, $17, $18, $19, $20)"#,
        consumer.as_str(),
        now,
        lock_wait(settle.unwrap_or_default()),
        // `&[&str]` for `text[]`, which the macro's check knows only as `&[String]`.
        columns.digest_fields as _,
        settle.is_some(),
        &columns.job_ids as _,
        &columns.tenant_ids as _,
        &columns.queues,
        &columns.message_ids,
        &columns.payloads as _,
        &columns.bodies,
        &columns.attempts,
        &columns.kinds,
        &columns.errors,
        &columns.conflict_errors as _,
        &columns.correlation_ids as _,
        &columns.replay_ofs as _,
        &columns.digests as _,
        &columns.message_groups as _,
        &columns.traces as _,
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(claim_error)?;
    let mut settled = vec![Settled::AlreadyProcessed; letters.len()];
    for row in rows {
        let ord = usize::try_from(row.ord).expect("ordinals count from 1");
        settled[ord - 1] = settled_of(&row.verdict, row.letter_id, row.fresh);
    }
    Ok(settled)
}

/// A call's letters as `core.record_letters` takes them: a column each, every value bounded.
#[derive(Default)]
struct Columns {
    digest_fields: Option<Vec<String>>,
    job_ids: Vec<Option<uuid::Uuid>>,
    tenant_ids: Vec<Option<uuid::Uuid>>,
    queues: Vec<String>,
    message_ids: Vec<String>,
    payloads: Vec<Option<Value>>,
    bodies: Vec<String>,
    attempts: Vec<i32>,
    kinds: Vec<String>,
    errors: Vec<String>,
    conflict_errors: Vec<Option<String>>,
    correlation_ids: Vec<Option<String>>,
    replay_ofs: Vec<Option<uuid::Uuid>>,
    digests: Vec<Option<Vec<u8>>>,
    message_groups: Vec<Option<String>>,
    traces: Vec<Option<String>>,
}

impl Columns {
    /// As parsed: a letter PostgreSQL refuses so is written alone, as received.
    fn of(letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)]) -> Self {
        let fields = letters[0].0.digest_fields;
        let mut columns = Columns {
            digest_fields: (!fields.is_empty())
                .then(|| fields.iter().map(|f| f.to_string()).collect()),
            ..Columns::default()
        };
        for (letter, digest) in letters {
            let bounded = Bounded::of(letter, Storage::Parsed);
            columns.job_ids.push(letter.job_id.map(|j| j.0));
            columns.tenant_ids.push(letter.tenant_id.map(|t| t.0));
            columns.queues.push(bounded.queue.into_owned());
            columns.message_ids.push(bounded.message_id.into_owned());
            columns.payloads.push(bounded.payload);
            columns.bodies.push(bounded.body.into_owned());
            columns
                .attempts
                .push(i32::try_from(letter.attempts).unwrap_or(i32::MAX));
            columns.kinds.push(letter.kind.as_str().to_owned());
            columns.errors.push(bounded.last_error.into_owned());
            // Only a letter with a digest can find another job under its id.
            columns.conflict_errors.push(
                digest.map(|_| storable_error(&conflict_error(letter.last_error)).into_owned()),
            );
            columns
                .correlation_ids
                .push(bounded.correlation_id.map(Cow::into_owned));
            columns.replay_ofs.push(letter.replay_of.map(|r| r.0));
            columns.digests.push(digest.map(|d| d.0.to_vec()));
            columns
                .message_groups
                .push(bounded.message_group.map(str::to_owned));
            columns.traces.push(letter.trace.map(|t| t.to_w3c()));
        }
        columns
    }
}
