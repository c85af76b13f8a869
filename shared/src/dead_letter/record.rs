//! Writing a letter's row: once per message, its values bounded, as parsed or as received.

use super::{NewDeadLetter, storable_error};
use crate::envelope::JobDigest;
use crate::ids::{ConsumerName, DeadLetterId, MAX_ID_BYTES, bounded_id, storable, without_nul};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

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

/// How a letter's body is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Storage {
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

// Long for its one statement: the SQL is most of it, and reads best whole.
pub(super) async fn record_stored(
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
    let queue = bounded_id(letter.queue, "unknown");
    let body = without_nul(letter.body);
    let last_error = storable_error(letter.last_error);
    let correlation_id = letter.correlation_id.map(|c| storable(c, id_bytes));
    let digest_fields =
        (digest.is_some() && !letter.digest_fields.is_empty()).then_some(letter.digest_fields);
    let inserted = sqlx::query_scalar!(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
             job_digest, message_group, digest_fields, trace_parent)
         -- replay_of comes from a message attribute any producer can set: it links only to a
         -- letter of the same job, so a stray id can never make the letter unwritable.
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                 (SELECT id FROM core.dead_letters WHERE id = $12 AND job_id IS NOT DISTINCT FROM $1), $13,
                 $14, $15, $16, $17)
         ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
         RETURNING id",
        letter.job_id.map(|j| j.0),
        letter.tenant_id.map(|t| t.0),
        letter.consumer.as_str(),
        &*queue,
        &*message_id,
        &payload,
        &*body,
        i32::try_from(letter.attempts).unwrap_or(i32::MAX),
        letter.kind.as_str(),
        &*last_error,
        correlation_id.as_deref(),
        letter.replay_of.map(|r| r.0),
        now,
        digest.map(|d| d.0.as_slice()),
        letter.message_group.and_then(crate::ids::message_group),
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
