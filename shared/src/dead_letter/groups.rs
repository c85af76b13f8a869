//! Failure groups, `core.dead_letter_groups`: what an operator triages and an incident stands for.
//!
//! Invariants: the database puts every letter in exactly one group, in the letter's own insert
//! (a trigger), whichever code wrote it. A group is one failure (consumer, queue, error kind, the
//! error with its varying values masked) while any of its letters is pending review; reviewing
//! its last pending letter resolves it, and a later letter of the same failure opens a new group.
//! A group's incident is delivered by [`crate::paging::GroupIncidents`].

use super::list::Listing;
use super::{ErrorKind, GroupStatus};
use crate::ids::{ConsumerName, DeadLetterId, GroupId, JobId};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgExecutor, Postgres, QueryBuilder};

/// The incident a group stands for, as far as it has been delivered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    /// BetterStack's incident id.
    pub id: String,
    /// When it was opened.
    pub opened_at: DateTime<Utc>,
    /// The letter count it shows (at its opening or its latest update).
    pub count: i64,
    /// When it was last updated with a count.
    pub updated_at: Option<DateTime<Utc>>,
    /// When it was resolved.
    pub resolved_at: Option<DateTime<Utc>>,
}

/// One failure group, read back as the domain's types.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    /// Primary key.
    pub id: GroupId,
    /// Open or resolved.
    pub status: GroupStatus,
    /// The consumer.
    pub consumer: ConsumerName,
    /// The queue its letters came from.
    pub queue: String,
    /// The error kind.
    pub error_kind: ErrorKind,
    /// The error with the values that vary per job masked (`<q>`, `<id>`, `<n>`).
    pub pattern: String,
    /// The first letter's error.
    pub sample_error: String,
    /// The latest letter's error.
    pub last_error: String,
    /// The first letter.
    pub sample_letter_id: DeadLetterId,
    /// Its job.
    pub sample_job_id: Option<JobId>,
    /// Its correlation id.
    pub sample_correlation_id: Option<String>,
    /// Letters in the group.
    pub letter_count: i64,
    /// Of those, still pending review.
    pub pending_count: i64,
    /// When its first letter was written.
    pub first_letter_at: DateTime<Utc>,
    /// When its latest letter was written.
    pub last_letter_at: DateTime<Utc>,
    /// When its last pending letter was reviewed.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Its incident, once opened.
    pub incident: Option<Incident>,
    /// Failed deliveries of its incident's current step.
    pub delivery_failures: i32,
    /// The last of those failures.
    pub last_delivery_error: Option<String>,
}

#[derive(sqlx::FromRow)]
pub(crate) struct GroupRow {
    id: GroupId,
    consumer: ConsumerName,
    queue: String,
    error_kind: ErrorKind,
    pattern: String,
    sample_error: String,
    last_error: String,
    sample_letter_id: DeadLetterId,
    sample_job_id: Option<JobId>,
    sample_correlation_id: Option<String>,
    letter_count: i64,
    pending_count: i64,
    first_letter_at: DateTime<Utc>,
    last_letter_at: DateTime<Utc>,
    resolved_at: Option<DateTime<Utc>>,
    incident_id: Option<String>,
    incident_opened_at: Option<DateTime<Utc>>,
    incident_count: Option<i64>,
    incident_updated_at: Option<DateTime<Utc>>,
    incident_resolved_at: Option<DateTime<Utc>>,
    delivery_failures: i32,
    last_delivery_error: Option<String>,
}

impl From<GroupRow> for Group {
    fn from(r: GroupRow) -> Self {
        let incident = match (r.incident_id, r.incident_opened_at) {
            (Some(id), Some(opened_at)) => Some(Incident {
                id,
                opened_at,
                count: r.incident_count.unwrap_or(0),
                updated_at: r.incident_updated_at,
                resolved_at: r.incident_resolved_at,
            }),
            _ => None,
        };
        Self {
            id: r.id,
            status: if r.resolved_at.is_some() {
                GroupStatus::Resolved
            } else {
                GroupStatus::Open
            },
            consumer: r.consumer,
            queue: r.queue,
            error_kind: r.error_kind,
            pattern: r.pattern,
            sample_error: r.sample_error,
            last_error: r.last_error,
            sample_letter_id: r.sample_letter_id,
            sample_job_id: r.sample_job_id,
            sample_correlation_id: r.sample_correlation_id,
            letter_count: r.letter_count,
            pending_count: r.pending_count,
            first_letter_at: r.first_letter_at,
            last_letter_at: r.last_letter_at,
            resolved_at: r.resolved_at,
            incident,
            delivery_failures: r.delivery_failures,
            last_delivery_error: r.last_delivery_error,
        }
    }
}

pub(crate) const COLUMNS: &str = "id, consumer, queue, error_kind, pattern, sample_error, last_error, \
    sample_letter_id, sample_job_id, sample_correlation_id, letter_count, pending_count, \
    first_letter_at, last_letter_at, resolved_at, incident_id, incident_opened_at, incident_count, \
    incident_updated_at, incident_resolved_at, delivery_failures, last_delivery_error";

/// Which groups to list; every field narrows, `None` does not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupFilter {
    /// Open or resolved.
    pub status: Option<GroupStatus>,
    /// The queue.
    pub queue: Option<String>,
    /// The consumer.
    pub consumer: Option<String>,
    /// The error kind.
    pub error_kind: Option<ErrorKind>,
}

/// A place in the latest-first order of groups: a page continues strictly after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPosition {
    /// The last listed group's `last_letter_at`.
    pub last_letter_at: DateTime<Utc>,
    /// The last listed group's id.
    pub id: GroupId,
}

impl Group {
    /// The position right after this group.
    pub fn position(&self) -> GroupPosition {
        GroupPosition {
            last_letter_at: self.last_letter_at,
            id: self.id,
        }
    }
}

/// Up to `limit` groups matching `filter`, the latest letter first, strictly after `after`.
pub async fn list_groups(
    db: impl PgExecutor<'_>,
    filter: &GroupFilter,
    after: Option<GroupPosition>,
    limit: u32,
) -> sqlx::Result<Vec<Group>> {
    // Dynamic: only the filters that are set, so each combination gets a plan for its own index.
    let q = QueryBuilder::<Postgres>::new(format!(
        "SELECT {COLUMNS} FROM core.dead_letter_groups_counted WHERE true"
    ));
    let mut list = Listing::new(q);
    match filter.status {
        Some(GroupStatus::Open) => list.and("resolved_at IS NULL"),
        Some(GroupStatus::Resolved) => list.and("resolved_at IS NOT NULL"),
        None => &mut list,
    };
    list.test("queue =", filter.queue.clone())
        .test("consumer =", filter.consumer.clone())
        .test("error_kind =", filter.error_kind.map(ErrorKind::as_str));
    let after = after.map(|a| (a.last_letter_at, a.id.0));
    let mut q = list.page("last_letter_at", after, limit);
    let rows: Vec<GroupRow> = q.build_query_as().fetch_all(db).await?;
    Ok(rows.into_iter().map(Group::from).collect())
}

/// One group, if it exists.
pub async fn group(db: impl PgExecutor<'_>, id: GroupId) -> sqlx::Result<Option<Group>> {
    // Dynamic: a `GroupRow` by the one column list (`COLUMNS`) its every read shares.
    let row: Option<GroupRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM core.dead_letter_groups_counted WHERE id = $1"
    )))
    .bind(id.0)
    .fetch_optional(db)
    .await?;
    Ok(row.map(Group::from))
}

/// Where the replays of `id`'s letters that failed again went: each other group holding such a
/// letter, with how many, oldest group first. A replay that fails again joins its letter's group
/// while the group has letters pending, and opens a new group once it is resolved; this is how
/// the operator who replayed a group finds the new one.
pub async fn groups_of_failed_replays(
    db: impl PgExecutor<'_>,
    id: GroupId,
) -> sqlx::Result<Vec<(GroupId, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT again.group_id AS "group_id!: GroupId", count(*) AS "letters!"
         FROM core.dead_letters replayed
         JOIN core.dead_letters again ON again.replay_of = replayed.id
         WHERE replayed.group_id = $1 AND again.group_id IS NOT NULL AND again.group_id <> $1
         GROUP BY again.group_id ORDER BY again.group_id"#,
        id.0,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.group_id, r.letters)).collect())
}

/// The group a letter belongs to (none for a letter written before groups existed).
pub async fn group_of_letter(
    db: impl PgExecutor<'_>,
    letter: DeadLetterId,
) -> sqlx::Result<Option<Group>> {
    // Dynamic: a `GroupRow` by the one column list (`COLUMNS`) its every read shares.
    let row: Option<GroupRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM core.dead_letter_groups_counted
         WHERE id = (SELECT group_id FROM core.dead_letters WHERE id = $1)"
    )))
    .bind(letter.0)
    .fetch_optional(db)
    .await?;
    Ok(row.map(Group::from))
}
