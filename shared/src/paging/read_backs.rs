//! Read-backs: an open incident is read back from BetterStack every [`INCIDENT_CHECK_INTERVAL`];
//! one a person resolved there while what it stands for is still open leaves it without an
//! incident, so the next open step raises it again, naming the one resolved. A read that fails
//! is read again after the interval.

use super::{AlertError, BetterStack, INCIDENT_CHECK_INTERVAL, Lease, Paged};
use crate::lease::Leased;
use crate::replay::sends::overdue_before;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

/// An open incident to read back: whose (a group's id, or a queue's name) and which.
#[derive(Debug)]
pub(crate) struct ReadBack {
    owner: String,
    incident_id: String,
}

fn checked_before(now: DateTime<Utc>) -> DateTime<Utc> {
    now - chrono::Duration::from_std(INCIDENT_CHECK_INTERVAL).unwrap_or(chrono::Duration::MAX)
}

/// Which open incidents are read back.
pub(crate) enum ReadBacks {
    /// Those of open failure groups.
    Groups,
    /// Those of queues whose replays stay unsent past `bound`.
    UnsentReplays {
        /// The bound.
        bound: Duration,
    },
}

impl Leased for ReadBacks {
    type Client = BetterStack;
    type Error = AlertError;
    type Done = Paged;
    type Step = ReadBack;
    type Sent = bool;
    const KIND: &'static str = "incident read-back";

    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<ReadBack>> {
        match self {
            Self::Groups => claim_groups(conn, lease, limit).await,
            Self::UnsentReplays { bound } => claim_queues(conn, lease, *bound, limit).await,
        }
    }

    async fn send(
        &self,
        client: &BetterStack,
        step: &ReadBack,
        budget: Duration,
    ) -> Result<bool, AlertError> {
        client.incident_resolved(&step.incident_id, budget).await
    }

    /// Resolved by hand: what the incident stood for has none, and is due a new one at once.
    async fn record(
        &self,
        pool: &PgPool,
        step: &ReadBack,
        by_hand: bool,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Paged> {
        match self {
            Self::Groups => record_group(pool, step, by_hand, now).await,
            Self::UnsentReplays { .. } => record_queue(pool, step, by_hand, now).await,
        }
    }

    /// A failed read counts as a read (the incident is read again after the interval); one not
    /// started for lack of time is left due as it was.
    async fn release(
        &self,
        pool: &PgPool,
        step: &ReadBack,
        error: Option<&AlertError>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        match (self, error) {
            (Self::Groups, _) => end_group_claim(pool, step, error.map(|_| now)).await,
            (Self::UnsentReplays { .. }, Some(_)) => {
                record_queue(pool, step, false, now).await.map(drop)
            }
            (Self::UnsentReplays { .. }, None) => end_queue_claim(pool, step).await,
        }
    }

    fn label(step: &ReadBack) -> String {
        format!("incident {} of {}", step.incident_id, step.owner)
    }
}

/// Claims open groups' incidents not read back for the interval.
async fn claim_groups(
    conn: &mut PgConnection,
    lease: Lease,
    limit: i64,
) -> sqlx::Result<Vec<ReadBack>> {
    sqlx::query_as!(
        ReadBack,
        r#"UPDATE core.dead_letter_groups SET claimed_until = $2
         WHERE id IN (SELECT id FROM core.dead_letter_groups
                      WHERE resolved_at IS NULL AND incident_id IS NOT NULL
                        AND incident_resolved_at IS NULL
                        AND coalesce(incident_checked_at, incident_opened_at) <= $3
                        AND (claimed_until IS NULL OR claimed_until < $1)
                      ORDER BY coalesce(incident_checked_at, incident_opened_at), id
                      LIMIT $4 FOR UPDATE SKIP LOCKED)
         RETURNING id::text AS "owner!", incident_id AS "incident_id!""#,
        lease.now,
        lease.until,
        checked_before(lease.now),
        limit,
    )
    .fetch_all(&mut *conn)
    .await
}

/// Resolved by hand: the group no longer has an incident and is due a new one at once.
/// Nothing changes but the check if the group resolved or changed incident meanwhile.
async fn record_group(
    pool: &PgPool,
    step: &ReadBack,
    by_hand: bool,
    now: DateTime<Utc>,
) -> sqlx::Result<Paged> {
    let raised: Option<bool> = sqlx::query_scalar!(
        r#"UPDATE core.dead_letter_groups
         SET previous_incident_id = incident_id,
             incidents_raised_again = incidents_raised_again + 1,
             incident_id = NULL, incident_opened_at = NULL, incident_count = NULL,
             incident_updated_at = NULL, incident_checked_at = $3, claimed_until = NULL,
             next_delivery_at = '-infinity', delivery_failures = 0, last_delivery_error = NULL
         WHERE $4 AND id = $1::text::bigint AND incident_id = $2 AND resolved_at IS NULL
           AND incident_resolved_at IS NULL
         RETURNING true AS "raised!""#,
        &step.owner,
        &step.incident_id,
        now,
        by_hand,
    )
    .fetch_optional(pool)
    .await?;
    if raised.is_some() {
        tracing::warn!(
            group = step.owner,
            incident = step.incident_id,
            "the group's incident was resolved in BetterStack while its letters are pending; raising it again"
        );
        return Ok(Paged::RaisedAgain);
    }
    end_group_claim(pool, step, Some(now))
        .await
        .map(|()| Paged::StillOpen)
}

/// Ends a group read-back's claim; with `checked_at`, the incident counts as read then.
async fn end_group_claim(
    pool: &PgPool,
    step: &ReadBack,
    checked_at: Option<DateTime<Utc>>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.dead_letter_groups
         SET incident_checked_at = coalesce($2, incident_checked_at), claimed_until = NULL
         WHERE id = $1::text::bigint",
        &step.owner,
        checked_at,
    )
    .execute(pool)
    .await
    .map(drop)
}

/// Claims the incidents of queues with replays still unsent past `bound`, not read back for
/// the interval.
async fn claim_queues(
    conn: &mut PgConnection,
    lease: Lease,
    bound: Duration,
    limit: i64,
) -> sqlx::Result<Vec<ReadBack>> {
    sqlx::query_as!(
        ReadBack,
        r#"UPDATE core.replay_send_incidents r SET claimed_until = $2
         WHERE queue IN (SELECT queue FROM core.replay_send_incidents i
                         WHERE incident_id IS NOT NULL AND resolved_at IS NULL
                           AND coalesce(checked_at, opened_at) <= $3
                           AND (claimed_until IS NULL OR claimed_until < $1)
                           AND EXISTS (SELECT 1 FROM core.replay_sends s
                                       WHERE s.queue = i.queue AND s.queued_at < $4)
                         ORDER BY coalesce(checked_at, opened_at), queue
                         LIMIT $5 FOR UPDATE SKIP LOCKED)
         RETURNING queue AS owner, incident_id AS "incident_id!""#,
        lease.now,
        lease.until,
        checked_before(lease.now),
        overdue_before(lease.now, bound),
        limit,
    )
    .fetch_all(&mut *conn)
    .await
}

/// Resolved by hand: the queue no longer has an incident, so the next round opens one, naming
/// the one resolved; else the incident counts as read at `now`.
async fn record_queue(
    pool: &PgPool,
    step: &ReadBack,
    by_hand: bool,
    now: DateTime<Utc>,
) -> sqlx::Result<Paged> {
    sqlx::query!(
        "UPDATE core.replay_send_incidents
         SET checked_at = $3, claimed_until = NULL,
             previous_incident_id = CASE WHEN $4 THEN incident_id ELSE previous_incident_id END,
             opened_at = CASE WHEN $4 THEN NULL ELSE opened_at END,
             incident_id = CASE WHEN $4 THEN NULL ELSE incident_id END
         WHERE queue = $1 AND incident_id = $2",
        &step.owner,
        &step.incident_id,
        now,
        by_hand,
    )
    .execute(pool)
    .await?;
    if !by_hand {
        return Ok(Paged::StillOpen);
    }
    tracing::warn!(
        queue = step.owner,
        incident = step.incident_id,
        "the unsent replays' incident was resolved in BetterStack while replays are unsent; raising it again"
    );
    Ok(Paged::RaisedAgain)
}

/// Ends a queue read-back's claim, leaving the incident due.
async fn end_queue_claim(pool: &PgPool, step: &ReadBack) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.replay_send_incidents SET claimed_until = NULL
         WHERE queue = $1 AND incident_id = $2",
        &step.owner,
        &step.incident_id,
    )
    .execute(pool)
    .await
    .map(drop)
}
