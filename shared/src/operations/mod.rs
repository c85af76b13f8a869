//! Bulk operations on letters, `core.dead_letter_operations`: an operator asks once for the
//! pending letters a filter selects (a failure group, a queue, any filter the list takes) to be
//! replayed or discarded with a reason, and a worker ([`Operations`], on the lease-and-loop
//! driver) works them server-side, chunk by chunk.
//!
//! Invariants: each chunk's reviews and the operation's progress (its position and counts)
//! commit in one transaction that holds the operation's row, so a worker killed at any point
//! leaves each letter reviewed once or not at all, and whoever works the operation next goes on
//! from the committed position: no letter is done twice or skipped. Every rule of a one-letter
//! review holds: the append-only guard, the audit (the operator as `reviewed_by`, the reason, the
//! operation's id), and every replay guarantee (a letter whose job committed is replayed as
//! `already_processed` and sends nothing; one that is not replayable or not sendable is left
//! pending and counted). A replay's verdict commits before it is sent; a send the queue refused,
//! or one a killed worker never made, stays `queued` for the scheduled run's sender.

mod worker;

pub use worker::{OperationError, OperationTools, Operations, Worked};

use crate::dead_letter::{ErrorKind, ListFilter, ReviewStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgExecutor, PgPool};
use strum::{Display, EnumString, IntoStaticStr, VariantArray};
use tokio::time::Instant;
use uuid::Uuid;

/// What an operation does to each letter it selects.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, EnumString, Display, VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Action {
    /// Republish it to its queue (same job id: the consumer's fence applies it at most once).
    Replay,
    /// Close it with the operation's reason.
    Discard,
}

/// Where an operation stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, EnumString, Display, VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Status {
    /// Being worked (or waiting for a worker).
    Running,
    /// Every letter it selected was worked.
    Done,
    /// Stopped by an operator; what it did stays done.
    Cancelled,
}

crate::dead_letter::text_enum!(Action, "operation action");
crate::dead_letter::text_enum!(Status, "operation status");

/// What an operation did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Progress {
    /// Letters replayed (their replay queued for sending, or already sent).
    pub replayed: i64,
    /// Of those, sent by the operation (the rest are sent by the scheduled run).
    pub sent: i64,
    /// Letters replayed whose job had committed: nothing sent.
    pub already_processed: i64,
    /// Letters discarded.
    pub discarded: i64,
    /// Letters left pending: not replayable (unsettled, a poison without a job id, another job
    /// under its id).
    pub skipped_not_replayable: i64,
    /// Letters left pending: SQS would refuse the body (edit or discard them one by one).
    pub skipped_not_sendable: i64,
}

impl Progress {
    /// Letters worked: reviewed or skipped.
    pub fn worked(&self) -> i64 {
        self.replayed
            + self.already_processed
            + self.discarded
            + self.skipped_not_replayable
            + self.skipped_not_sendable
    }
}

/// An operation, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Operation {
    /// Its id.
    pub id: Uuid,
    /// Replay or discard.
    pub action: Action,
    /// The letters it selects (pending ones only).
    pub selection: ListFilter,
    /// Why, as the operator said.
    pub reason: String,
    /// Who asked.
    pub requested_by: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Letters written before this are in it.
    pub through: DateTime<Utc>,
    /// Pending letters it selected when asked.
    pub planned: i64,
    /// Where it stands.
    pub status: Status,
    /// What it did.
    pub progress: Progress,
    /// Who cancelled it, and why.
    pub cancelled_by: Option<String>,
    /// Why it was cancelled.
    pub cancel_reason: Option<String>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
    /// Chunks that failed in a row (retried after a backoff), and the last failure.
    pub failures: i32,
    /// The last failure.
    pub last_error: Option<String>,
}

#[derive(sqlx::FromRow)]
pub(crate) struct OperationRow {
    id: Uuid,
    action: Action,
    selection: sqlx::types::Json<ListFilter>,
    reason: String,
    requested_by: String,
    created_at: DateTime<Utc>,
    through: DateTime<Utc>,
    planned: i64,
    status: Status,
    #[sqlx(flatten)]
    progress: Progress,
    cancelled_by: Option<String>,
    cancel_reason: Option<String>,
    finished_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    failures: i32,
    last_error: Option<String>,
}

impl OperationRow {
    pub(crate) fn operation(self) -> Operation {
        Operation {
            id: self.id,
            action: self.action,
            selection: self.selection.0,
            reason: self.reason,
            requested_by: self.requested_by,
            created_at: self.created_at,
            through: self.through,
            planned: self.planned,
            status: self.status,
            progress: self.progress,
            cancelled_by: self.cancelled_by,
            cancel_reason: self.cancel_reason,
            finished_at: self.finished_at,
            updated_at: self.updated_at,
            failures: self.failures,
            last_error: self.last_error,
        }
    }
}

/// What a request for an operation selects now: the plan a dry run answers, and what the
/// operation records as planned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Pending letters selected.
    pub letters: i64,
    /// Of those, by error kind.
    pub by_kind: std::collections::BTreeMap<String, i64>,
    /// Of those, never replayable whatever their job's fence says (unsettled, or a poison
    /// without a job id): a replay leaves them pending.
    pub not_replayable: i64,
}

/// The plan of `selection` (pending letters only) written before `through`.
pub async fn plan(
    db: impl PgExecutor<'_>,
    selection: &ListFilter,
    through: DateTime<Utc>,
) -> sqlx::Result<Plan> {
    let filter = ListFilter {
        status: Some(ReviewStatus::PendingReview),
        ..selection.clone()
    };
    let rows = crate::dead_letter::count_by_kind(db, &filter, through).await?;
    let mut plan = Plan::default();
    for (kind, letters, without_job) in rows {
        plan.letters += letters;
        if kind == ErrorKind::Unsettled.as_str() {
            plan.not_replayable += letters;
        } else {
            plan.not_replayable += without_job;
        }
        plan.by_kind.insert(kind, letters);
    }
    Ok(plan)
}

/// What an operator asks for.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Replay or discard.
    pub action: Action,
    /// The letters (pending ones only).
    pub selection: &'a ListFilter,
    /// Why; not blank.
    pub reason: &'a str,
    /// Who asks.
    pub actor: &'a str,
}

/// Creates the operation `request` asks for at `now`, with its plan; a worker takes it within
/// its schedule.
pub async fn start(
    pool: &PgPool,
    request: &Request<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<Operation> {
    let plan = plan(pool, request.selection, now).await?;
    let selection = sqlx::types::Json(request.selection);
    // Dynamic: `OperationRow` reads its progress by `#[sqlx(flatten)]`.
    let row: OperationRow = sqlx::query_as(
        "INSERT INTO core.dead_letter_operations
             (id, action, selection, reason, requested_by, created_at, through, planned, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $6)
         RETURNING *",
    )
    .bind(Uuid::new_v4())
    .bind(request.action.as_str())
    .bind(selection)
    .bind(request.reason)
    .bind(request.actor)
    .bind(now)
    .bind(plan.letters)
    .fetch_one(pool)
    .await?;
    tracing::info!(operation = %row.id, action = request.action.as_str(), actor = request.actor,
        planned = plan.letters, "bulk operation started");
    Ok(row.operation())
}

/// One operation, if it exists.
pub async fn get(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<Option<Operation>> {
    // Dynamic: `OperationRow` reads its progress by `#[sqlx(flatten)]`.
    let row: Option<OperationRow> =
        sqlx::query_as("SELECT * FROM core.dead_letter_operations WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(row.map(OperationRow::operation))
}

/// The latest `limit` operations, newest first.
pub async fn list(db: impl PgExecutor<'_>, limit: i64) -> sqlx::Result<Vec<Operation>> {
    // Dynamic: `OperationRow` reads its progress by `#[sqlx(flatten)]`.
    let rows: Vec<OperationRow> = sqlx::query_as(
        "SELECT * FROM core.dead_letter_operations ORDER BY created_at DESC, id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(OperationRow::operation).collect())
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// Cancelled now: no chunk starts after this (the one in flight, if any, committed first).
    Now(Operation),
    /// It had ended already (done or cancelled): nothing changed.
    Ended(Operation),
    /// No such operation.
    Missing,
}

/// Cancels operation `id` for `actor` with `reason` at `now`. Waits for the chunk in flight (it
/// holds the operation's row), so the reviews the answer shows are final; the replays of the
/// last committed chunk may still be going out (their verdicts are recorded: a replay operation
/// sends what it reviewed), and `sent` may grow by one chunk after the answer.
pub async fn cancel(
    pool: &PgPool,
    id: Uuid,
    actor: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Cancelled> {
    // Dynamic: `OperationRow` reads its progress by `#[sqlx(flatten)]`.
    let row: Option<OperationRow> = sqlx::query_as(
        "UPDATE core.dead_letter_operations
         SET status = 'cancelled', cancelled_by = $2, cancel_reason = $3, finished_at = $4,
             updated_at = $4, claimed_until = NULL
         WHERE id = $1 AND status = 'running'
         RETURNING *",
    )
    .bind(id)
    .bind(actor)
    .bind(reason)
    .bind(now)
    .fetch_optional(pool)
    .await?;
    if let Some(row) = row {
        tracing::info!(operation = %id, actor, "bulk operation cancelled");
        return Ok(Cancelled::Now(row.operation()));
    }
    Ok(match get(pool, id).await? {
        Some(op) => Cancelled::Ended(op),
        None => Cancelled::Missing,
    })
}

/// What a round of the worker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Round {
    /// Operations worked.
    pub operations: u64,
    /// Chunks committed.
    pub chunks: u64,
    /// Letters worked.
    pub letters: i64,
    /// Operations that ended (done, or found cancelled).
    pub ended: u64,
    /// Operations not worked for a failure (retried after a backoff).
    pub failed: u64,
}

/// Works up to `limit` running operations, the oldest first, one after the other until `until`
/// ([`crate::lease::deliver`]). Each is claimed only when its turn comes, so no claim waits
/// behind another operation's work while its lease runs out (a claimed operation's lease is
/// renewed by each chunk). Only a failure to claim is returned.
pub async fn work(tools: &OperationTools, until: Instant, limit: i64) -> sqlx::Result<Round> {
    let mut report = Round::default();
    for _ in 0..limit.max(0) {
        let round = crate::lease::Round {
            pool: &tools.pool,
            client: tools,
            clock: tools.clock.as_ref(),
            until,
            per_step: until.saturating_duration_since(Instant::now()),
            pace: crate::lease::Pace::Share,
        };
        let mut claimed = false;
        let tally = |outcome: crate::lease::Outcome<'_, Worked, OperationError>| {
            claimed = true;
            match outcome {
                crate::lease::Outcome::Done(worked) => {
                    report.operations += 1;
                    report.chunks += worked.chunks;
                    report.letters += worked.letters;
                    report.ended += u64::from(worked.ended);
                }
                crate::lease::Outcome::Failed(_) => report.failed += 1,
                crate::lease::Outcome::Deferred => {}
            }
        };
        crate::lease::deliver(round, &Operations, 1, tally).await?;
        if !claimed || until.saturating_duration_since(Instant::now()).is_zero() {
            break;
        }
    }
    Ok(report)
}
