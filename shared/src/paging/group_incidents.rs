//! A failure group's incident: opened once while the group is open, updated with its count at
//! most every `update_every`, resolved when the group is. Claimed and recorded on the group's row
//! in `core.dead_letter_groups`.

use super::group_incident_text::{incident_body, update_comment};
use super::{AlertError, BetterStack, Lease, Paged, Routes, retry_at, stored};
use crate::dead_letter::{COLUMNS, Group, GroupRow, GroupStatus};
use crate::lease::Leased;
use chrono::{DateTime, Utc};
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

impl Leased for GroupIncidents<'_> {
    type Client = BetterStack;
    type Error = AlertError;
    type Done = Paged;
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
            "WITH claimed AS (
                 UPDATE core.dead_letter_groups SET claimed_until = $2
                 WHERE id IN (SELECT id FROM core.dead_letter_groups g
                              WHERE incident_live AND next_delivery_at <= $1
                                AND (claimed_until IS NULL OR claimed_until < $1)
                                -- An open incident lags only if its count does.
                                AND (incident_id IS NULL OR resolved_at IS NOT NULL
                                     OR incident_count IS DISTINCT FROM
                                        (SELECT sum(t.letters) FROM core.dead_letter_group_tallies t
                                         WHERE t.group_id = g.id))
                              ORDER BY next_delivery_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
                 RETURNING id)
             SELECT {COLUMNS}, previous_incident_id
             FROM core.dead_letter_groups_counted JOIN claimed USING (id)"
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
        match due.step {
            IncidentStep::Open => record_shown(pool, group, opened, now, next_update).await?,
            IncidentStep::Update => record_shown(pool, group, None, now, next_update).await?,
            IncidentStep::Resolve => record_resolved(pool, group, now).await?,
        }
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

/// Records that the group's incident shows its count: `opened` it (with that id), or updated
/// it. The next update is due no sooner than `next_update`; a group resolved meanwhile is due
/// at once (`-infinity`): its incident is to be resolved.
async fn record_shown(
    pool: &PgPool,
    group: &Group,
    opened: Option<String>,
    now: DateTime<Utc>,
    next_update: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.dead_letter_groups
         SET incident_id = coalesce($5, incident_id),
             incident_opened_at = CASE WHEN $5::text IS NULL THEN incident_opened_at ELSE $3 END,
             incident_updated_at = CASE WHEN $5::text IS NULL THEN $3 ELSE incident_updated_at END,
             incident_count = $2,
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
    .await
    .map(drop)
}

/// Records that the group's incident is resolved.
async fn record_resolved(pool: &PgPool, group: &Group, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.dead_letter_groups
         SET incident_resolved_at = $2,
             claimed_until = NULL, delivery_failures = 0, last_delivery_error = NULL
         WHERE id = $1",
        group.id.0,
        now,
    )
    .execute(pool)
    .await
    .map(drop)
}
