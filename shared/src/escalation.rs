//! Escalation of failure groups nobody reviewed (spec open question 2).
//!
//! Invariants: a group reaches step k when its oldest pending letter is k·N days old, and each
//! (group, step) pages once. The step is claimed in a committed row before its page is sent and
//! marked sent after, so nothing is locked while BetterStack answers: a review of the group's
//! letters never waits on an escalation. A page that fails is retried by a later run; a claim
//! whose sender died is taken over when its lease ends. A run pages only until its `until`:
//! what is left is paged by the next run.

use crate::alerting::{BetterStack, Route, with_route};
use crate::ids::GroupId;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::time::Duration;
use tokio::time::Instant;

/// How long a claimed step is left to its sender before another run may page it.
const LEASE: Duration = Duration::from_secs(120);

/// An open group past the escalation threshold.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct DueGroup {
    /// The group.
    pub id: GroupId,
    /// Its queue.
    pub queue: String,
    /// Its consumer.
    pub consumer: String,
    /// Its error kind.
    pub error_kind: String,
    /// Its masked error.
    pub pattern: String,
    /// Letters still pending.
    pub pending_count: i64,
    /// The oldest pending letter's creation.
    pub oldest: DateTime<Utc>,
    /// The step it has reached: 1 after N days, 2 after 2N days, ...
    pub step: i32,
}

/// The open groups that have reached a step not yet paged, at `now` with threshold `after`.
pub(crate) async fn due_groups(
    pool: &PgPool,
    now: DateTime<Utc>,
    after: Duration,
) -> sqlx::Result<Vec<DueGroup>> {
    sqlx::query_as(
        "WITH open AS (
             SELECT g.id, g.queue, g.consumer, g.error_kind, g.pattern, g.pending_count,
                    (SELECT min(d.created_at) FROM core.dead_letters d
                     WHERE d.group_id = g.id AND d.status = 'pending_review') AS oldest
             FROM core.dead_letter_groups g WHERE g.resolved_at IS NULL)
         SELECT id, queue, consumer, error_kind, pattern, pending_count, oldest,
                floor(extract(epoch FROM ($1 - oldest)) / $2)::int AS step
         FROM open
         WHERE oldest <= $1 - make_interval(secs => $2)
           AND NOT EXISTS (SELECT 1 FROM core.dead_letter_group_escalations e
                           WHERE e.group_id = open.id
                             AND e.step = floor(extract(epoch FROM ($1 - open.oldest)) / $2)::int
                             AND e.paged_at IS NOT NULL)
         ORDER BY oldest",
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
    /// Letters still pending in the groups paged.
    pub letters: u64,
    /// Pages that failed (left for a later run).
    pub failed: usize,
    /// Incidents opened for queues whose replays stay unsent past the bound.
    pub unsent_opened: usize,
    /// Such incidents resolved (every replay of their queue sent, or none past the bound).
    pub unsent_resolved: usize,
    /// Pages not sent for lack of time in this run (the next run sends them).
    pub deferred: usize,
}

/// Pages every due (group, step) once: claims it, pages, marks it paged. A page is started only
/// with a whole `budget` left before `until`; the others wait for the next run.
pub(crate) async fn escalate(
    pool: &PgPool,
    client: &BetterStack,
    route: &Route,
    now: DateTime<Utc>,
    after: Duration,
    budget: Duration,
    until: Instant,
) -> sqlx::Result<EscalationReport> {
    let mut report = EscalationReport::default();
    let lease_end = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    for group in due_groups(pool, now, after).await? {
        if Instant::now() + budget > until {
            report.deferred += 1;
            continue;
        }
        let claimed: Option<i32> = sqlx::query_scalar(
            "INSERT INTO core.dead_letter_group_escalations AS e (group_id, step, claimed_until)
             VALUES ($1, $2, $4)
             ON CONFLICT (group_id, step) DO UPDATE SET claimed_until = $4
                 WHERE e.paged_at IS NULL AND (e.claimed_until IS NULL OR e.claimed_until < $3)
             RETURNING step",
        )
        .bind(group.id.0)
        .bind(group.step)
        .bind(now)
        .bind(lease_end)
        .fetch_optional(pool)
        .await?;
        if claimed.is_none() {
            continue; // paged, or being paged by another run
        }
        let mut body = page(&group, after);
        with_route(&mut body, route);
        match client.create_incident(&body, budget).await {
            Ok(incident) => {
                sqlx::query(
                    "UPDATE core.dead_letter_group_escalations
                     SET paged_at = $3, incident_id = $4, claimed_until = NULL
                     WHERE group_id = $1 AND step = $2",
                )
                .bind(group.id.0)
                .bind(group.step)
                .bind(now)
                .bind(&incident)
                .execute(pool)
                .await?;
                report.pages += 1;
                report.letters += group.pending_count.max(0) as u64;
            }
            Err(error) => {
                tracing::warn!(group = %group.id, step = group.step, %error,
                    "escalation not sent; a later run retries it");
                sqlx::query(
                    "UPDATE core.dead_letter_group_escalations
                     SET claimed_until = NULL, attempts = attempts + 1, last_error = $3
                     WHERE group_id = $1 AND step = $2",
                )
                .bind(group.id.0)
                .bind(group.step)
                .bind(error.to_string())
                .execute(pool)
                .await?;
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

fn page(group: &DueGroup, after: Duration) -> Value {
    let days = after.as_secs_f64() / 86_400.0 * f64::from(group.step);
    json!({
        "name": format!("Unreviewed dead letters: {} / {} on {}", group.consumer, group.error_kind, group.queue),
        "summary": format!("{} {} dead letter(s) of group {} pending review for over {days:.0} day(s)",
            group.pending_count, group.error_kind, group.id),
        "description": format!(
            "Group {id} ({consumer}, {kind} on {queue}: {pattern}) still has {pending} letter(s) \
             pending review, the oldest since {oldest} (escalation step {step}).\n\
             Review them: dlq group {id}; then dlq replay --group {id} (what should run) or \
             dlq discard --group {id} --reason '…' (the rest).",
            id = group.id, consumer = group.consumer, kind = group.error_kind, queue = group.queue,
            pattern = group.pattern, pending = group.pending_count,
            oldest = group.oldest.to_rfc3339(), step = group.step),
    })
}

impl EscalationReport {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: EscalationReport) {
        self.pages += other.pages;
        self.letters += other.letters;
        self.failed += other.failed;
        self.unsent_opened += other.unsent_opened;
        self.unsent_resolved += other.unsent_resolved;
        self.deferred += other.deferred;
    }
}
