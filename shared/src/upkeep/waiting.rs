//! What the scheduled run measures as waiting: letters pending review, and incidents not yet
//! delivered.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use std::time::Duration;

/// How far behind paging is at `now`: the groups whose incident is still to be opened or
/// resolved, and how long the oldest of them has waited (since its first letter, or since it
/// resolved). Updates are left out: they wait on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryBacklog {
    /// Groups waiting to be paged or resolved.
    pub groups: i64,
    /// How long the oldest has waited.
    pub oldest: Duration,
}

/// The [`DeliveryBacklog`] at `now`.
pub(super) async fn delivery_backlog(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<DeliveryBacklog> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "groups!",
                min(CASE WHEN incident_id IS NULL THEN first_letter_at ELSE resolved_at END)
                    AS "since?"
         FROM core.dead_letter_groups
         WHERE incident_live AND (incident_id IS NULL OR resolved_at IS NOT NULL)"#,
    )
    .fetch_one(db)
    .await?;
    Ok(DeliveryBacklog {
        groups: row.groups,
        oldest: row
            .since
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default(),
    })
}

/// What waits in the letters' intake at `now`: records received and not yet settled into
/// letters, how long the oldest has waited, and records set aside (PostgreSQL refused their
/// letter even as received: a person must read them, `docs/operations.md`).
pub(super) async fn received_letters(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<Received> {
    let row = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE refused IS NULL) AS "unsettled!",
                min(received_at) FILTER (WHERE refused IS NULL) AS "oldest?",
                count(*) FILTER (WHERE refused IS NOT NULL) AS "set_aside!"
         FROM core.letter_intake"#,
    )
    .fetch_one(db)
    .await?;
    Ok(Received {
        unsettled: row.unsettled,
        oldest: row
            .oldest
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default(),
        set_aside: row.set_aside,
    })
}

/// What waits in the letters' intake ([`received_letters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Records received, not yet settled into letters.
    pub unsettled: i64,
    /// How long the oldest of them has waited.
    pub oldest: Duration,
    /// Records set aside: their letter refused even as received.
    pub set_aside: i64,
}

/// Letters pending review, and how old the oldest is at `now` (for the scheduled run's metrics).
pub(super) async fn pending_review(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<(i64, Duration)> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "pending!", min(created_at) AS "oldest?"
         FROM core.dead_letters WHERE status = 'pending_review'"#,
    )
    .fetch_one(db)
    .await?;
    Ok((
        row.pending,
        row.oldest
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default(),
    ))
}
