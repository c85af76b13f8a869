//! Escalation of failure groups nobody reviewed (spec open question 2): a group reaches step k
//! when its oldest pending letter is k·N days old, and each (group, step) pages once, claimed in
//! `core.dead_letter_group_escalations`. A review of the group's letters never waits on one.

use super::routes::with_route;
use super::{AlertError, BetterStack, Lease, Paged, Route, stored};
use crate::ids::GroupId;
use crate::lease::Leased;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

/// Pages of open groups whose oldest pending letter is older than `after` (a step per `after`).
pub(crate) struct Escalations<'a> {
    /// Whom escalations page.
    pub route: &'a Route,
    /// The threshold, N days.
    pub after: Duration,
}

/// An open group past the threshold, and the step it has reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DueGroup {
    id: GroupId,
    queue: String,
    consumer: String,
    error_kind: String,
    pattern: String,
    pending_count: i64,
    oldest: DateTime<Utc>,
    /// 1 after N days, 2 after 2N days, ...
    step: i32,
}

impl Leased for Escalations<'_> {
    type Client = BetterStack;
    type Error = AlertError;
    type Done = Paged;
    type Step = DueGroup;
    type Sent = String;
    const KIND: &'static str = "escalation";

    /// The open groups at a step not yet paged and held by no sender: the steps never tried
    /// first, then the oldest letter first. Each (group, step) is claimed
    /// unless another run claimed it meanwhile.
    // Long for its one statement: the SQL is most of it, and reads best whole.
    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<DueGroup>> {
        sqlx::query_as!(
            DueGroup,
            r#"WITH open AS (
                 SELECT g.id, g.queue, g.consumer, g.error_kind, g.pattern, g.pending_count,
                        (SELECT min(d.created_at) FROM core.dead_letters d
                         WHERE d.group_id = g.id AND d.status = 'pending_review') AS oldest
                 FROM core.dead_letter_groups_counted g WHERE g.resolved_at IS NULL),
             candidates AS (
                 SELECT open.*, s.step
                 FROM open
                 CROSS JOIN LATERAL (SELECT floor(extract(epoch FROM ($1 - open.oldest))
                                                  / $3::float8)::int AS step) s
                 WHERE open.oldest <= $1 - make_interval(secs => $3::float8)),
             -- The steps' rows free to claim, locked now or skipped: a claim never waits on
             -- another sender (nor on anything holding a row), so it is never cut off midway.
             held AS (
                 SELECT e.group_id, e.step, e.attempts
                 FROM core.dead_letter_group_escalations e
                 JOIN candidates c ON c.id = e.group_id AND c.step = e.step
                 WHERE e.paged_at IS NULL AND (e.claimed_until IS NULL OR e.claimed_until < $1)
                 FOR UPDATE OF e SKIP LOCKED),
             due AS (
                 SELECT c.*
                 FROM candidates c
                 LEFT JOIN held h ON h.group_id = c.id AND h.step = c.step
                 WHERE h.group_id IS NOT NULL
                    OR NOT EXISTS (SELECT 1 FROM core.dead_letter_group_escalations e
                                   WHERE e.group_id = c.id AND e.step = c.step)
                 -- Never tried first: steps BetterStack keeps refusing never hold the others back.
                 ORDER BY coalesce(h.attempts, 0), c.oldest LIMIT $4),
             claimed AS (
                 INSERT INTO core.dead_letter_group_escalations AS e (group_id, step, claimed_until)
                 SELECT id, step, $2 FROM due
                 ON CONFLICT (group_id, step) DO UPDATE SET claimed_until = $2
                     WHERE e.paged_at IS NULL AND (e.claimed_until IS NULL OR e.claimed_until < $1)
                 RETURNING group_id, step)
             SELECT due.id AS "id!: GroupId", due.queue AS "queue!", due.consumer AS "consumer!",
                    due.error_kind AS "error_kind!", due.pattern AS "pattern!",
                    due.pending_count AS "pending_count!", due.oldest AS "oldest!",
                    due.step AS "step!"
             FROM due JOIN claimed ON claimed.group_id = due.id AND claimed.step = due.step
             ORDER BY due.oldest"#,
            lease.now,
            lease.until,
            self.after.as_secs_f64(),
            limit,
        )
        .fetch_all(&mut *conn)
        .await
    }

    async fn send(
        &self,
        client: &BetterStack,
        group: &DueGroup,
        budget: Duration,
    ) -> Result<String, AlertError> {
        let mut body = page(group, self.after);
        with_route(&mut body, self.route);
        client.create_incident(&body, budget).await
    }

    async fn record(
        &self,
        pool: &PgPool,
        group: &DueGroup,
        incident: String,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Paged> {
        sqlx::query!(
            "UPDATE core.dead_letter_group_escalations
             SET paged_at = $3, incident_id = $4, claimed_until = NULL
             WHERE group_id = $1 AND step = $2",
            group.id.0,
            group.step,
            now,
            &incident,
        )
        .execute(pool)
        .await?;
        Ok(Paged::Opened {
            letters: group.pending_count.max(0) as u64,
        })
    }

    /// A refused page counts an attempt and is due again at once (the claim takes the steps
    /// never tried first, so a refused one holds nothing back); one not started for lack of
    /// time is left as it was.
    async fn release(
        &self,
        pool: &PgPool,
        group: &DueGroup,
        error: Option<&AlertError>,
        _: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            "UPDATE core.dead_letter_group_escalations
             SET claimed_until = NULL,
                 attempts = attempts + CASE WHEN $3::text IS NULL THEN 0 ELSE 1 END,
                 last_error = coalesce($3, last_error)
             WHERE group_id = $1 AND step = $2",
            group.id.0,
            group.step,
            error.map(stored),
        )
        .execute(pool)
        .await
        .map(drop)
    }

    fn label(group: &DueGroup) -> String {
        format!("step {} of group {}", group.step, group.id)
    }
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
