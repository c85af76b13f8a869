//! The send state of replays recorded but not yet accepted by their queue
//! (`replay_outcome = queued`), in `core.replay_sends`: a row per such replay, created with the
//! review that queues it and removed with the record that the queue took it (triggers, whichever
//! code does either), so the letters' append-only guard stays as it is.
//!
//! Invariant: a refused replay backs off on its own (its attempts, its last error, its next
//! attempt: [`send_backoff`]), and only a replay that was tried is recorded. The scheduled run
//! takes the ones due longest first ([`due_replays`]), so a replay that can never be sent is
//! tried less and less often and never keeps the others from being sent: once refused, its next
//! attempt is later than that of every replay due but not tried in the same run, which is left
//! as it was. One unsent past a bound is counted ([`unsent`]) and paged per queue
//! ([`crate::unsent_replays`]).

use crate::dead_letter::DeadLetter;
use crate::ids::DeadLetterId;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use std::time::Duration;

/// The wait after a queued replay's first refused send by the scheduled run; each refusal
/// doubles it, up to [`SEND_BACKOFF_CAP`].
pub(crate) const SEND_BACKOFF_BASE: Duration = Duration::from_secs(60);
/// The longest wait between two sends of a queued replay.
pub(crate) const SEND_BACKOFF_CAP: Duration = Duration::from_secs(3_600);

/// The wait after the `attempts`-th refused send: 1, 2, 4, … minutes, at most an hour.
pub(crate) fn send_backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    SEND_BACKOFF_BASE
        .saturating_mul(1 << doublings)
        .min(SEND_BACKOFF_CAP)
}

/// Where a queued replay's sending stands (`core.replay_sends`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SendState {
    /// The letter whose replay it is.
    pub letter_id: DeadLetterId,
    /// Where it goes.
    pub queue: String,
    /// When the replay was recorded.
    pub queued_at: DateTime<Utc>,
    /// It is not tried before this.
    pub next_attempt_at: DateTime<Utc>,
    /// Sends the queue refused.
    pub attempts: i32,
    /// The last refusal.
    pub last_error: Option<String>,
    /// When it was last tried.
    pub last_attempt_at: Option<DateTime<Utc>>,
}

/// The send state of `letter`'s replay, while it is queued.
pub async fn send_state(
    db: impl PgExecutor<'_>,
    letter: DeadLetterId,
) -> sqlx::Result<Option<SendState>> {
    sqlx::query_as!(
        SendState,
        r#"SELECT letter_id AS "letter_id: DeadLetterId", queue, queued_at, next_attempt_at,
                  attempts, last_error, last_attempt_at
           FROM core.replay_sends WHERE letter_id = $1"#,
        letter.0,
    )
    .fetch_optional(db)
    .await
}

/// A queued replay due for a send, with its letter.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DueReplay {
    /// The letter.
    #[sqlx(flatten)]
    pub letter: DeadLetter,
    /// Sends the queue refused so far.
    pub send_attempts: i32,
    /// When it was due.
    pub send_due_at: DateTime<Utc>,
}

/// Where a scan of due replays stands: the last replay taken, by the scan's order (when it was
/// due, then its letter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DueAfter(DateTime<Utc>, DeadLetterId);

impl DueReplay {
    /// The scan's position once this replay is taken: the next page starts after it.
    pub fn position(&self) -> DueAfter {
        DueAfter(self.send_due_at, self.letter.id)
    }
}

/// Up to `limit` queued replays due at `now` and recorded before `recorded_before`, after
/// `after` and none to `except_queues`, the one due longest first: a replay the queue keeps
/// refusing waits out its backoff behind the others, and the queues that refused a replay in
/// this run (`except_queues`) take no room from the others' replays.
pub(crate) async fn due_replays(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    recorded_before: DateTime<Utc>,
    after: Option<DueAfter>,
    except_queues: &[String],
    limit: i64,
) -> sqlx::Result<Vec<DueReplay>> {
    // Dynamic: `DueReplay` reads its letter by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as(
        "SELECT d.*, s.attempts AS send_attempts, s.next_attempt_at AS send_due_at
         FROM core.replay_sends s JOIN core.dead_letters d ON d.id = s.letter_id
         WHERE s.next_attempt_at <= $1 AND s.queued_at < $2 AND d.replay_outcome = 'queued'
           AND ($3::timestamptz IS NULL OR (s.next_attempt_at, s.letter_id) > ($3, $4::uuid))
           AND s.queue <> ALL ($5)
         ORDER BY s.next_attempt_at, s.letter_id
         LIMIT $6",
    )
    .bind(now)
    .bind(recorded_before)
    .bind(after.map(|DueAfter(due, _)| due))
    .bind(after.map(|DueAfter(_, letter)| letter.0))
    .bind(except_queues)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Records that the queue refused `letter`'s replay at `now` (its `attempts`-th refusal) with
/// `error`; it is due again after [`send_backoff`]. Only for a replay that was tried: one left
/// untried keeps its attempts and its place.
pub(crate) async fn record_send_refused(
    db: impl PgExecutor<'_>,
    letter: DeadLetterId,
    attempts: u32,
    error: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let next = now + chrono::Duration::from_std(send_backoff(attempts)).unwrap_or_default();
    let error = crate::dead_letter::storable_error(error);
    sqlx::query!(
        "UPDATE core.replay_sends
         SET attempts = $2, last_error = $3, last_attempt_at = $4, next_attempt_at = $5
         WHERE letter_id = $1",
        letter.0,
        i32::try_from(attempts).unwrap_or(i32::MAX),
        &*error,
        now,
        next,
    )
    .execute(db)
    .await
    .map(drop)
}

/// What waits to be sent at `now`: the replays queued, how long the oldest has waited, and how
/// many have waited longer than `bound` (those alert).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsent {
    /// Replays queued.
    pub queued: i64,
    /// How long the oldest of them has waited.
    pub oldest: Duration,
    /// Of those, queued longer than the bound.
    pub overdue: i64,
}

/// The [`Unsent`] replays at `now`, with `bound`.
pub async fn unsent(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    bound: Duration,
) -> sqlx::Result<Unsent> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "queued!", count(*) FILTER (WHERE queued_at < $1) AS "overdue!",
                  min(queued_at) AS "oldest?"
           FROM core.replay_sends"#,
        overdue_before(now, bound),
    )
    .fetch_one(db)
    .await?;
    Ok(Unsent {
        queued: row.queued,
        overdue: row.overdue,
        oldest: row
            .oldest
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default(),
    })
}

/// Replays recorded before this are past `bound` at `now`.
pub(crate) fn overdue_before(now: DateTime<Utc>, bound: Duration) -> DateTime<Utc> {
    now.checked_sub_signed(chrono::Duration::from_std(bound).unwrap_or(chrono::Duration::MAX))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The replays of one queue unsent past the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnsentQueue {
    /// The queue.
    pub queue: String,
    /// Its replays queued past the bound.
    pub replays: i64,
    /// When the oldest was recorded.
    pub oldest: DateTime<Utc>,
    /// The most sends any of them was refused.
    pub attempts: i32,
    /// The latest refusal.
    pub last_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_replay_waits_twice_as_long_each_time_up_to_an_hour() {
        let minutes: Vec<u64> = (1..=9).map(|n| send_backoff(n).as_secs() / 60).collect();
        assert_eq!(minutes, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(send_backoff(0), SEND_BACKOFF_BASE);
        assert_eq!(send_backoff(u32::MAX), SEND_BACKOFF_CAP);
    }
}
