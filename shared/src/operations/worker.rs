//! The worker of bulk operations: [`Leased`] work on the lease-and-loop driver. A claimed
//! operation is worked chunk by chunk until the round's time is spent, each chunk one transaction
//! (see the module's invariants), and a replay chunk's messages sent after its commit in
//! `SendMessageBatch` calls.

use super::{Action, OperationRow, Progress};
use crate::clock::Clock;
use crate::dead_letter::{
    Chunk, ChunkLetter, DeadLetter, Position, discard_chunk, lock_chunk, mark_replayed,
    record_replays_sent,
};
use crate::lease::{LEASE, Lease, Leased};
use crate::replay::{Refusal, Replayer, letter_body, refused_by_sqs, replayable};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// Letters a discard chunk reviews: one statement, so the most a chunk may hold its rows.
const DISCARD_CHUNK: i64 = 1_000;
/// Letters a replay chunk reviews: their bodies are read, and sent ten to a call.
const REPLAY_CHUNK: i64 = 200;
/// `SendMessageBatch` calls a replay chunk has in flight at once.
const CALLS_IN_FLIGHT: usize = 4;
/// The longest a chunk waits for a letter's lock (a one-letter review holding it).
const CHUNK_LOCK_WAIT: &str = "5s";
/// A chunk is not started with less than this left of the round.
const CHUNK_MARGIN: Duration = Duration::from_secs(5);

/// What operations are worked with.
pub struct OperationTools {
    /// The database.
    pub pool: PgPool,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Sends replays; `None` leaves a replay operation unworked (a function without SQS).
    pub replayer: Option<Replayer>,
}

/// The bulk operations, as leased work.
pub struct Operations;

/// A claimed operation.
pub struct Claimed(OperationRow);

/// What working an operation for a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Worked {
    /// Chunks committed.
    pub chunks: u64,
    /// Letters those chunks worked.
    pub letters: i64,
    /// The operation is done (every letter it selected was worked) or was cancelled.
    pub ended: bool,
}

/// Why a round could not work an operation: it is retried after a backoff.
#[derive(Debug)]
pub enum OperationError {
    /// The database failed (a lock wait that ran out included).
    Database(sqlx::Error),
    /// A replay operation without an SQS client.
    NoReplayer,
    /// The queue refused the operation's replays: it is not worked further until they go.
    QueueRefused(String),
}

impl fmt::Display for OperationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Database(e) => write!(f, "database: {e}"),
            Self::NoReplayer => f.write_str("a replay operation needs an SQS client"),
            Self::QueueRefused(e) => write!(f, "the queue refused the operation's replays: {e}"),
        }
    }
}

impl From<sqlx::Error> for OperationError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

impl Leased for Operations {
    type Step = Claimed;
    type Sent = Worked;
    type Client = OperationTools;
    type Error = OperationError;
    type Done = Worked;
    const KIND: &'static str = "bulk operation";

    /// Running operations due and held by no worker, the oldest first.
    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<Claimed>> {
        // Dynamic: `OperationRow` reads its progress by `#[sqlx(flatten)]`.
        let rows: Vec<OperationRow> = sqlx::query_as(
            "UPDATE core.dead_letter_operations SET claimed_until = $2
             WHERE id IN (SELECT id FROM core.dead_letter_operations
                          WHERE status = 'running' AND next_attempt_at <= $1
                            AND (claimed_until IS NULL OR claimed_until < $1)
                          ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
             RETURNING *",
        )
        .bind(lease.now)
        .bind(lease.until)
        .bind(limit)
        .fetch_all(conn)
        .await?;
        Ok(rows.into_iter().map(Claimed).collect())
    }

    /// Sends what a killed worker (or a refusing queue) left queued, then works chunks while a
    /// whole one fits in `budget`.
    async fn send(
        &self,
        tools: &OperationTools,
        claimed: &Claimed,
        budget: Duration,
    ) -> Result<Worked, OperationError> {
        let until = Instant::now() + budget;
        let op = &claimed.0;
        if op.action == Action::Replay {
            let replayer = tools.replayer.as_ref().ok_or(OperationError::NoReplayer)?;
            send_left_queued(tools, replayer, op.id).await?;
        }
        let mut worked = Worked::default();
        while until.saturating_duration_since(Instant::now()) > CHUNK_MARGIN {
            match work_chunk(tools, op).await? {
                Some(letters) => {
                    worked.chunks += 1;
                    worked.letters += letters;
                }
                None => {
                    worked.ended = true;
                    break;
                }
            }
        }
        Ok(worked)
    }

    async fn record(
        &self,
        pool: &PgPool,
        claimed: &Claimed,
        worked: Worked,
        _now: DateTime<Utc>,
    ) -> sqlx::Result<Worked> {
        sqlx::query!(
            "UPDATE core.dead_letter_operations
             SET claimed_until = NULL, failures = 0, last_error = NULL
             WHERE id = $1",
            claimed.0.id,
        )
        .execute(pool)
        .await?;
        Ok(worked)
    }

    async fn release(
        &self,
        pool: &PgPool,
        claimed: &Claimed,
        error: Option<&OperationError>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<()> {
        let error = error.map(|e| crate::dead_letter::storable_error(&e.to_string()).into_owned());
        let retry = error
            .as_ref()
            .map(|_| crate::paging::retry_at(now, claimed.0.failures));
        sqlx::query!(
            "UPDATE core.dead_letter_operations
             SET claimed_until = NULL,
                 failures = failures + CASE WHEN $2::text IS NULL THEN 0 ELSE 1 END,
                 last_error = coalesce($2, last_error),
                 next_attempt_at = coalesce($3, next_attempt_at)
             WHERE id = $1",
            claimed.0.id,
            error,
            retry,
        )
        .execute(pool)
        .await
        .map(drop)
    }

    fn label(claimed: &Claimed) -> String {
        format!("{} operation {}", claimed.0.action, claimed.0.id)
    }
}

/// Works the operation's next chunk in one transaction: its letters reviewed and its progress
/// recorded together. `Some(letters worked)`, or `None` once it has ended (no letter left: it is
/// done; or it was cancelled). A replay chunk's messages are sent after the commit.
async fn work_chunk(
    tools: &OperationTools,
    op: &OperationRow,
) -> Result<Option<i64>, OperationError> {
    let now = tools.clock.now();
    let mut tx = crate::db::begin(&tools.pool).await?;
    sqlx::query!(
        "SELECT set_config('lock_timeout', $1, true)",
        CHUNK_LOCK_WAIT
    )
    .fetch_one(&mut *tx)
    .await?;
    // The operation's row, held to the commit: its position and status as of now.
    let Some(at) = sqlx::query!(
        "SELECT after_created_at, after_id FROM core.dead_letter_operations
         WHERE id = $1 AND status = 'running' FOR UPDATE",
        op.id,
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(None); // cancelled (or ended by another worker)
    };
    let chunk = Chunk {
        filter: &op.selection.0,
        through: op.through,
        after: at
            .after_created_at
            .zip(at.after_id)
            .map(|(created_at, id)| Position { created_at, id }),
        limit: match op.action {
            Action::Discard => DISCARD_CHUNK,
            Action::Replay => REPLAY_CHUNK,
        },
    };
    let (progress, last, to_send) = match op.action {
        Action::Discard => {
            let done =
                discard_chunk(&mut tx, chunk, &op.reason, &op.requested_by, op.id, now).await?;
            let progress = Progress {
                discarded: done.reviewed,
                ..Progress::default()
            };
            (progress, done.last, Vec::new())
        }
        Action::Replay => replay_chunk(&mut tx, chunk, op, now).await?,
    };
    let Some(last) = last else {
        finish(&mut tx, op.id, now).await?;
        tx.commit().await?;
        tracing::info!(operation = %op.id, "bulk operation done");
        return Ok(None);
    };
    record_chunk(&mut tx, op.id, &progress, last, now).await?;
    tx.commit().await?;
    if let Some(replayer) = &tools.replayer {
        send_replays(tools, replayer, op.id, &to_send).await?;
    }
    Ok(Some(progress.worked()))
}

/// Reviews a replay chunk: each letter replayed (queued, or `already_processed` if its job's
/// fence exists) or left pending and counted (not replayable, not sendable). Its progress, the
/// position of its oldest letter, and the letters to send.
async fn replay_chunk(
    conn: &mut PgConnection,
    chunk: Chunk<'_>,
    op: &OperationRow,
    now: DateTime<Utc>,
) -> sqlx::Result<(Progress, Option<Position>, Vec<DeadLetter>)> {
    let letters: Vec<ChunkLetter> = lock_chunk(conn, chunk).await?;
    let last = letters.last().map(|l| Position {
        created_at: l.letter.created_at,
        id: l.letter.id.0,
    });
    let mut progress = Progress::default();
    let (mut ids, mut outcomes, mut to_send) = (Vec::new(), Vec::new(), Vec::new());
    for ChunkLetter {
        letter,
        fence_exists,
        fence_of_another_job,
    } in letters
    {
        if replayable(&letter, fence_of_another_job).is_err() {
            progress.skipped_not_replayable += 1;
        } else if fence_exists {
            progress.already_processed += 1;
            ids.push(letter.id.0);
            outcomes.push("already_processed");
        } else if refused_by_sqs(&letter.id, &letter_body(&letter)).is_some() {
            progress.skipped_not_sendable += 1;
        } else {
            progress.replayed += 1;
            ids.push(letter.id.0);
            outcomes.push("queued");
            to_send.push(letter);
        }
    }
    if !ids.is_empty() {
        mark_replayed(
            conn,
            &ids,
            &outcomes,
            &op.reason,
            &op.requested_by,
            op.id,
            now,
        )
        .await?;
    }
    Ok((progress, last, to_send))
}

/// Records a chunk's progress and position on the operation's row, renewing the lease.
async fn record_chunk(
    conn: &mut PgConnection,
    id: Uuid,
    p: &Progress,
    last: Position,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let lease = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    sqlx::query!(
        "UPDATE core.dead_letter_operations
         SET after_created_at = $2, after_id = $3,
             replayed = replayed + $4, already_processed = already_processed + $5,
             discarded = discarded + $6, skipped_not_replayable = skipped_not_replayable + $7,
             skipped_not_sendable = skipped_not_sendable + $8,
             updated_at = $9, claimed_until = $10
         WHERE id = $1",
        id,
        last.created_at,
        last.id,
        p.replayed,
        p.already_processed,
        p.discarded,
        p.skipped_not_replayable,
        p.skipped_not_sendable,
        now,
        lease,
    )
    .execute(conn)
    .await
    .map(drop)
}

/// Marks the operation done.
async fn finish(conn: &mut PgConnection, id: Uuid, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.dead_letter_operations
         SET status = 'done', finished_at = $2, updated_at = $2, claimed_until = NULL
         WHERE id = $1",
        id,
        now,
    )
    .execute(conn)
    .await
    .map(drop)
}

/// Sends the operation's replays still queued (a killed worker's last chunk, or a queue that
/// refused): a queue that refuses again stops the operation until a later round.
async fn send_left_queued(
    tools: &OperationTools,
    replayer: &Replayer,
    id: Uuid,
) -> Result<(), OperationError> {
    // Dynamic: `DeadLetter` reads its head by `#[sqlx(flatten)]`, which `query_as!` cannot fill.
    let left: Vec<DeadLetter> = sqlx::query_as(
        "SELECT * FROM core.dead_letters
         WHERE replay_outcome = 'queued' AND operation_id = $1
         ORDER BY reviewed_at, id LIMIT $2",
    )
    .bind(id)
    .bind(REPLAY_CHUNK)
    .fetch_all(&tools.pool)
    .await?;
    send_replays(tools, replayer, id, &left).await
}

/// Sends `letters`' replays ten to a call ([`Replayer::send_batch`]), [`CALLS_IN_FLIGHT`] calls
/// at once, and records each call's (on the letters, and in the operation's `sent`) as it is
/// answered, so a worker killed midway loses at most the records of the calls in flight (their
/// replays stay queued and are sent again: the same job ids, which the consumer's fence applies
/// once). A queue that refused is the operation's error; a message refused for itself stays
/// queued for the scheduled run's sender (with its backoff).
async fn send_replays(
    tools: &OperationTools,
    replayer: &Replayer,
    id: Uuid,
    letters: &[DeadLetter],
) -> Result<(), OperationError> {
    let mut answered: Vec<Result<Option<String>, sqlx::Error>> = Vec::new();
    for flight in letters.chunks(10 * CALLS_IN_FLIGHT) {
        let mut calls = Vec::with_capacity(CALLS_IN_FLIGHT);
        for call in flight.chunks(10) {
            calls.push(send_call(tools, replayer, id, call));
        }
        answered.extend(futures_util::future::join_all(calls).await);
    }
    let mut queue_refusal = None;
    for answer in answered {
        queue_refusal = queue_refusal.or(answer?);
    }
    match queue_refusal {
        Some(error) => Err(OperationError::QueueRefused(error)),
        None => Ok(()),
    }
}

/// One `SendMessageBatch` of `call`'s replays, its sends recorded: the queue's refusal, if any.
async fn send_call(
    tools: &OperationTools,
    replayer: &Replayer,
    id: Uuid,
    call: &[DeadLetter],
) -> sqlx::Result<Option<String>> {
    // Read again right before the call: a replay withdrawn (or sent by another sender) since
    // its chunk committed is not sent. (One withdrawn while this call is in flight lands, as a
    // one-letter replay's does: the withdrawal finds it sent or records nothing.)
    let ids: Vec<Uuid> = call.iter().map(|l| l.id.0).collect();
    let still: Vec<Uuid> = sqlx::query_scalar!(
        r#"SELECT id AS "id!" FROM core.dead_letters WHERE id = ANY($1) AND replay_outcome = 'queued'"#,
        &ids,
    )
    .fetch_all(&tools.pool)
    .await?;
    let call: Vec<&DeadLetter> = call.iter().filter(|l| still.contains(&l.id.0)).collect();
    if call.is_empty() {
        return Ok(None);
    }
    let results = replayer.send_batch(&call).await;
    let (mut ids, mut messages, mut queue_refusal) = (Vec::new(), Vec::new(), None);
    for (letter, result) in call.into_iter().zip(results) {
        match result {
            Ok(sent) => {
                ids.push(letter.id.0);
                messages.push(sent.message_id);
            }
            Err(Refusal::Queue(error)) => queue_refusal = Some(error),
            Err(Refusal::Message(error)) => {
                tracing::warn!(operation = %id, letter = %letter.id, error,
                    "a replay of the operation was refused; the scheduled run retries it");
            }
        }
    }
    record_sent(tools, id, &ids, &messages).await?;
    Ok(queue_refusal)
}

/// Records the replays of letters `ids` sent as `messages`, and counts them on the operation.
async fn record_sent(
    tools: &OperationTools,
    id: Uuid,
    ids: &[Uuid],
    messages: &[String],
) -> sqlx::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let now = tools.clock.now();
    record_replays_sent(&tools.pool, ids, messages, now, id)
        .await
        .map(drop)
}
