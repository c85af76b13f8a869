//! The idempotency fence, `core.processed_jobs`.
//!
//! Invariant: the fence is claimed first inside the work's transaction ([`open_job`] and
//! [`open_jobs`] claim it and open the transaction in one round trip; [`claim_job_fence`] in
//! a transaction already open). The row commits with the
//! work, so a committed fence means committed work and vice versa. A concurrent copy of the same
//! job blocks on the row until the holder commits (then sees a duplicate) or rolls back (then
//! claims it); `lock_timeout` bounds that wait.

mod claim;
mod job;
mod lookup;

pub use claim::*;
pub use job::*;
pub use lookup::*;

use crate::retry::RetryPolicy;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// Extra time a fence outlives every copy of its job that can still arrive.
pub(crate) const TTL_MARGIN: Duration = Duration::from_secs(24 * 60 * 60);

/// PostgreSQL's `lock_not_available`, raised when `lock_timeout` expires.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The result of trying to claim a job's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceClaim {
    /// This transaction holds the fence; do the work and commit.
    Claimed,
    /// The job was already processed by this consumer: ack and skip.
    Duplicate,
    /// A job was already processed under this id, but another one: what makes it up (its
    /// [`JobDigest`]) differs. Nothing runs; the copy becomes a `conflict` letter.
    Conflict,
}

/// Why the fence could not be claimed or refused.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Another transaction holds this job's fence and did not finish within the lock timeout.
    #[error("a concurrent copy of the job holds its fence")]
    Contended,
    /// Any other database failure.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The shortest fence TTL that is safe: it outlives every copy of a job that can still arrive,
/// by every path a copy takes, with some margin:
/// - by the job queue: up to its retention after the send (the retry window lies within it);
/// - by the DLQ: up to the DLQ's retention after the *original* send (a standard queue's
///   redrive keeps the message's enqueue time);
/// - by a redrive of the DLQ back to its source (SQS's DLQ redrive, or an operator moving the
///   messages): the moved message is a new one, sent again at the end of the DLQ's retention at
///   the latest, and from then on it can arrive by the job queue (its retention) or, failing
///   again, by the DLQ (its retention, counted from that new send).
///
/// So: DLQ retention + the longer of the two retentions + the retry window + [`TTL_MARGIN`].
///
/// A FIFO queue's DLQ resets a message's enqueue time when it moves it (SQS documents it), so
/// its DLQ stay counts from the move, not the send: a copy lives up to the queue's retention,
/// then the DLQ's, and redriven back, both again. So with `fifo`: twice (queue retention + DLQ
/// retention) + the retry window + [`TTL_MARGIN`].
/// (A second move back is not covered: replay letters instead, which checks the fence.)
pub fn ttl_floor(
    queue_retention: Duration,
    dlq_retention: Duration,
    policy: &RetryPolicy,
    fifo: bool,
) -> Duration {
    let one_life = if fifo {
        queue_retention + dlq_retention
    } else {
        dlq_retention
    };
    let after_a_redrive = if fifo {
        queue_retention + dlq_retention
    } else {
        queue_retention.max(dlq_retention)
    };
    one_life + after_a_redrive + policy.max_retry_window() + TTL_MARGIN
}

/// How old (from its own send) a copy of a job may be for its fence to be still there if the
/// job committed: a fence lives `ttl` from its commit, which came after the send. An older copy
/// cannot be settled through the fence (see [`crate::dead_letter::ErrorKind::Unsettled`]).
pub(crate) fn settle_horizon(ttl: Duration) -> Duration {
    ttl.saturating_sub(TTL_MARGIN)
}

/// Whether `e` is a bounded lock wait that ran out (`lock_not_available`).
pub fn is_lock_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == LOCK_NOT_AVAILABLE)
}

/// A fence's `expires_at`: `now + ttl`, saturating.
fn expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
}

/// A claim's bounded wait as the claim functions take it (a `lock_timeout` value, at least 1 ms:
/// 0 would mean no bound).
pub(crate) fn lock_wait(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

/// A claim that ran out of its wait is contended; anything else is the database's error.
pub(crate) fn claim_error(e: sqlx::Error) -> FenceError {
    if is_lock_timeout(&e) {
        FenceError::Contended
    } else {
        FenceError::Database(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_floor_fits_under_the_default_ttl_of_fourteen_days() {
        let floor = ttl_floor(
            Duration::from_secs(4 * 86_400),
            Duration::from_secs(5 * 86_400),
            &RetryPolicy::default(),
            false,
        );
        assert_eq!(floor, Duration::from_secs(11 * 86_400 + 675));
        assert!(floor < Duration::from_secs(14 * 86_400));
    }

    /// Issue 34, item 4: a FIFO queue's DLQ resets the enqueue time on the move, so each stay
    /// counts from it: the queue's retention, the DLQ's, and both again after a redrive back.
    #[test]
    fn a_fifo_floor_counts_each_dlq_stay_from_the_move() {
        let (queue, dlq) = (
            Duration::from_secs(4 * 86_400),
            Duration::from_secs(5 * 86_400),
        );
        let floor = ttl_floor(queue, dlq, &RetryPolicy::default(), true);
        assert_eq!(floor, Duration::from_secs(19 * 86_400 + 675));
        assert!(floor > ttl_floor(queue, dlq, &RetryPolicy::default(), false));
        assert!(
            floor < Duration::from_secs(21 * 86_400),
            "the FIFO default TTL"
        );
    }
}
