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

/// A successful answer: its status (200, or 202 for a replay left queued) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
}
