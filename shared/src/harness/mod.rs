//! The processing of one message: the life of a job as DESIGN.md describes it.
//!
//! Invariants:
//! - fence and work share one transaction, the fence inserted first;
//! - nothing is acked unless it committed, was a duplicate, or has its dead letter committed;
//! - a panic or a database fault in the work is a transient failure, never a lost message.

use crate::alerting::Alerter;
use crate::clock::Clock;
use crate::consumer::{Consumer, Job, ProcessError};
use crate::dead_letter::{ErrorKind, NewDeadLetter, Recorded, record_dead_letter_in};
use crate::decision::{Disposition, decide};
use crate::envelope::{Envelope, PartialIds, body_as_json};
use crate::fence::{FenceClaim, FenceError, claim_fence, fence_exists};
use crate::metrics::Metrics;
use crate::retry::RetryPolicy;
use futures_util::FutureExt;
use rand::rngs::StdRng;
use sqlx::PgPool;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod outcome;
pub use outcome::{IncomingMessage, RecordOutcome};

/// Alert groups one delivery round sends at most.
pub const ALERTS_PER_ROUND: i64 = 10;

/// Harness settings beyond the consumer itself.
#[derive(Debug, Clone)]
pub struct HarnessSettings {
    /// Attempts and backoff.
    pub policy: RetryPolicy,
    /// Fence lifetime.
    pub fence_ttl: Duration,
    /// How long a copy waits for a concurrent copy's fence before handing the record back.
    pub lock_timeout: Duration,
    /// Redelivery delay after a contended fence.
    pub contended_retry_after: Duration,
}

/// Runs one [`Consumer`] over messages, with its pool, clock, RNG and metrics.
pub struct Harness<C> {
    consumer: C,
    pool: PgPool,
    settings: HarnessSettings,
    clock: Arc<dyn Clock>,
    rng: Mutex<StdRng>,
    metrics: Metrics,
    alerter: Option<Alerter>,
}

enum AttemptError {
    Contended,
    Failed(ProcessError),
}

impl<C: Consumer> Harness<C> {
    /// A harness for `consumer`. `rng` draws the backoff jitter; seed it in tests.
    pub fn new(
        consumer: C,
        pool: PgPool,
        settings: HarnessSettings,
        clock: Arc<dyn Clock>,
        rng: StdRng,
    ) -> Self {
        Self {
            consumer,
            pool,
            settings,
            clock,
            rng: Mutex::new(rng),
            metrics: Metrics::default(),
            alerter: None,
        }
    }

    /// Pages BetterStack after each new dead letter (within the alerter's budget; what fails is
    /// left for the scheduled run). Without an alerter, letters wait for the scheduled run.
    pub fn with_alerter(mut self, alerter: Option<Alerter>) -> Self {
        self.alerter = alerter;
        self
    }

    /// The counters of what this harness did.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The current time by the harness's clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// The consumer.
    pub fn consumer(&self) -> &C {
        &self.consumer
    }

    /// Processes one delivery and says what to do with the message. Never panics on the
    /// message's content; never acks a message whose outcome is not committed.
    pub async fn process(&self, msg: &IncomingMessage) -> RecordOutcome {
        let outcome = self.process_unrecorded(msg).await;
        self.metrics.increment(outcome.metric());
        let consumer = self.consumer.name().as_str();
        match &outcome {
            RecordOutcome::Processed
            | RecordOutcome::Duplicate
            | RecordOutcome::Contended { .. } => {
                tracing::debug!(consumer, message_id = %msg.message_id, ?outcome, "record done")
            }
            RecordOutcome::Retry {
                attempt,
                after,
                error,
            } => {
                tracing::info!(consumer, message_id = %msg.message_id, attempt, ?after, error, "retrying")
            }
            RecordOutcome::DeadLettered {
                kind,
                letter,
                error,
            } => {
                tracing::warn!(consumer, message_id = %msg.message_id, %kind, letter = %letter.id(), error, "dead-lettered")
            }
            RecordOutcome::DeadLetterFailed { error, .. } => {
                tracing::error!(consumer, message_id = %msg.message_id, error, "dead letter not written; message kept")
            }
        }
        outcome
    }

    async fn process_unrecorded(&self, msg: &IncomingMessage) -> RecordOutcome {
        let attempt = msg.receive_count.max(1);
        let envelope = match Envelope::<C::Payload>::parse(&msg.body) {
            Ok(envelope) => envelope,
            Err(poison) => {
                return self
                    // Poison is never attempted, so its letter says 1 attempt even when crashes
                    // of its batch delivered it more than once.
                    .dead_letter(msg, &poison.ids, 1, ErrorKind::Poison, poison.reason)
                    .await;
            }
        };
        let policy = &self.settings.policy;
        if policy.is_over_budget(attempt) {
            // A duplicate is always acked: a job processed by an earlier copy or delivery (whose
            // ack was lost in a crash of its batch) is done, however often it was delivered.
            match fence_exists(&self.pool, envelope.job_id, self.consumer.name()).await {
                Ok(true) => return RecordOutcome::Duplicate,
                Ok(false) => {}
                Err(e) => {
                    return RecordOutcome::DeadLetterFailed {
                        retry_after: policy.base(),
                        error: format!("checking the fence of an over-budget delivery failed: {e}"),
                    };
                }
            }
            let error = format!(
                "delivered {attempt} times with a budget of {} attempts: earlier attempts ended without \
                 an outcome (timeout, crash or lost acknowledgement)",
                policy.max_attempts()
            );
            return self
                .dead_letter(msg, &envelope.ids(), attempt, ErrorKind::Crashed, error)
                .await;
        }
        let job = Job {
            envelope,
            attempt,
            started_at: self.clock.now(),
        };
        let failure = match self.attempt(&job).await {
            Ok(FenceClaim::Claimed) => return RecordOutcome::Processed,
            Ok(FenceClaim::Duplicate) => return RecordOutcome::Duplicate,
            Err(AttemptError::Contended) => {
                return RecordOutcome::Contended {
                    retry_after: self.settings.contended_retry_after,
                };
            }
            Err(AttemptError::Failed(failure)) => failure,
        };
        let disposition = decide(
            Err(&failure),
            attempt,
            policy,
            &mut *self.rng.lock().expect("rng lock"),
        );
        match disposition {
            Disposition::Retry { after } => RecordOutcome::Retry {
                attempt,
                after,
                error: failure.to_string(),
            },
            Disposition::DeadLetter(kind) => {
                self.dead_letter(msg, &job.envelope.ids(), attempt, kind, failure.to_string())
                    .await
            }
            Disposition::Ack => unreachable!("decide acks only success"),
        }
    }

    /// One transaction: lock timeout, fence first, work, commit. `Ok(Claimed)` means committed.
    async fn attempt(&self, job: &Job<C::Payload>) -> Result<FenceClaim, AttemptError> {
        let failed = |e: sqlx::Error| AttemptError::Failed(e.into());
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let envelope = &job.envelope;
        let claim = claim_fence(
            &mut tx,
            envelope.job_id,
            self.consumer.name(),
            envelope.tenant_id,
            job.started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await;
        match claim {
            Ok(FenceClaim::Claimed) => {}
            Ok(FenceClaim::Duplicate) => {
                let _ = tx.rollback().await;
                return Ok(FenceClaim::Duplicate);
            }
            Err(FenceError::Contended) => {
                let _ = tx.rollback().await;
                return Err(AttemptError::Contended);
            }
            Err(FenceError::Database(e)) => {
                let _ = tx.rollback().await;
                return Err(failed(e));
            }
        }
        let work = AssertUnwindSafe(self.consumer.handle(job, &mut tx))
            .catch_unwind()
            .await;
        match work {
            Ok(Ok(())) => {
                tx.commit().await.map_err(|e| {
                    AttemptError::Failed(ProcessError::Transient(format!("commit failed: {e}")))
                })?;
                Ok(FenceClaim::Claimed)
            }
            Ok(Err(error)) => {
                let _ = tx.rollback().await;
                Err(AttemptError::Failed(error))
            }
            Err(panic) => {
                let _ = tx.rollback().await;
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                Err(AttemptError::Failed(ProcessError::Transient(format!(
                    "handler panicked: {what}"
                ))))
            }
        }
    }

    async fn dead_letter(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        attempt: u32,
        kind: ErrorKind,
        error: String,
    ) -> RecordOutcome {
        let payload = body_as_json(&msg.body);
        let letter = NewDeadLetter {
            job_id: ids.job_id,
            tenant_id: ids.tenant_id,
            consumer: self.consumer.name(),
            queue: &msg.queue,
            message_id: &msg.message_id,
            payload: &payload,
            attempts: attempt,
            kind,
            last_error: &error,
            correlation_id: ids.correlation_id.as_deref(),
            replay_of: msg.replay_of,
        };
        match record_dead_letter_in(&self.pool, &letter, self.clock.now()).await {
            Ok(letter) => {
                if let (Recorded::New(_), Some(alerter)) = (letter, &self.alerter) {
                    alerter.deliver_pending(ALERTS_PER_ROUND).await;
                }
                RecordOutcome::DeadLettered {
                    kind,
                    letter,
                    error,
                }
            }
            Err(e) => RecordOutcome::DeadLetterFailed {
                retry_after: self.settings.policy.base(),
                error: format!(
                    "writing the {kind} dead letter failed: {e}; original error: {error}"
                ),
            },
        }
    }
}
