//! The TTL sweep of `core.processed_jobs`.
//!
//! Invariants: a row is deleted only when its `expires_at` is before the injected `now` (the TTL
//! floor guarantees no copy of its job can still arrive) and before the oldest record still
//! received in the letters' intake (less an hour: its settle goes through its job's fence), no
//! dead letter of its job is pending
//! review (a replay of that letter must still find the fence, however late it comes), and no
//! replay of its job is queued (recorded but not yet sent: the send may come at any time, and
//! the job may have committed through an earlier send whose record was lost);
//! one sweep runs at a time (a lease row, `core.sweep_leases`, which works the same behind a
//! transaction pooler as on a session, where a session advisory lock does not; an overlapping
//! run steps aside at once instead of waiting), so the batches need no row locks; each batch
//! is one short statement, and consumers, which only insert fresh rows, never wait on a sweep.

use crate::clock::Clock;
use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// `sqlx::query!` of `$head`, then whether the fence `p` may go once expired, then `$tail`.
///
/// It may go when no letter of its job is pending review, and no replay of its job is queued.
/// Two anti-joins, each matching a partial index's predicate exactly
/// (`dead_letters_pending_job_idx`, `dead_letters_queued_job_idx`): one index probe each per
/// expired fence, however many letters there are. One probe with an `OR` in it could use
/// neither index. A macro, so that each statement is still one literal its query macro checks.
macro_rules! query_where_sweepable {
    ($head:literal, $tail:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head
                + "NOT EXISTS (SELECT 1 FROM core.dead_letters d
                               WHERE d.job_id = p.job_id AND d.consumer = p.consumer
                                 AND d.status = 'pending_review')
                   AND NOT EXISTS (SELECT 1 FROM core.dead_letters q
                                   WHERE q.job_id = p.job_id AND q.consumer = p.consumer
                                     AND q.replay_outcome = 'queued')"
                + $tail
            $(, $arg)*
        )
    };
}

/// Deletes up to `limit` fences that expired before `now`, oldest first, starting at `from`
/// (a keyset cursor, `None` for the start: the index scan skips what earlier batches deleted but vacuum has not yet
/// reclaimed). Returns how many, and the latest `expires_at` deleted (the next batch's `from`).
pub async fn sweep_expired(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    from: Option<DateTime<Utc>>,
    limit: i64,
) -> sqlx::Result<(u64, Option<DateTime<Utc>>)> {
    let gone = query_where_sweepable!(
        "WITH gone AS (
             DELETE FROM core.processed_jobs
             WHERE ctid IN (SELECT ctid FROM core.processed_jobs p
                            WHERE expires_at >= coalesce($3::timestamptz, '-infinity')
                              AND expires_at < $1
                              AND ",
        r#"
                            ORDER BY expires_at LIMIT $2)
             RETURNING expires_at)
         SELECT count(*) AS "deleted!", max(expires_at) AS "last?" FROM gone"#,
        now,
        limit,
        from,
    )
    .fetch_one(db)
    .await?;
    Ok((gone.deleted as u64, gone.last))
}

/// The sweepable fence that expires first: (`processed_at`, `expires_at`), if any. Fences kept
/// for a letter pending review or a queued replay are not backlog.
pub(crate) async fn oldest_fence(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<Option<(DateTime<Utc>, DateTime<Utc>)>> {
    let oldest = query_where_sweepable!(
        "SELECT processed_at, expires_at FROM core.processed_jobs p
         WHERE ",
        "
         ORDER BY expires_at LIMIT 1",
    )
    .fetch_optional(db)
    .await?;
    Ok(oldest.map(|f| (f.processed_at, f.expires_at)))
}

/// Why a sweep stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepStop {
    /// A batch came back short: nothing more has expired.
    Done,
    /// The time budget ran out.
    Budget,
    /// The Lambda deadline is near.
    Deadline,
    /// Another sweep is running (it holds the sweep lease); this one stepped aside, at once or
    /// when it found its lease taken over.
    Busy,
}

/// What one sweep did.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepReport {
    /// Fences deleted.
    pub deleted: u64,
    /// Statements run.
    pub batches: u32,
    /// Why it stopped.
    pub stop: SweepStop,
    /// Age of the oldest fence left (`now - processed_at`), if any.
    pub oldest_age: Option<Duration>,
    /// How far past its expiry the most overdue fence left is (zero when caught up).
    pub backlog: Duration,
}

/// How a sweep is bounded.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// Rows per statement.
    pub batch_size: i64,
    /// Stop after this long.
    pub budget: Duration,
    /// Rest between batches, so consumers on the same database keep their share of it.
    pub pause: Duration,
    /// Execution-ledger rows untouched for this long are removed (the fence TTL).
    pub ledger_ttl: Duration,
}

/// The lease row sweeps of fences take turns on (`core.sweep_leases`).
const SWEEP_LEASE: &str = "fences";

/// How long a sweep's lease holds from its last renewal: each batch renews it, so it only has
/// to outlast one batch. A sweep that died blocks the next for at most this long.
const LEASE_HOLD: Duration = Duration::from_secs(60);

/// Deletes expired fences batch by batch until a short batch, the budget or `deadline`
/// (wall time; `None` for no deadline). `now` comes from `clock` once, at the start. If another
/// sweep holds the lease, returns at once with [`SweepStop::Busy`].
pub async fn sweep(
    pool: &PgPool,
    clock: &dyn Clock,
    settings: SweepSettings,
    deadline: Option<Instant>,
) -> sqlx::Result<SweepReport> {
    let mut conn = crate::db::acquire(pool).await?;
    let swept = sweep_on(&mut conn, clock, settings, deadline).await;
    conn.give_back();
    swept
}

/// [`sweep`] on `conn`.
async fn sweep_on(
    conn: &mut sqlx::PgConnection,
    clock: &dyn Clock,
    settings: SweepSettings,
    deadline: Option<Instant>,
) -> sqlx::Result<SweepReport> {
    let holder = Uuid::new_v4();
    if !hold_lease(&mut *conn, holder).await? {
        return report(conn, clock.now(), 0, 0, SweepStop::Busy).await;
    }
    let swept = sweep_leased(conn, holder, clock, settings, deadline).await;
    let reported = match &swept {
        Ok((deleted, batches, stop)) => {
            Some(report(conn, clock.now(), *deleted, *batches, *stop).await)
        }
        Err(_) => None,
    };
    // A lease not given back lapses by itself; the sweep's own result comes first.
    let _ = give_back_lease(&mut *conn, holder).await;
    swept?;
    reported.expect("reported when swept")
}

/// Takes the sweep lease for `holder`, or renews it, for [`LEASE_HOLD`]: whether `holder` holds
/// it now (not if another holder's lease has not lapsed). One statement, so it is the same
/// behind a transaction pooler as on a session.
async fn hold_lease(db: impl PgExecutor<'_>, holder: Uuid) -> sqlx::Result<bool> {
    let held: Option<Uuid> = sqlx::query_scalar!(
        "INSERT INTO core.sweep_leases AS l (name, holder, until)
         VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond')
         ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until
             WHERE l.holder = EXCLUDED.holder OR l.until < clock_timestamp()
         RETURNING holder",
        SWEEP_LEASE,
        holder,
        LEASE_HOLD.as_millis() as i64,
    )
    .fetch_optional(db)
    .await?;
    Ok(held.is_some())
}

async fn give_back_lease(db: impl PgExecutor<'_>, holder: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM core.sweep_leases WHERE name = $1 AND holder = $2",
        SWEEP_LEASE,
        holder,
    )
    .execute(db)
    .await
    .map(drop)
}

async fn sweep_leased(
    conn: &mut sqlx::PgConnection,
    holder: Uuid,
    clock: &dyn Clock,
    settings: SweepSettings,
    deadline: Option<Instant>,
) -> sqlx::Result<(u64, u32, SweepStop)> {
    let now = clock.now();
    // A fence may outlive its TTL for a record still received in the letters' intake: its
    // settle goes through the fence, and must find it. A fence that expired before the oldest
    // such record came had outlived every copy of its job.
    let cutoff = match crate::dead_letter::oldest_received(&mut *conn).await? {
        Some(oldest) => now.min(oldest - chrono::Duration::hours(1)),
        None => now,
    };
    let started = Instant::now();
    let (mut deleted, mut batches) = (0, 0);
    let mut from = None;
    let stop = loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break SweepStop::Deadline;
        }
        if started.elapsed() >= settings.budget {
            break SweepStop::Budget;
        }
        // The lease taken covers the first batch; each later one renews it first. Lost (a batch
        // outlasted the lease and another sweep took it): that sweep goes on, this one stops.
        if batches > 0 && !hold_lease(&mut *conn, holder).await? {
            break SweepStop::Busy;
        }
        let (n, last) = sweep_expired(&mut *conn, cutoff, from, settings.batch_size).await?;
        deleted += n;
        batches += 1;
        if n < settings.batch_size as u64 {
            break SweepStop::Done;
        }
        from = last.or(from);
        tokio::time::sleep(settings.pause).await;
    };
    if stop == SweepStop::Done {
        // Ledger rows of jobs that never finished (their messages expired long ago): older than
        // a fence TTL, nothing can still read them. One bounded batch per run.
        let ttl = chrono::Duration::from_std(settings.ledger_ttl).unwrap_or(chrono::Duration::MAX);
        let stale = now
            .checked_sub_signed(ttl)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        crate::ledger::sweep_stale_ledgers(&mut *conn, stale, settings.batch_size).await?;
    }
    Ok((deleted, batches, stop))
}

async fn report(
    conn: &mut sqlx::PgConnection,
    now: DateTime<Utc>,
    deleted: u64,
    batches: u32,
    stop: SweepStop,
) -> sqlx::Result<SweepReport> {
    let oldest = oldest_fence(conn).await?;
    let age = |t: DateTime<Utc>| (now - t).to_std().unwrap_or_default();
    Ok(SweepReport {
        deleted,
        batches,
        stop,
        oldest_age: oldest.map(|(processed, _)| age(processed)),
        backlog: oldest.map(|(_, expires)| age(expires)).unwrap_or_default(),
    })
}
