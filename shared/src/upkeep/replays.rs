//! The run's replay step: replays recorded but not sent (the replay's own send failed, or its
//! process died right after the commit) are sent, each refusal recorded with its backoff.

use super::ScheduledRun;
use crate::dead_letter::record_replay_sent;
use crate::replay::sends::{DueReplay, due_replays, record_send_refused};
use crate::replay::{Refusal, Replayer};
use std::time::Duration;
use tokio::time::Instant;

/// Queued replays tried per run, the one due longest first (those left untried, their queue
/// having refused one itself, do not count).
const REPLAYS_PER_RUN: i64 = 500;
/// A queued replay younger than this is left to the replay request that recorded it.
const REPLAY_GRACE: Duration = Duration::from_secs(60);

/// Queued replays this run sent, and those the queue still refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaySends {
    /// Sent and recorded.
    pub sent: u64,
    /// Tried and refused: still queued, each due again after its backoff. (Those not tried, their
    /// queue having refused one itself this run, are not counted: they wait as they were.)
    pub failed: u64,
}

impl ScheduledRun {
    /// Sends the replays recorded over a minute ago that no queue accepted yet (the replay's own
    /// send failed, or its process died right after the commit), the one due longest first,
    /// at most [`REPLAYS_PER_RUN`] within `budget`. A refusal is recorded on the replay tried,
    /// with its backoff, and only there. A queue that refused itself ([`Refusal::Queue`]: it is
    /// gone, denies access, throttles, does not answer) is not asked again in this run: its
    /// other replays are left as they are, and the scan goes on past them, so a dead queue costs
    /// one call per run, not one per replay, and holds no other queue's replays back. A message
    /// refused for itself ([`Refusal::Message`]) holds back nothing: the next of its queue goes.
    /// A message sent twice is harmless: it carries the same job id, and the consumer's fence
    /// applies it once.
    pub(super) async fn send_queued_replays(&self, budget: Duration) -> sqlx::Result<ReplaySends> {
        let Some(replayer) = &self.replayer else {
            return Ok(ReplaySends::default());
        };
        let deadline = Instant::now() + budget;
        let now = self.clock.now();
        let before = now - chrono::Duration::from_std(REPLAY_GRACE).unwrap_or_default();
        let mut refusing: Vec<String> = Vec::new();
        let (mut after, mut tried, mut sends) = (None, 0, ReplaySends::default());
        while tried < REPLAYS_PER_RUN {
            let left = REPLAYS_PER_RUN - tried;
            let page = due_replays(&self.pool, now, before, after, &refusing, left).await?;
            if page.is_empty() {
                break;
            }
            for due in page {
                after = Some(due.position());
                if refusing.contains(&due.letter.queue) {
                    continue; // its queue refused another in this page: not tried, left as it is
                }
                if Instant::now() >= deadline {
                    tracing::warn!(
                        ?budget,
                        "replay step out of time; the rest is sent by the next run"
                    );
                    return Ok(sends);
                }
                tried += 1;
                match self.send_one(replayer, &due, deadline, budget).await? {
                    Ok(()) => sends.sent += 1,
                    Err(queue_refused) => {
                        sends.failed += 1;
                        refusing.extend(queue_refused);
                    }
                }
            }
        }
        Ok(sends)
    }

    /// Sends one queued replay before `deadline` and records what happened: sent, or refused
    /// (`Err` with its queue when the queue refused itself, so no other of its replays is tried
    /// in this run).
    async fn send_one(
        &self,
        replayer: &Replayer,
        due: &DueReplay,
        deadline: Instant,
        budget: Duration,
    ) -> sqlx::Result<Result<(), Option<String>>> {
        let letter = &due.letter;
        let result = match tokio::time::timeout_at(deadline, replayer.send(letter)).await {
            Ok(sent) => sent,
            Err(_) => Err(Refusal::Queue(format!(
                "the send did not finish within the replay step's {budget:?}"
            ))),
        };
        let refusal = match result {
            Ok(sent) => {
                let now = self.clock.now();
                record_replay_sent(&self.pool, letter.id, &sent.message_id, now).await?;
                return Ok(Ok(()));
            }
            Err(refusal) => refusal,
        };
        let attempts = u32::try_from(due.send_attempts).unwrap_or(0) + 1;
        let queue_level = refusal.queue_level();
        tracing::error!(letter = %letter.id, queue = letter.queue, attempts, queue_level,
            error = %refusal, "queued replay still not sent");
        let now = self.clock.now();
        record_send_refused(&self.pool, letter.id, attempts, refusal.error(), now).await?;
        Ok(Err(queue_level.then(|| letter.queue.clone())))
    }
}
