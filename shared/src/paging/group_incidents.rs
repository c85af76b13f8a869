//! A failure group's incident: opened once while the group is open, updated with its count at
//! most every `update_every`, resolved when the group is. Claimed and recorded on the group's row
//! in `core.dead_letter_groups`.

use super::betterstack::{clip, with_route};
use super::{AlertError, BetterStack, Lease, Paged, Pager, Routes, retry_at, stored};
use crate::dead_letter::{COLUMNS, Group, GroupRow, GroupStatus};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

/// What a group's incident needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncidentStep {
    /// The group is open and has no incident: page.
    Open,
    /// The incident shows an older count: update it.
    Update,
    /// The group is resolved and its incident is not: resolve it.
    Resolve,
}

impl Group {
    /// What the group's incident needs next, if anything.
    pub(crate) fn incident_step(&self) -> Option<IncidentStep> {
        match (&self.incident, self.status) {
            (None, GroupStatus::Open) => Some(IncidentStep::Open),
            (None, GroupStatus::Resolved) => None,
            (Some(incident), _) if incident.resolved_at.is_some() => None,
            (Some(_), GroupStatus::Resolved) => Some(IncidentStep::Resolve),
            (Some(incident), GroupStatus::Open) => {
                (incident.count != self.letter_count).then_some(IncidentStep::Update)
            }
        }
    }

    fn incident_id(&self) -> &str {
        self.incident
            .as_ref()
            .map(|i| i.id.as_str())
            .unwrap_or_default()
    }
}

/// The incidents of failure groups.
pub(crate) struct GroupIncidents<'a> {
    /// Whom each queue pages.
    pub routes: &'a Routes,
    /// How often at most an incident is updated with its group's count.
    pub update_every: Duration,
}

/// A claimed group, its step, and the incident a person resolved by hand before this one.
pub(crate) struct Due {
    group: Group,
    step: IncidentStep,
    previous: Option<String>,
}

#[derive(sqlx::FromRow)]
struct DueRow {
    #[sqlx(flatten)]
    group: GroupRow,
    previous_incident_id: Option<String>,
}

impl Pager for GroupIncidents<'_> {
    type Step = Due;
    type Sent = Option<String>;
    const KIND: &'static str = "group incident";

    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<Due>> {
        // Dynamic: a `GroupRow` by the one column list (`COLUMNS`) its every read shares.
        let rows: Vec<DueRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE core.dead_letter_groups SET claimed_until = $2
             WHERE id IN (SELECT id FROM core.dead_letter_groups
                          WHERE needs_delivery AND next_delivery_at <= $1
                            AND (claimed_until IS NULL OR claimed_until < $1)
                          ORDER BY next_delivery_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
             RETURNING {COLUMNS}, previous_incident_id"
        )))
        .bind(lease.now)
        .bind(lease.until)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                let group = Group::from(row.group);
                let step = group.incident_step()?;
                Some(Due {
                    group,
                    step,
                    previous: row.previous_incident_id,
                })
            })
            .collect())
    }

    async fn send(
        &self,
        client: &BetterStack,
        due: &Due,
        budget: Duration,
    ) -> Result<Option<String>, AlertError> {
        let group = &due.group;
        match due.step {
            IncidentStep::Open => {
                let route = self.routes.for_queue(&group.queue);
                let body = incident_body(group, route, due.previous.as_deref());
                client.create_incident(&body, budget).await.map(Some)
            }
            IncidentStep::Update => {
                let comment = update_comment(group);
                client
                    .comment(group.incident_id(), &comment, budget)
                    .await
                    .map(|()| None)
            }
            IncidentStep::Resolve => {
                let by = format!(
                    "job harness: every letter of group {} was reviewed",
                    group.id
                );
                client
                    .resolve(group.incident_id(), &by, budget)
                    .await
                    .map(|()| None)
            }
        }
    }

    async fn record(
        &self,
        pool: &PgPool,
        due: &Due,
        opened: Option<String>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Paged> {
        let group = &due.group;
        let incident = opened.as_deref().unwrap_or(group.incident_id());
        tracing::info!(group = %group.id, incident, step = ?due.step, letters = group.letter_count,
            "incident step delivered");
        let next_update = now + chrono::Duration::from_std(self.update_every).unwrap_or_default();
        // A group resolved meanwhile is due at once (`-infinity`): its incident is to be resolved.
        match (due.step, opened) {
            (IncidentStep::Open, opened) => {
                sqlx::query!(
                    "UPDATE core.dead_letter_groups
                 SET incident_id = $5, incident_opened_at = $3, incident_count = $2,
                     claimed_until = NULL, delivery_failures = 0, last_delivery_error = NULL,
                     next_delivery_at =
                         CASE WHEN resolved_at IS NULL THEN $4::timestamptz ELSE '-infinity' END
                 WHERE id = $1",
                    group.id.0,
                    group.letter_count,
                    now,
                    next_update,
                    opened,
                )
                .execute(pool)
                .await?
            }
            (IncidentStep::Update, _) => {
                sqlx::query!(
                    "UPDATE core.dead_letter_groups
                 SET incident_count = $2, incident_updated_at = $3,
                     claimed_until = NULL, delivery_failures = 0, last_delivery_error = NULL,
                     next_delivery_at =
                         CASE WHEN resolved_at IS NULL THEN $4::timestamptz ELSE '-infinity' END
                 WHERE id = $1",
                    group.id.0,
                    group.letter_count,
                    now,
                    next_update,
                )
                .execute(pool)
                .await?
            }
            (IncidentStep::Resolve, _) => {
                sqlx::query!(
                    "UPDATE core.dead_letter_groups
                 SET incident_resolved_at = $2,
                     claimed_until = NULL, delivery_failures = 0, last_delivery_error = NULL
                 WHERE id = $1",
                    group.id.0,
                    now,
                )
                .execute(pool)
                .await?
            }
        };
        Ok(match due.step {
            IncidentStep::Open => Paged::Opened { letters: 0 },
            IncidentStep::Update => Paged::Updated,
            IncidentStep::Resolve => Paged::Resolved,
        })
    }

    async fn release(
        &self,
        pool: &PgPool,
        due: &Due,
        error: Option<&AlertError>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            "UPDATE core.dead_letter_groups
             SET claimed_until = NULL,
                 next_delivery_at = coalesce($3, next_delivery_at),
                 delivery_failures =
                     delivery_failures + CASE WHEN $2::text IS NULL THEN 0 ELSE 1 END,
                 last_delivery_error = coalesce($2, last_delivery_error)
             WHERE id = $1",
            due.group.id.0,
            error.map(stored),
            error.map(|_| retry_at(now, due.group.delivery_failures)),
        )
        .execute(pool)
        .await
        .map(drop)
    }

    fn label(due: &Due) -> String {
        format!("{:?} of group {}", due.step, due.group.id)
    }
}

/// The incident for a group: what failed, how often, an example, where to look, whom it pages,
/// and the incident resolved by hand before it, if any.
pub(crate) fn incident_body(group: &Group, route: &super::Route, previous: Option<&str>) -> Value {
    let mut description = description(group);
    if let Some(previous) = previous {
        description = format!("{}\n\n{description}", raised_again_note(group, previous));
    }
    let mut body = json!({
        "name": format!("Dead letters: {} / {} on {}", group.consumer, group.error_kind, group.queue),
        "summary": format!("{} {} dead letter(s) on {}: {}", group.letter_count, group.error_kind,
            group.queue, clip(&group.pattern, 120)),
        "description": description,
    });
    with_route(&mut body, route);
    body
}

fn description(group: &Group) -> String {
    format!(
        "Group {id}: {count} dead letter(s) of consumer {consumer}, kind {kind}, on queue {queue}, \
         since {first}.\nThe failure: {pattern}\nFirst error: {sample}\nSample job_id: {job}, \
         correlation_id: {corr}\n\n\
         See it: dlq group {id}   (or GET /v1/core/dead-letter-groups/{id})\n\
         Its letters: dlq list --group {id}\n\
         Once the cause is fixed: dlq replay --group {id} --dry-run, then without --dry-run.\n\
         This incident is updated with the group's count and resolved when every letter of the \
         group has been replayed or discarded.",
        id = group.id,
        count = group.letter_count,
        consumer = group.consumer,
        kind = group.error_kind,
        queue = group.queue,
        first = group.first_letter_at.to_rfc3339(),
        pattern = group.pattern,
        sample = clip(&group.sample_error, 1000),
        job = group
            .sample_job_id
            .map(|j| j.to_string())
            .unwrap_or_else(|| "(none)".into()),
        corr = group.sample_correlation_id.as_deref().unwrap_or("(none)"),
    )
}

/// The comment that brings an incident up to the group's count.
fn update_comment(group: &Group) -> String {
    format!(
        "Group {}: now {} dead letter(s), {} pending review; the latest at {}.\nLatest error: {}",
        group.id,
        group.letter_count,
        group.pending_count,
        group.last_letter_at.to_rfc3339(),
        clip(&group.last_error, 1000)
    )
}

/// What a group's new incident says when its previous one was resolved by hand.
fn raised_again_note(group: &Group, previous: &str) -> String {
    format!(
        "Raised again: incident {previous} was resolved in BetterStack while {pending} letter(s) \
         of group {id} were still pending review. This incident stays open until they are \
         replayed or discarded (dlq replay|discard --group {id}); the harness resolves it then. \
         Resolving it by hand raises it again.",
        pending = group.pending_count,
        id = group.id,
    )
}
