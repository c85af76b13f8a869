//! Reviewing letters in bulk: one chunk at a time of the pending letters a filter selects, newest
//! first, locked and reviewed inside the caller's transaction (a bulk operation's, whose progress
//! commits with it: [`crate::operations`]).
//!
//! Invariant: a chunk locks its letters (`FOR UPDATE`) and takes only those still pending under
//! the lock, so a letter a person reviews meanwhile is left to that review, and no letter is
//! reviewed twice; the append-only guard refuses it anyway. Every statement that locks several
//! letters locks them newest first (`created_at DESC, id DESC`), as a chunk's page is ordered: a
//! commit closing its jobs' letters (`core.close_letters`, migration 0041) and a bulk send's
//! record ([`super::record_replays_sent`]) too, so no two of them wait on each other in a circle.

use super::list::Listing;
use super::{DeadLetter, ListFilter, Position, ReviewStatus};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

/// Which letters a chunk takes: the pending ones `filter` selects, written before `through`,
/// strictly after `after` in the newest-first order, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// The selection (its `status` is ignored: a chunk takes pending letters).
    pub filter: &'a ListFilter,
    /// Letters written at or after this are not taken.
    pub through: DateTime<Utc>,
    /// Where the walk stands.
    pub after: Option<Position>,
    /// The most letters.
    pub limit: i64,
}

impl Chunk<'_> {
    /// `select` (ending in `WHERE true`) narrowed to the chunk's letters, in order, locked.
    fn query(&self, select: &str) -> QueryBuilder<Postgres> {
        let filter = ListFilter {
            status: Some(ReviewStatus::PendingReview),
            ..self.filter.clone()
        };
        let mut list = Listing::new(QueryBuilder::new(select));
        filter.narrow(&mut list);
        list.test("created_at <", Some(self.through));
        let after = self.after.map(|a| (a.created_at, a.id));
        let limit = u32::try_from(self.limit.max(0)).unwrap_or(u32::MAX);
        let mut q = list.page("created_at", after, limit);
        q.push(" FOR UPDATE");
        q
    }
}

/// What a reviewed chunk did: letters reviewed, and the position of its last (oldest) letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkDone {
    /// Letters reviewed.
    pub reviewed: i64,
    /// Where the walk stands after it; `None` if the chunk was empty.
    pub last: Option<Position>,
}

/// Discards the chunk's letters with `reason`, reviewed by `actor` at `now` for `operation`.
pub async fn discard_chunk(
    conn: &mut PgConnection,
    chunk: Chunk<'_>,
    reason: &str,
    actor: &str,
    operation: Uuid,
    now: DateTime<Utc>,
) -> sqlx::Result<ChunkDone> {
    // Dynamic: only the set filters, so each combination gets a plan for its own index.
    let mut q =
        chunk.query("WITH chunk AS (SELECT id, created_at FROM core.dead_letters WHERE true");
    q.push("), done AS (UPDATE core.dead_letters d SET status = 'discarded', discard_reason = ")
        .push_bind(reason)
        .push(", reviewed_by = ")
        .push_bind(actor)
        .push(", reviewed_at = ")
        .push_bind(now)
        .push(", operation_id = ")
        .push_bind(operation)
        .push(
            " FROM chunk WHERE d.id = chunk.id RETURNING d.id)
             SELECT (SELECT count(*) FROM done),
                    last.created_at, last.id
             FROM (SELECT 1) one
             LEFT JOIN (SELECT created_at, id FROM chunk ORDER BY created_at, id LIMIT 1) last ON true",
        );
    let (reviewed, at, id): (i64, Option<DateTime<Utc>>, Option<Uuid>) =
        q.build_query_as().fetch_one(conn).await?;
    Ok(ChunkDone {
        reviewed,
        last: at
            .zip(id)
            .map(|(created_at, id)| Position { created_at, id }),
    })
}

/// A letter of a replay chunk, locked, with what its job's fence says.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ChunkLetter {
    /// The letter.
    #[sqlx(flatten)]
    pub letter: DeadLetter,
    /// Its job's fence exists (its effect committed: a replay sends nothing).
    pub fence_exists: bool,
    /// That fence is another job's (both digests known, not of one family of edits).
    pub fence_of_another_job: bool,
}

/// Locks the chunk's letters and reads each with its job's fence, newest first.
pub async fn lock_chunk(
    conn: &mut PgConnection,
    chunk: Chunk<'_>,
) -> sqlx::Result<Vec<ChunkLetter>> {
    // Dynamic: only the set filters, and `ChunkLetter` reads its letter by `#[sqlx(flatten)]`.
    let mut q = chunk.query(
        "SELECT d.*, p.job_id IS NOT NULL AS fence_exists,
                coalesce(d.job_digest IS NOT NULL AND p.job_id IS NOT NULL
                         AND NOT core.same_job(d.job_id, d.consumer, d.job_digest, p.payload_digest),
                         false) AS fence_of_another_job
         FROM (SELECT * FROM core.dead_letters WHERE true",
    );
    q.push(
        ") d LEFT JOIN core.processed_jobs p ON p.job_id = d.job_id AND p.consumer = d.consumer
         ORDER BY d.created_at DESC, d.id DESC",
    );
    q.build_query_as().fetch_all(conn).await
}

/// Marks letters `ids` replayed with their `outcomes` (`queued` or `already_processed`), with
/// `reason`, reviewed by `actor` at `now` for `operation`. Letters no longer pending are left.
pub async fn mark_replayed(
    conn: &mut PgConnection,
    ids: &[Uuid],
    outcomes: &[&str],
    reason: &str,
    actor: &str,
    operation: Uuid,
    now: DateTime<Utc>,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "UPDATE core.dead_letters d
         SET status = 'replayed', replay_outcome = v.outcome, replay_reason = $3,
             reviewed_by = $4, reviewed_at = $5, operation_id = $6
         FROM unnest($1::uuid[], $2::text[]) AS v(id, outcome)
         WHERE d.id = v.id AND d.status = 'pending_review'",
        ids,
        outcomes as _,
        reason,
        actor,
        now,
        operation,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The pending letters `filter` selects written before `through`, counted by error kind: each
/// kind's letters, and of those the ones without a job id.
pub async fn count_by_kind(
    db: impl sqlx::PgExecutor<'_>,
    filter: &ListFilter,
    through: DateTime<Utc>,
) -> sqlx::Result<Vec<(String, i64, i64)>> {
    let filter = ListFilter {
        status: Some(ReviewStatus::PendingReview),
        ..filter.clone()
    };
    // Dynamic: only the set filters, so each combination gets a plan for its own index.
    let mut list = Listing::new(QueryBuilder::new(
        "SELECT error_kind, count(*), count(*) FILTER (WHERE job_id IS NULL)
         FROM core.dead_letters WHERE true",
    ));
    filter.narrow(&mut list);
    list.test("created_at <", Some(through));
    let mut q = list.into_query();
    q.push(" GROUP BY error_kind ORDER BY error_kind");
    q.build_query_as().fetch_all(db).await
}
