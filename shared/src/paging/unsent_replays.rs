//! Replays recorded but unsent past their bound (`REPLAY_UNSENT_ALERT_SECONDS`): one BetterStack
//! incident per queue while any is left, `Replays not sent: <queue>`, routed as the queue's
//! incidents, claimed in `core.replay_send_incidents`. Their letters left `pending_review` when
//! they were replayed, so their groups (and those groups' incidents) are resolved: this incident
//! stands for them. The harness resolves it once none of the queue's replays is past the bound.

use super::routes::with_route;
use super::{AlertError, BetterStack, Lease, Paged, Routes, stored};
use crate::lease::Leased;
use crate::replay::sends::{UnsentQueue, overdue_before};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

/// The incidents of queues whose replays stay unsent past `bound`.
pub(crate) struct UnsentReplayIncidents<'a> {
    /// Whom each queue pages.
    pub routes: &'a Routes,
    /// The bound.
    pub bound: Duration,
}

/// A queue's incident step.
pub(crate) enum Step {
    /// Replays are past the bound and the queue has no open incident (`previous`: the one a
    /// person resolved by hand, if any).
    Open {
        queue: UnsentQueue,
        previous: Option<String>,
    },
    /// None of the queue's replays is past the bound any more.
    Resolve { queue: String, incident: String },
}

impl Step {
    fn queue(&self) -> &str {
        match self {
            Self::Open { queue, .. } => &queue.queue,
            Self::Resolve { queue, .. } => queue,
        }
    }
}

impl Leased for UnsentReplayIncidents<'_> {
    type Client = BetterStack;
    type Error = AlertError;
    type Done = Paged;
    type Step = Step;
    type Sent = Option<String>;
    const KIND: &'static str = "unsent replays' incident";

    // Long for its two statements (open, resolve): their SQL is most of it, and reads best whole.
    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<Step>> {
        let overdue_before = overdue_before(lease.now, self.bound);
        let opens = sqlx::query!(
            r#"WITH overdue AS (
                 SELECT s.queue, count(*) AS replays, min(s.queued_at) AS oldest,
                        max(s.attempts) AS attempts,
                        (array_agg(s.last_error ORDER BY s.last_attempt_at DESC NULLS LAST))[1]
                            AS last_error
                 FROM core.replay_sends s
                 LEFT JOIN core.replay_send_incidents i ON i.queue = s.queue
                 WHERE s.queued_at < $3
                   -- Queues with an open incident, or held by a sender, never fill the limit;
                   -- those whose incident BetterStack refused come after the others.
                   AND (i.queue IS NULL
                        OR ((i.incident_id IS NULL OR i.resolved_at IS NOT NULL)
                            AND (i.claimed_until IS NULL OR i.claimed_until < $1)))
                 GROUP BY s.queue, i.attempts
                 ORDER BY coalesce(i.attempts, 0), min(s.queued_at) LIMIT $4),
             -- The queues' rows free to claim, locked now or skipped: a claim never waits.
             held AS (
                 SELECT r.queue FROM core.replay_send_incidents r JOIN overdue o USING (queue)
                 FOR UPDATE OF r SKIP LOCKED),
             free AS (
                 SELECT o.* FROM overdue o
                 WHERE o.queue IN (SELECT queue FROM held)
                    OR NOT EXISTS (SELECT 1 FROM core.replay_send_incidents r
                                   WHERE r.queue = o.queue)),
             claimed AS (
                 INSERT INTO core.replay_send_incidents AS r (queue, claimed_until)
                 SELECT queue, $2 FROM free
                 ON CONFLICT (queue) DO UPDATE SET claimed_until = $2
                     WHERE (r.incident_id IS NULL OR r.resolved_at IS NOT NULL)
                       AND (r.claimed_until IS NULL OR r.claimed_until < $1)
                 RETURNING r.queue, r.previous_incident_id)
             SELECT overdue.queue AS "queue!", overdue.replays AS "replays!",
                    overdue.oldest AS "oldest!", overdue.attempts AS "attempts!",
                    overdue.last_error AS "last_error?", claimed.previous_incident_id
             FROM overdue JOIN claimed USING (queue) ORDER BY overdue.oldest"#,
            lease.now,
            lease.until,
            overdue_before,
            limit,
        )
        .fetch_all(&mut *conn)
        .await?;
        let resolves = sqlx::query!(
            r#"UPDATE core.replay_send_incidents SET claimed_until = $2
             WHERE queue IN (SELECT r.queue FROM core.replay_send_incidents r
                             WHERE r.incident_id IS NOT NULL AND r.resolved_at IS NULL
                               AND (r.claimed_until IS NULL OR r.claimed_until < $1)
                               AND NOT EXISTS (SELECT 1 FROM core.replay_sends s
                                               WHERE s.queue = r.queue AND s.queued_at < $3)
                             FOR UPDATE SKIP LOCKED)
             RETURNING queue, incident_id AS "incident_id!""#,
            lease.now,
            lease.until,
            overdue_before,
        )
        .fetch_all(&mut *conn)
        .await?;
        let opens = opens.into_iter().map(|r| Step::Open {
            queue: UnsentQueue {
                queue: r.queue,
                replays: r.replays,
                oldest: r.oldest,
                attempts: r.attempts,
                last_error: r.last_error,
            },
            previous: r.previous_incident_id,
        });
        let resolves = resolves.into_iter().map(|r| Step::Resolve {
            queue: r.queue,
            incident: r.incident_id,
        });
        Ok(opens.chain(resolves).collect())
    }

    async fn send(
        &self,
        client: &BetterStack,
        step: &Step,
        budget: Duration,
    ) -> Result<Option<String>, AlertError> {
        match step {
            Step::Open { queue, previous } => {
                let mut body = unsent_page(queue, self.bound, previous.as_deref());
                with_route(&mut body, self.routes.for_queue(&queue.queue));
                client.create_incident(&body, budget).await.map(Some)
            }
            Step::Resolve { queue, incident } => {
                let by =
                    format!("job harness: no replay to {queue} is unsent past its bound any more");
                client.resolve(incident, &by, budget).await.map(|()| None)
            }
        }
    }

    async fn record(
        &self,
        pool: &PgPool,
        step: &Step,
        opened: Option<String>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Paged> {
        let paged = match opened {
            Some(incident) => {
                tracing::warn!(
                    queue = step.queue(),
                    incident,
                    "replays unsent past their bound: incident opened"
                );
                sqlx::query!(
                    "UPDATE core.replay_send_incidents
                     SET incident_id = $3, opened_at = $2, checked_at = $2, resolved_at = NULL,
                         claimed_until = NULL, attempts = 0, last_error = NULL
                     WHERE queue = $1",
                    step.queue(),
                    now,
                    incident,
                )
                .execute(pool)
                .await?;
                Paged::Opened { letters: 0 }
            }
            None => {
                sqlx::query!(
                    "UPDATE core.replay_send_incidents
                     SET resolved_at = $2, claimed_until = NULL, previous_incident_id = NULL,
                         attempts = 0, last_error = NULL
                     WHERE queue = $1",
                    step.queue(),
                    now,
                )
                .execute(pool)
                .await?;
                Paged::Resolved
            }
        };
        Ok(paged)
    }

    /// A refused step counts an attempt and is due again at once (the claim takes the queues
    /// never tried first); one not started for lack of time is left as it was.
    async fn release(
        &self,
        pool: &PgPool,
        step: &Step,
        error: Option<&AlertError>,
        _: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            "UPDATE core.replay_send_incidents
             SET claimed_until = NULL,
                 attempts = attempts + CASE WHEN $2::text IS NULL THEN 0 ELSE 1 END,
                 last_error = coalesce($2, last_error)
             WHERE queue = $1",
            step.queue(),
            error.map(stored),
        )
        .execute(pool)
        .await
        .map(drop)
    }

    fn label(step: &Step) -> String {
        match step {
            Step::Open { queue, .. } => format!("open for queue {}", queue.queue),
            Step::Resolve { queue, incident } => format!("resolve {incident} of queue {queue}"),
        }
    }
}

/// The incident for a queue whose replays stay unsent.
fn unsent_page(queue: &UnsentQueue, bound: Duration, previous: Option<&str>) -> Value {
    let error = queue.last_error.as_deref().unwrap_or("(not tried yet)");
    let short: String = error.chars().take(120).collect();
    let mut description = format!(
        "{replays} replay(s) to queue {q}, recorded by operators (the oldest at {oldest}), have \
         not been accepted by the queue for over {bound}. The scheduled run keeps trying each, \
         less and less often (up to hourly); the one tried most was refused {attempts} time(s), \
         lately with: {error}\n\n\
         Their letters are marked replayed (outcome queued), so their groups and those groups' \
         incidents are resolved: this incident stands for them. Their jobs' fences are kept \
         meanwhile, so a send however late still runs each job at most once.\n\
         Look: does queue {q} exist, and may the scheduled function send to it (its role's \
         sqs:GetQueueUrl and sqs:SendMessage)? Which replays: psql -c \"SELECT letter_id, \
         queued_at, attempts, last_error FROM core.replay_sends WHERE queue = '{q}'\"\n\
         Once the queue takes messages again, they are sent by the next runs and this incident \
         is resolved by the harness.",
        replays = queue.replays,
        q = queue.queue,
        oldest = queue.oldest.to_rfc3339(),
        bound = humanize(bound),
        attempts = queue.attempts,
    );
    if let Some(previous) = previous {
        description = format!(
            "Raised again: incident {previous} was resolved in BetterStack while these replays \
             were still unsent. It resolves itself once they are sent.\n\n{description}"
        );
    }
    json!({
        "name": format!("Replays not sent: {}", queue.queue),
        "summary": format!("{} replay(s) to {} unsent for over {}: {short}",
            queue.replays, queue.queue, humanize(bound)),
        "description": description,
    })
}

/// `bound` as an operator reads it: "1 h", "90 min", "45 s".
fn humanize(bound: Duration) -> String {
    let secs = bound.as_secs();
    if secs >= 3_600 && secs.is_multiple_of(3_600) {
        format!("{} h", secs / 3_600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}
