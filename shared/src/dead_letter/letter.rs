//! A letter as it is written ([`NewDeadLetter`]) and as it is read back ([`DeadLetter`]), and
//! the reads of whole letters.

use super::{ErrorKind, ReplayOutcome, ReviewStatus};
use crate::ids::{ConsumerName, DeadLetterId, GroupId, JobId, TenantId, bounded_id, storable};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

/// `last_error` is cut to this many bytes (at a character boundary).
pub(crate) const MAX_ERROR_BYTES: usize = 8 * 1024;

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
    /// The message's FIFO group (SQS `MessageGroupId`), which a replay to a FIFO queue carries.
    /// Kept only if SQS could take it back ([`crate::ids::message_group`]).
    pub message_group: Option<&'a str>,
    /// The payload fields the job's digest covers, as its consumer names them (empty: the
    /// whole payload); kept with a letter that has a digest.
    pub digest_fields: &'a [&'a str],
    /// Whether `body` had NULs of the message's replaced already (U+FFFD: a record received into
    /// the letters' intake, whose text keeps no NUL): its JSON is then the body as a JSON string,
    /// as the message's was (a NUL makes any text invalid JSON). Else `body` holds them itself.
    pub nul_replaced: bool,
    /// The trace context its message carried ([`crate::telemetry::otel::MessageTrace::original`]),
    /// which its replay carries on, so the replayed job's span links to the original's trace.
    pub trace: Option<crate::telemetry::otel::TraceParent>,
}

/// What a stored letter and its list item ([`super::LetterSummary`]) both show: the letter
/// without its payload, its body and its replay's send record.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct LetterHead {
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
    /// The attempt on which it was written (executions; 0 for a redriven job that never ran).
    pub attempts: i32,
    /// Why.
    pub error_kind: ErrorKind,
    /// The last error (in a list item, its start).
    pub last_error: String,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// The letter whose replay produced this one.
    pub replay_of: Option<DeadLetterId>,
    /// Where its review stands.
    pub status: ReviewStatus,
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
    pub replay_outcome: Option<ReplayOutcome>,
    /// The failure group it belongs to (none for a letter older than groups).
    pub group_id: Option<GroupId>,
}

/// A stored dead letter, read back as the domain's types: its [`LetterHead`] (its fields read
/// through it, `letter.status`), its payload and body, and its replay's send record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    /// What its list item shows too.
    #[serde(flatten)]
    pub head: LetterHead,
    /// The body as JSON (a JSON string where it is not JSON, or not JSON `jsonb` can hold):
    /// read back from `body` where the row keeps none of its own (the body is kept once).
    pub payload: Value,
    /// The body exactly as received, what a replay sends (none for a letter older than it).
    #[serde(skip)]
    pub body: Option<String>,
    /// The digest of the job it stands for (none where it was not known).
    #[serde(skip)]
    pub job_digest: Option<Vec<u8>>,
    /// The payload fields [`job_digest`](Self::job_digest) covers (none: the whole payload), so
    /// that an edit is digested as the harness digests the body it sends.
    #[serde(skip)]
    pub digest_fields: Option<Vec<String>>,
    /// The message the queue accepted for the replay.
    pub replay_message_id: Option<String>,
    /// When the queue accepted it.
    pub replay_sent_at: Option<DateTime<Utc>>,
    /// Why it was replayed, if the operator said (an edited replay always says).
    pub replay_reason: Option<String>,
    /// The edited envelope an edited replay sent instead of [`body`](Self::body) (shown as JSON;
    /// none for a replay of the body as received). Written with the review, never changed.
    #[serde(serialize_with = "as_json")]
    pub replay_body: Option<String>,
    /// The FIFO group of the message it was written from, which its replay carries (none from
    /// a standard queue).
    pub message_group: Option<String>,
    /// Who withdrew its queued replay (none unless its replay outcome is `withdrawn`).
    pub replay_withdrawn_by: Option<String>,
    /// When.
    pub replay_withdrawn_at: Option<DateTime<Utc>>,
    /// Why.
    pub replay_withdraw_reason: Option<String>,
    /// The bulk operation that reviewed it (its `reviewed_by` asked for it), if one did.
    pub operation_id: Option<Uuid>,
    /// The W3C trace context of the message it was written from (its producer's, or for a
    /// replay the original job's), which its replay sends as the `traceparent` attribute.
    pub trace_parent: Option<String>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for DeadLetter {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row;
        let body: Option<String> = row.try_get("body")?;
        // A letter written since 0032 keeps its body once: its JSON is the body's, by the rule
        // that wrote the column before (a NUL-holding body's is kept apart).
        let payload = match row.try_get::<Option<Value>, _>("payload")? {
            Some(payload) => payload,
            None => crate::envelope::body_as_json(body.as_deref().unwrap_or_default()),
        };
        Ok(DeadLetter {
            head: LetterHead::from_row(row)?,
            payload,
            body,
            job_digest: row.try_get("job_digest")?,
            digest_fields: row.try_get("digest_fields")?,
            replay_message_id: row.try_get("replay_message_id")?,
            replay_sent_at: row.try_get("replay_sent_at")?,
            replay_reason: row.try_get("replay_reason")?,
            replay_body: row.try_get("replay_body")?,
            message_group: row.try_get("message_group")?,
            replay_withdrawn_by: row.try_get("replay_withdrawn_by")?,
            replay_withdrawn_at: row.try_get("replay_withdrawn_at")?,
            replay_withdraw_reason: row.try_get("replay_withdraw_reason")?,
            operation_id: row.try_get("operation_id")?,
            trace_parent: row.try_get("trace_parent")?,
        })
    }
}

/// A stored body, shown as the JSON it is.
fn as_json<S: serde::Serializer>(body: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let json = body
        .as_deref()
        .map(|b| serde_json::from_str::<Value>(b).unwrap_or_else(|_| Value::String(b.to_owned())));
    serde::Serialize::serialize(&json, s)
}

impl std::ops::Deref for DeadLetter {
    type Target = LetterHead;

    fn deref(&self) -> &LetterHead {
        &self.head
    }
}

/// The letters of one job for one consumer, oldest first.
pub async fn letters_for_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Vec<DeadLetter>> {
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
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
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as("SELECT * FROM core.dead_letters WHERE consumer = $1 AND message_id = $2")
        .bind(consumer.as_str())
        .bind(&*bounded_id(message_id, "message"))
        .fetch_optional(db)
        .await
}

/// One letter, whole, if it exists.
pub async fn letter(db: impl PgExecutor<'_>, id: DeadLetterId) -> sqlx::Result<Option<DeadLetter>> {
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as("SELECT * FROM core.dead_letters WHERE id = $1")
        .bind(id.0)
        .fetch_optional(db)
        .await
}

impl DeadLetter {
    /// The digest `body` has as a body of this letter's job: over the payload fields the
    /// letter's digest covers, as the harness takes it (none for a body that is no envelope).
    pub fn digest_of_body(&self, body: &str) -> Option<crate::envelope::JobDigest> {
        let fields: Vec<&str> = self
            .digest_fields
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        crate::envelope::Envelope::<serde::de::IgnoredAny>::parse_job(body, &fields)
            .ok()
            .map(|(_, digest)| digest)
    }
}

/// The letters written when replays of `id` failed again, oldest first.
pub async fn replays_of(db: impl PgExecutor<'_>, id: DeadLetterId) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "SELECT id FROM core.dead_letters WHERE replay_of = $1 ORDER BY created_at, id",
        id.0,
    )
    .fetch_all(db)
    .await
}

/// An error as a letter stores it: cut to [`MAX_ERROR_BYTES`], NUL replaced.
pub(crate) fn storable_error(error: &str) -> std::borrow::Cow<'_, str> {
    storable(error, MAX_ERROR_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_error_stays_within_its_bound_whatever_it_holds() {
        assert!(storable_error(&"\0".repeat(MAX_ERROR_BYTES)).len() <= MAX_ERROR_BYTES);
        assert!(storable_error(&"é".repeat(MAX_ERROR_BYTES)).len() <= MAX_ERROR_BYTES);
    }
}
