//! Escalation of dead letters still `pending_review` after N days (spec open question 2).
//!
//! Invariant: each (letter, step) is escalated once. Step k is reached after k·N days. Letters are
//! grouped by (queue, error kind, step) into one page; the escalation rows of a group commit only
//! if its page was sent, so a failed page is retried by the next run and a sent one never repeats.
//! Concurrent runs serialize on the rows' primary key: the second finds them taken.

use crate::alerting::BetterStack;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;

/// Pending letters of one queue and kind that reached one escalation step.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EscalationGroup {
    /// The queue.
    pub queue: String,
    /// The error kind.
    pub error_kind: String,
    /// The step: 1 after N days, 2 after 2N days, ...
    pub step: i32,
    /// Letters in the group.
    pub letters: i64,
    /// The oldest letter's creation.
    pub oldest: DateTime<Utc>,
}

/// The groups due at `now` with threshold `after`.
pub async fn due_groups(
    pool: &PgPool,
    now: DateTime<Utc>,
    after: Duration,
) -> sqlx::Result<Vec<EscalationGroup>> {
    sqlx::query_as(
        "WITH due AS (
             SELECT d.id, d.queue, d.error_kind, d.created_at,
                    floor(extract(epoch FROM ($1 - d.created_at)) / $2)::int AS step
             FROM core.dead_letters d
             WHERE d.status = 'pending_review' AND d.created_at <= $1 - make_interval(secs => $2))
         SELECT queue, error_kind, step, count(*) AS letters, min(created_at) AS oldest
         FROM due
         WHERE NOT EXISTS (SELECT 1 FROM core.dead_letter_escalations e WHERE e.letter_id = due.id AND e.step = due.step)
         GROUP BY queue, error_kind, step
         ORDER BY min(created_at)",
    )
    .bind(now)
    .bind(after.as_secs_f64())
    .fetch_all(pool)
    .await
}

/// What one escalation run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EscalationReport {
    /// Pages sent.
    pub pages: usize,
    /// Letters escalated.
    pub letters: u64,
    /// Groups whose page failed (left for the next run).
    pub failed: usize,
}

/// Escalates every due group: records its (letter, step) rows and pages, committing the rows
/// only when the page went out.
pub async fn escalate(
    pool: &PgPool,
    client: &BetterStack,
    now: DateTime<Utc>,
    after: Duration,
    budget: Duration,
) -> sqlx::Result<EscalationReport> {
    let mut report = EscalationReport::default();
    for group in due_groups(pool, now, after).await? {
        let mut tx = pool.begin().await?;
        let claimed = sqlx::query(
            "INSERT INTO core.dead_letter_escalations (letter_id, step, escalated_at)
             SELECT id, $4, $1 FROM core.dead_letters
             WHERE status = 'pending_review' AND queue = $2 AND error_kind = $3
               AND floor(extract(epoch FROM ($1 - created_at)) / $5)::int = $4
             ON CONFLICT DO NOTHING",
        )
        .bind(now)
        .bind(&group.queue)
        .bind(&group.error_kind)
        .bind(group.step)
        .bind(after.as_secs_f64())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if claimed == 0 {
            continue; // another run escalated them meanwhile
        }
        match client.send(&page(&group, claimed, after), budget).await {
            Ok(_) => {
                tx.commit().await?;
                report.pages += 1;
                report.letters += claimed;
            }
            Err(error) => {
                tracing::warn!(queue = group.queue, kind = group.error_kind, step = group.step, %error, "escalation not sent; the next run retries it");
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

fn page(group: &EscalationGroup, letters: u64, after: Duration) -> serde_json::Value {
    let days = after.as_secs_f64() / 86_400.0 * f64::from(group.step);
    json!({
        "name": format!("Unreviewed dead letters: {} / {}", group.queue, group.error_kind),
        "summary": format!("{letters} {} dead letter(s) on {} pending review for over {days:.0} day(s)", group.error_kind, group.queue),
        "description": format!(
            "{letters} dead letter(s) of kind {kind} on queue {queue} are still pending review after {days:.0} day(s) \
             (escalation step {step}; the oldest since {oldest}).\n\
             Review them: GET /v1/core/dead-letters?queue={queue}&error_kind={kind}&status=pending_review — \
             replay what should run, discard the rest with a reason.",
            kind = group.error_kind, queue = group.queue, step = group.step, oldest = group.oldest.to_rfc3339()),
    })
}
