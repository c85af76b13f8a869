//! Alert groups in `core.dead_letter_alerts`: the database side of alerting.
//!
//! Invariant: a trigger counts every dead letter into one group in the letter's own
//! transaction, so no letter is ever without an alert. A group is claimed by one sender at a
//! time (a lease, `FOR UPDATE SKIP LOCKED`), so a burst that many consumers dead-letter at once
//! pages once; an unsent group is retried after a backoff until it is sent.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use std::time::Duration;

/// One group of dead letters: same queue, error kind and error fingerprint, within an hour.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AlertGroup {
    /// Primary key.
    pub id: i64,
    /// The queue.
    pub queue: String,
    /// The error kind.
    pub error_kind: String,
    /// The masked-error fingerprint.
    pub fingerprint: String,
    /// Letters in the group so far.
    pub letter_count: i64,
    /// The first error seen.
    pub first_error: String,
    /// The latest error seen.
    pub last_error: String,
    /// A job of the group, for the incident.
    pub sample_job_id: Option<uuid::Uuid>,
    /// That job's correlation id.
    pub sample_correlation_id: Option<String>,
    /// When the first letter was written.
    pub first_letter_at: DateTime<Utc>,
    /// When the latest letter was written.
    pub last_letter_at: DateTime<Utc>,
    /// The BetterStack incident, once sent.
    pub incident_id: Option<String>,
    /// How many letters the group had when it paged.
    pub notified_count: Option<i64>,
    /// Failed sends so far.
    pub send_attempts: i32,
}

const COLUMNS: &str = "id, queue, error_kind, fingerprint, letter_count, first_error, last_error, sample_job_id, \
     sample_correlation_id, first_letter_at, last_letter_at, incident_id, notified_count, send_attempts";

/// Claims up to `limit` unsent groups due at `now` for `lease`; another sender skips them.
pub async fn claim_unsent(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    lease: Duration,
    limit: i64,
) -> sqlx::Result<Vec<AlertGroup>> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE core.dead_letter_alerts SET claimed_until = $2
         WHERE id IN (SELECT id FROM core.dead_letter_alerts
                      WHERE notified_at IS NULL AND next_attempt_at <= $1
                        AND (claimed_until IS NULL OR claimed_until < $1)
                      ORDER BY next_attempt_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
         RETURNING {COLUMNS}"
    )))
    .bind(now)
    .bind(until)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Records that `group` paged as `incident_id`, with the count it had then.
pub async fn mark_sent(
    db: impl PgExecutor<'_>,
    group: &AlertGroup,
    incident_id: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE core.dead_letter_alerts
         SET incident_id = $2, notified_at = $3, notified_count = $4, claimed_until = NULL
         WHERE id = $1",
    )
    .bind(group.id)
    .bind(incident_id)
    .bind(now)
    .bind(group.letter_count)
    .execute(db)
    .await
    .map(drop)
}

/// Records a failed send and when to try again.
pub async fn mark_send_failed(
    db: impl PgExecutor<'_>,
    group_id: i64,
    error: &str,
    retry_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE core.dead_letter_alerts
         SET claimed_until = NULL, next_attempt_at = $3, send_attempts = send_attempts + 1, last_send_error = $2
         WHERE id = $1",
    )
    .bind(group_id)
    .bind(error)
    .bind(retry_at)
    .execute(db)
    .await
    .map(drop)
}

/// Every group, oldest first (for operators and tests).
pub async fn all_groups(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<AlertGroup>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM core.dead_letter_alerts ORDER BY id"
    )))
    .fetch_all(db)
    .await
}

/// How many letters are in groups that have not paged yet.
pub async fn unsent_letters(db: impl PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT coalesce(sum(letter_count), 0)::bigint FROM core.dead_letter_alerts WHERE notified_at IS NULL")
        .fetch_one(db)
        .await
}
