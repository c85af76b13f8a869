//! Reviewing dead letters: the one write the table allows, the transition
//! `pending_review → replayed | discarded`.
//!
//! Invariant: a letter leaves `pending_review` once. A review locks the row (`FOR UPDATE`, with a
//! bounded wait) and reads its status under the lock, so of two concurrent reviews of one letter
//! exactly one sees it pending; the other sees the winner's status. Nothing here sends anything:
//! a replay commits its verdict first and sends after ([`record_replay_sent`]), so no message
//! is ever out while its letter could still be discarded or left pending.

use super::{DeadLetter, ReplayOutcome, ReviewStatus};
use crate::ids::DeadLetterId;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor, PgPool, Postgres, Transaction};
use std::time::Duration;
use uuid::Uuid;

/// Whether `letter`'s job already has a fence for its consumer (a replay is then a no-op).
/// `None` for a letter without a job id.
pub async fn letter_fence_exists(
    db: impl PgExecutor<'_>,
    letter: &DeadLetter,
) -> sqlx::Result<Option<bool>> {
    let Some(job_id) = letter.job_id else {
        return Ok(None);
    };
    crate::fence::fence_exists(db, job_id, &letter.consumer)
        .await
        .map(Some)
}

/// Whether the fence of `letter`'s job id stands for another job than the letter's: both
/// digests known, and neither equal nor of one family of edits (`core.same_job`: a producer
/// reused the id, and the other job committed).
pub async fn fence_is_another_job(
    db: impl PgExecutor<'_>,
    letter: &DeadLetter,
) -> sqlx::Result<bool> {
    let (Some(job_id), Some(digest)) = (letter.job_id, letter.job_digest.as_deref()) else {
        return Ok(false);
    };
    let another = sqlx::query_scalar!(
        r#"SELECT NOT core.same_job($1, $2, $3, payload_digest) AS "another!"
         FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2"#,
        job_id.0,
        letter.consumer.as_str(),
        digest,
    )
    .fetch_optional(db)
    .await?;
    Ok(another == Some(true))
}

/// How a review closes a letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Replayed: queued for sending, or found already processed (nothing to send).
    Replayed {
        /// What the replay does.
        outcome: ReplayOutcome,
        /// Why, if the operator said (a bulk replay always does; an edit must).
        reason: Option<String>,
        /// The edited envelope to send instead of the body received (an edited replay).
        body: Option<String>,
    },
    /// Closed, with the reason the schema requires.
    Discarded {
        /// Why; not blank.
        reason: String,
    },
}

/// A letter locked for review inside an open transaction. Dropping it rolls back.
pub struct LockedLetter {
    tx: Transaction<'static, Postgres>,
    /// The letter as read under the lock.
    pub letter: DeadLetter,
}

/// Begins a review of `id`: locks the row, waiting at most `lock_wait` for a concurrent review.
/// `Ok(None)` if there is no such letter; a wait that runs out is a `lock_not_available` error
/// (see [`is_lock_timeout`]).
pub async fn lock_letter(
    pool: &PgPool,
    id: DeadLetterId,
    lock_wait: Duration,
) -> sqlx::Result<Option<LockedLetter>> {
    let mut tx = crate::db::begin(pool).await?;
    sqlx::query!(
        "SELECT set_config('lock_timeout', $1, true)",
        format!("{}ms", lock_wait.as_millis().max(1)),
    )
    .fetch_one(&mut *tx)
    .await?;
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    let letter: Option<DeadLetter> =
        sqlx::query_as("SELECT * FROM core.dead_letters WHERE id = $1 FOR UPDATE")
            .bind(id.0)
            .fetch_optional(&mut *tx)
            .await?;
    Ok(letter.map(|letter| LockedLetter { tx, letter }))
}

impl LockedLetter {
    /// The letter's status.
    pub fn status(&self) -> ReviewStatus {
        self.letter.status
    }

    /// [`letter_fence_exists`] for the locked letter, inside the review's transaction.
    pub async fn fence_exists(&mut self) -> sqlx::Result<Option<bool>> {
        letter_fence_exists(&mut *self.tx, &self.letter).await
    }

    /// [`fence_is_another_job`] for the locked letter, inside the review's transaction.
    pub async fn fence_is_another_job(&mut self) -> sqlx::Result<bool> {
        fence_is_another_job(&mut *self.tx, &self.letter).await
    }

    /// Writes the verdict (not yet committed) and returns the letter as it now reads.
    pub async fn mark(
        &mut self,
        verdict: &Verdict,
        actor: &str,
        now: DateTime<Utc>,
    ) -> sqlx::Result<&DeadLetter> {
        // An edit is digested as the harness will digest it, so the letter's body and its edit
        // are one job's (`core.job_family`).
        let edit_digest = match verdict {
            Verdict::Replayed {
                body: Some(body), ..
            } => self.letter.digest_of_body(body),
            _ => None,
        };
        let id = self.letter.id.0;
        self.letter = mark_reviewed(&mut self.tx, id, verdict, edit_digest, actor, now).await?;
        Ok(&self.letter)
    }

    /// Commits the review; returns the letter.
    pub async fn commit(self) -> sqlx::Result<DeadLetter> {
        self.tx.commit().await?;
        Ok(self.letter)
    }
}

/// The columns a verdict sets: status, discard reason, replay outcome, reason and body.
type VerdictColumns<'a> = (
    ReviewStatus,
    Option<&'a str>,
    Option<&'static str>,
    Option<&'a str>,
    Option<&'a str>,
);

impl Verdict {
    fn columns(&self) -> VerdictColumns<'_> {
        match self {
            Verdict::Replayed {
                outcome,
                reason,
                body,
            } => (
                ReviewStatus::Replayed,
                None,
                Some(outcome.as_str()),
                reason.as_deref(),
                body.as_deref(),
            ),
            Verdict::Discarded { reason } => (
                ReviewStatus::Discarded,
                Some(reason.as_str()),
                None,
                None,
                None,
            ),
        }
    }
}

async fn mark_reviewed(
    conn: &mut PgConnection,
    id: Uuid,
    verdict: &Verdict,
    edit_digest: Option<crate::envelope::JobDigest>,
    actor: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<DeadLetter> {
    let (status, discard_reason, outcome, replay_reason, replay_body) = verdict.columns();
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as(
        "UPDATE core.dead_letters
         SET status = $2, discard_reason = $3, reviewed_by = $4, reviewed_at = $5,
             replay_outcome = $6, replay_reason = $7, replay_body = $8, replay_digest = $9
         WHERE id = $1
         RETURNING *",
    )
    .bind(id)
    .bind(status.as_str())
    .bind(discard_reason)
    .bind(actor)
    .bind(now)
    .bind(outcome)
    .bind(replay_reason)
    .bind(replay_body)
    .bind(edit_digest.as_ref().map(|d| d.0.as_slice()))
    .fetch_one(conn)
    .await
}

/// Records that the queue accepted a queued replay as `message_id`; returns the letter as it
/// now reads, or `None` if it was not a queued replay (another sender recorded it first).
pub async fn record_replay_sent(
    db: impl PgExecutor<'_>,
    id: DeadLetterId,
    message_id: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<DeadLetter>> {
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as(
        "UPDATE core.dead_letters
         SET replay_outcome = 'sent', replay_message_id = $2, replay_sent_at = $3
         WHERE id = $1 AND replay_outcome = 'queued'
         RETURNING *",
    )
    .bind(id.0)
    .bind(message_id)
    .bind(now)
    .fetch_optional(db)
    .await
}

/// Records that the queue accepted the queued replays of letters `ids` as `messages` (pairwise),
/// and counts them in bulk `operation`'s `sent` in the same statement; the letters
/// recorded. Letters whose replay is no longer queued (another sender recorded it, or it was
/// withdrawn) are left.
///
/// The letters are locked before any is updated, newest first (created_at DESC, id DESC: the
/// order every statement that locks several letters takes them in, a bulk chunk's page and a
/// commit closing its jobs' letters too): two senders recording overlapping letters (a worker's
/// call, and another worker resending what it found queued) otherwise each locked theirs in
/// their own order and deadlocked. One statement, so a sender cut off while it waits leaves no
/// transaction open behind it.
pub async fn record_replays_sent(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
    messages: &[String],
    now: DateTime<Utc>,
    operation: Uuid,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"WITH locked AS (
             SELECT id FROM core.dead_letters
             WHERE id = ANY($1) AND replay_outcome = 'queued'
             ORDER BY created_at DESC, id DESC FOR UPDATE),
         sent AS (
             UPDATE core.dead_letters d
             SET replay_outcome = 'sent', replay_message_id = v.message_id, replay_sent_at = $3
             FROM unnest($1::uuid[], $2::text[]) AS v(id, message_id), locked
             WHERE d.id = v.id AND locked.id = v.id AND d.replay_outcome = 'queued'
             RETURNING d.id),
         counted AS (
             UPDATE core.dead_letter_operations
             SET sent = sent + (SELECT count(*) FROM sent), updated_at = $3
             WHERE id = $4)
         SELECT count(*) AS "recorded!" FROM sent"#,
        ids,
        messages,
        now,
        operation,
    )
    .fetch_one(db)
    .await
}

/// What withdrawing a queued replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// Withdrawn; the job is pending review again as this new letter, linked to the first.
    Withdrawn(DeadLetterId),
    /// Withdrawn, and the job's fence shows it committed (the replay reached its queue after
    /// all, or a copy ran): no letter, nothing to review.
    AlreadyProcessed,
    /// The letter has no queued replay (none, sent, or withdrawn: a send or another withdrawal
    /// won). Nothing changed.
    NotQueued,
}

/// Withdraws letter `id`'s queued replay (a replay no queue has accepted, which an operator
/// takes back: the queue is gone, or SQS refuses the message) and, unless the job committed,
/// writes it back to review as a new pending letter linked to it, in one transaction settled
/// through the job's fence (`core.withdraw_replay`).
pub async fn withdraw_replay(
    db: impl PgExecutor<'_>,
    id: DeadLetterId,
    actor: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Withdrawal> {
    let row = sqlx::query!(
        r#"SELECT outcome AS "outcome!", pending_letter AS "pending_letter?"
           FROM core.withdraw_replay($1, $2, $3, $4)"#,
        id.0,
        actor,
        reason,
        now,
    )
    .fetch_one(db)
    .await?;
    Ok(match (row.outcome.as_str(), row.pending_letter) {
        ("withdrawn", Some(pending)) => Withdrawal::Withdrawn(DeadLetterId(pending)),
        ("already_processed", _) => Withdrawal::AlreadyProcessed,
        _ => Withdrawal::NotQueued,
    })
}

/// Replays recorded before `before` whose message no queue has accepted yet, oldest first.
pub async fn queued_replays(
    db: impl PgExecutor<'_>,
    before: DateTime<Utc>,
    limit: i64,
) -> sqlx::Result<Vec<DeadLetter>> {
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    sqlx::query_as(
        "SELECT * FROM core.dead_letters
         WHERE replay_outcome = 'queued' AND reviewed_at < $1
         ORDER BY reviewed_at LIMIT $2",
    )
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Whether `error` is a lock wait that ran out (SQLSTATE `55P03`): another review holds the row.
pub fn is_lock_timeout(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}
