//! What the API answers with, as the tool reads it.

use serde::Deserialize;
use serde_json::Value;

/// A letter as the list endpoint returns it (what the tool needs of it).
#[derive(Debug, Clone, Deserialize)]
pub struct Letter {
    /// Its id.
    pub id: uuid::Uuid,
    /// Its job.
    pub job_id: Option<uuid::Uuid>,
    /// The consumer.
    pub consumer: String,
    /// The queue.
    pub queue: String,
    /// Its kind.
    pub error_kind: String,
    /// Executions.
    pub attempts: i64,
    /// Its review status.
    pub status: String,
    /// The start of its last error.
    pub last_error: String,
    /// Its group.
    pub group_id: Option<i64>,
    /// Whether its job's fence exists (a replay would send nothing).
    pub fence_exists: Option<bool>,
    /// When it was written.
    pub created_at: String,
    /// Its correlation id.
    pub correlation_id: Option<String>,
}

/// A failure group as the API returns it.
#[derive(Debug, Clone, Deserialize)]
pub struct Group {
    /// Its id.
    pub id: i64,
    /// open or resolved.
    pub status: String,
    /// The consumer.
    pub consumer: String,
    /// The queue.
    pub queue: String,
    /// The kind.
    pub error_kind: String,
    /// The masked error.
    pub pattern: String,
    /// Letters.
    pub letter_count: i64,
    /// Letters pending review.
    pub pending_count: i64,
    /// First letter.
    pub first_letter_at: String,
    /// Latest letter.
    pub last_letter_at: String,
    /// Its incident.
    pub incident: Option<Value>,
    /// The first letter's error.
    pub sample_error: String,
    /// The other groups its failed replays went to, with how many letters (`dlq group` only).
    #[serde(default)]
    pub failed_replays: Vec<FailedReplays>,
}

/// Letters written when replays of a group's letters failed again, in another group.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FailedReplays {
    /// The group they are in.
    pub group_id: i64,
    /// How many.
    pub letters: i64,
}

/// One page of a list.
#[derive(Debug, Clone, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The next page's cursor.
    pub next_cursor: Option<String>,
}

/// A bulk operation as the API returns it: a replay or a discard of the pending letters a
/// filter selects, worked server-side by the scheduled function.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Operation {
    /// Its id.
    pub id: uuid::Uuid,
    /// replay or discard.
    pub action: String,
    /// The filter it works on, as the API took it (`group_id`, `queue`, …).
    pub selection: serde_json::Map<String, Value>,
    /// Why, as the operator said.
    pub reason: String,
    /// Who asked.
    pub requested_by: String,
    /// When.
    pub created_at: String,
    /// Letters written before this are in it.
    pub through: String,
    /// Letters pending review it selected when asked.
    pub planned: i64,
    /// running, done or cancelled.
    pub status: String,
    /// What it did so far.
    pub progress: OperationProgress,
    /// Who cancelled it.
    pub cancelled_by: Option<String>,
    /// Why.
    pub cancel_reason: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// When it last moved.
    pub updated_at: String,
    /// Rounds that failed in a row (each retried after a backoff).
    pub failures: i64,
    /// The last failure, until a round succeeds.
    pub last_error: Option<String>,
}

impl Operation {
    /// Still being worked (or waiting for the worker).
    pub fn running(&self) -> bool {
        self.status == "running"
    }
}

/// What an operation did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct OperationProgress {
    /// Replayed (queued for sending, or sent).
    pub replayed: i64,
    /// Of those, sent by the operation (the rest by the scheduled run).
    pub sent: i64,
    /// Replayed without sending: the job had committed.
    pub already_processed: i64,
    /// Discarded.
    pub discarded: i64,
    /// Left pending: not replayable.
    pub skipped_not_replayable: i64,
    /// Left pending: SQS would refuse the body.
    pub skipped_not_sendable: i64,
}

impl OperationProgress {
    /// Letters worked: reviewed or left pending as skipped.
    pub fn worked(&self) -> i64 {
        self.replayed
            + self.already_processed
            + self.discarded
            + self.skipped_not_replayable
            + self.skipped_not_sendable
    }

    /// Letters it left pending review.
    pub fn skipped(&self) -> i64 {
        self.skipped_not_replayable + self.skipped_not_sendable
    }
}

/// What a dry run of an operation answers: what the filter selects now.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct Plan {
    /// Letters pending review selected.
    pub letters: i64,
    /// Of those, by error kind.
    pub by_kind: std::collections::BTreeMap<String, i64>,
    /// Of those, never replayable (unsettled, a poison without a job id).
    pub not_replayable: i64,
}

/// A successful answer: its status (200, or 202 for a replay left queued) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
}
