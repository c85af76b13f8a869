//! Replays recorded but unsent past their bound (`REPLAY_UNSENT_ALERT_SECONDS`): one BetterStack
//! incident per queue while any is left, `Replays not sent: <queue>`, routed as the queue's
//! incidents. Their letters left `pending_review` when they were replayed, so their groups (and
//! those groups' incidents) are resolved: this incident stands for them.
//!
//! Invariants: each step (open, resolve) is claimed in a committed row of
//! `core.replay_send_incidents` before BetterStack is called and recorded after, so nothing is
//! locked while it answers, and two runs never open two incidents for one queue. An open incident
//! is read back every [`INCIDENT_CHECK_INTERVAL`]; one a person resolved while replays are still
//! unsent is raised again, naming the one resolved. The harness resolves it once none of the
//! queue's replays is past the bound.

use crate::alerting::{BetterStack, INCIDENT_CHECK_INTERVAL, Routes, with_route};
use crate::escalation::EscalationReport;
use crate::replay_sends::{UnsentQueue, overdue_before, unsent_by_queue};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::time::Duration;
use tokio::time::Instant;

/// How long a claimed step is left to its sender before another run may take it.
const LEASE: Duration = Duration::from_secs(120);

/// Queues with replays unsent past the bound handled per run.
const UNSENT_QUEUES_PER_RUN: i64 = 50;

/// Opens one incident per queue whose replays stay unsent longer than `bound` at `now`, routed
/// as the queue's incidents are; reads it back every [`INCIDENT_CHECK_INTERVAL`] and raises it
/// again if a person resolved it while replays are still unsent; resolves it once none of the
/// queue's replays is past the bound. Each step is claimed (committed) before BetterStack is
/// called, so nothing is locked meanwhile; one is started only with a whole `budget` left
/// before `until`.
pub(crate) async fn page_unsent_replays(
    pool: &PgPool,
    client: &BetterStack,
    routes: &Routes,
    now: DateTime<Utc>,
    bound: Duration,
    budget: Duration,
    until: Instant,
) -> sqlx::Result<EscalationReport> {
    let mut report = EscalationReport::default();
    let overdue_before = overdue_before(now, bound);
    let lease_end = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    let checked_before =
        now - chrono::Duration::from_std(INCIDENT_CHECK_INTERVAL).unwrap_or_default();
    let out_of_time = || Instant::now() + budget > until;
    for queue in unsent_by_queue(pool, overdue_before, UNSENT_QUEUES_PER_RUN).await? {
        if out_of_time() {
            report.deferred += 1;
            continue;
        }
        let open: Option<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT incident_id, coalesce(checked_at, opened_at) FROM core.replay_send_incidents
             WHERE queue = $1 AND incident_id IS NOT NULL AND resolved_at IS NULL",
        )
        .bind(&queue.queue)
        .fetch_optional(pool)
        .await?;
        if let Some((incident, checked)) = open {
            if checked > checked_before {
                continue; // open, and read back lately
            }
            let resolved = client.incident_resolved(&incident, budget).await;
            if let Err(error) = &resolved {
                tracing::warn!(queue = queue.queue, incident, %error,
                    "could not read the unsent replays' incident back; read again later");
                report.failed += 1;
            }
            let by_hand = matches!(resolved, Ok(true));
            sqlx::query(
                "UPDATE core.replay_send_incidents
                 SET checked_at = $3,
                     previous_incident_id = CASE WHEN $4 THEN incident_id ELSE previous_incident_id END,
                     opened_at = CASE WHEN $4 THEN NULL ELSE opened_at END,
                     incident_id = CASE WHEN $4 THEN NULL ELSE incident_id END
                 WHERE queue = $1 AND incident_id = $2",
            )
            .bind(&queue.queue)
            .bind(&incident)
            .bind(now)
            .bind(by_hand)
            .execute(pool)
            .await?;
            if !by_hand {
                continue;
            }
            tracing::warn!(
                queue = queue.queue,
                incident,
                "the unsent replays' incident was resolved in BetterStack while replays are unsent; raising it again"
            );
        }
        let claimed: Option<Option<String>> = sqlx::query_scalar(
            "INSERT INTO core.replay_send_incidents AS r (queue, claimed_until) VALUES ($1, $3)
             ON CONFLICT (queue) DO UPDATE SET claimed_until = $3
                 WHERE (r.incident_id IS NULL OR r.resolved_at IS NOT NULL)
                   AND (r.claimed_until IS NULL OR r.claimed_until < $2)
             RETURNING r.previous_incident_id",
        )
        .bind(&queue.queue)
        .bind(now)
        .bind(lease_end)
        .fetch_optional(pool)
        .await?;
        let Some(previous) = claimed else {
            continue; // open, or being opened by another run
        };
        let mut body = unsent_page(&queue, bound, previous.as_deref());
        with_route(&mut body, routes.for_queue(&queue.queue));
        match client.create_incident(&body, budget).await {
            Ok(incident) => {
                sqlx::query(
                    "UPDATE core.replay_send_incidents
                     SET incident_id = $2, opened_at = $3, checked_at = $3, resolved_at = NULL,
                         claimed_until = NULL, attempts = 0, last_error = NULL
                     WHERE queue = $1",
                )
                .bind(&queue.queue)
                .bind(&incident)
                .bind(now)
                .execute(pool)
                .await?;
                tracing::warn!(
                    queue = queue.queue,
                    incident,
                    replays = queue.replays,
                    "replays unsent past their bound: incident opened"
                );
                report.unsent_opened += 1;
            }
            Err(error) => {
                tracing::warn!(queue = queue.queue, %error,
                    "the unsent replays' incident not opened; a later run retries it");
                release(pool, &queue.queue, &error.to_string()).await?;
                report.failed += 1;
            }
        }
    }
    // Queues with an open incident and nothing past the bound any more: resolved.
    let settled: Vec<(String, String)> = sqlx::query_as(
        "UPDATE core.replay_send_incidents r SET claimed_until = $2
         WHERE incident_id IS NOT NULL AND resolved_at IS NULL
           AND (claimed_until IS NULL OR claimed_until < $1)
           AND NOT EXISTS (SELECT 1 FROM core.replay_sends s
                           WHERE s.queue = r.queue AND s.queued_at < $3)
         RETURNING queue, incident_id",
    )
    .bind(now)
    .bind(lease_end)
    .bind(overdue_before)
    .fetch_all(pool)
    .await?;
    for (queue, incident) in settled {
        if out_of_time() {
            report.deferred += 1;
            release(pool, &queue, "left for the next run (out of time)").await?;
            continue;
        }
        let by = format!("job harness: no replay to {queue} is unsent past its bound any more");
        match client.resolve(&incident, &by, budget).await {
            Ok(()) => {
                sqlx::query(
                    "UPDATE core.replay_send_incidents
                     SET resolved_at = $2, claimed_until = NULL, previous_incident_id = NULL,
                         attempts = 0, last_error = NULL
                     WHERE queue = $1",
                )
                .bind(&queue)
                .bind(now)
                .execute(pool)
                .await?;
                report.unsent_resolved += 1;
            }
            Err(error) => {
                tracing::warn!(queue, incident, %error,
                    "the unsent replays' incident not resolved; a later run retries it");
                release(pool, &queue, &error.to_string()).await?;
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

/// Ends a claim on a queue's unsent-replays incident, recording why.
async fn release(pool: &PgPool, queue: &str, error: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE core.replay_send_incidents
         SET claimed_until = NULL, attempts = attempts + 1, last_error = $2
         WHERE queue = $1",
    )
    .bind(queue)
    .bind(crate::dead_letter::storable_error(error).as_ref())
    .execute(pool)
    .await
    .map(drop)
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
