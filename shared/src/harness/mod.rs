//! The processing of one message: the life of a job as DESIGN.md describes it.
//!
//! Invariants:
//! - fence and work share one transaction, the fence inserted first, and `COMMIT` is sent only
//!   after the transaction has proved itself whole ([`crate::fence::finish_job`]);
//! - nothing is acked unless it committed, was a duplicate, or has its dead letter committed;
//! - a letter is written only after the fence settles that the job did not commit;
//! - attempts are executions, counted in [`crate::execution`]'s ledger, not SQS receives;
//! - a panic or a database fault in the work is a transient failure, never a lost message.

use crate::alerting::Alerter;
use crate::clock::Clock;
use crate::consumer::{Consumer, Job, ProcessError};
use crate::dead_letter::{
    CONFLICT_ERROR, ErrorKind, NewDeadLetter, Recorded, Settled, record_unless_processed,
    record_without_settling,
};
use crate::decision::{Disposition, decide};
use crate::envelope::{Envelope, JobDigest, PartialIds};
use crate::execution::{Start, record_failure, start_execution, uncharge};
use crate::fence::{FenceClaim, conflicts};
use crate::metrics::Metrics;
use crate::retry::RetryPolicy;
use attempt::AttemptError;
use rand::rngs::StdRng;
use sqlx::PgPool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

mod attempt;
mod batch;
mod outcome;
pub use batch::CommitMode;
pub use outcome::{IncomingMessage, RecordOutcome};

/// Incident steps one delivery round sends at most.
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
    /// One transaction per job, or per batch.
    pub commit: CommitMode,
}

impl Default for HarnessSettings {
    /// What a function runs with when nothing is configured (the platform's retry policy, the
    /// default fence lifetime and lock timeout, one transaction per job); tests start here and
    /// change what they test.
    fn default() -> Self {
        let lock_timeout = Duration::from_secs(2);
        Self {
            policy: RetryPolicy::default(),
            fence_ttl: Duration::from_secs(14 * 86_400), // config::DEFAULT_FENCE_TTL
            lock_timeout,
            contended_retry_after: lock_timeout + Duration::from_secs(1),
            commit: CommitMode::default(),
        }
    }
}

/// Runs one [`Consumer`] over messages, with its pool, clock, RNG and metrics.
pub struct Harness<C> {
    consumer: C,
    pool: PgPool,
    settings: HarnessSettings,
    clock: Arc<dyn Clock>,
    rng: Mutex<StdRng>,
    metrics: Arc<Metrics>,
    alerter: Option<Alerter>,
}

/// Fills the job's span with the identifiers the message carries.
fn record_ids(ids: &PartialIds) {
    let span = tracing::Span::current();
    if let Some(job_id) = ids.job_id {
        span.record("job_id", tracing::field::display(job_id));
    }
    if let Some(tenant_id) = ids.tenant_id {
        span.record("tenant_id", tracing::field::display(tenant_id));
    }
    if let Some(correlation_id) = &ids.correlation_id {
        // Bounded as the letter keeps it: every log line of the job carries it.
        let bounded = crate::dead_letter::bounded_correlation_id(correlation_id);
        span.record("correlation_id", &*bounded);
    }
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
            metrics: Arc::default(),
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

    /// The database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The settings.
    pub fn settings(&self) -> &HarnessSettings {
        &self.settings
    }

    /// Processes one delivery and says what to do with the message. Never panics on the
    /// message's content; never acks a message whose outcome is not committed.
    pub async fn process(&self, msg: &IncomingMessage) -> RecordOutcome {
        // Every line logged while the job runs, the handler's own included, carries these.
        let span = tracing::info_span!(
            "job",
            consumer = self.consumer.name().as_str(),
            message_id = %msg.message_id,
            job_id = tracing::field::Empty,
            correlation_id = tracing::field::Empty,
            tenant_id = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        let outcome = self.process_unrecorded(msg).instrument(span.clone()).await;
        self.metrics.increment(outcome.metric());
        let _entered = span.enter();
        match &outcome {
            RecordOutcome::Processed
            | RecordOutcome::Duplicate
            | RecordOutcome::Contended { .. } => {
                tracing::debug!(?outcome, "record done")
            }
            RecordOutcome::Retry {
                attempt,
                after,
                error,
            } => {
                tracing::info!(attempt, ?after, error, "retrying")
            }
            RecordOutcome::DeadLettered {
                kind,
                letter,
                error,
            } => {
                tracing::warn!(%kind, letter = %letter.id(), error, "dead-lettered")
            }
            RecordOutcome::HandedBack { error, .. } => {
                tracing::warn!(error, "handed back without running")
            }
            RecordOutcome::DeadLetterFailed { error, .. } => {
                tracing::error!(error, "dead letter not written; message kept")
            }
        }
        outcome
    }

    async fn process_unrecorded(&self, msg: &IncomingMessage) -> RecordOutcome {
        let fields = self.consumer.job_fields();
        let (envelope, digest) = match Envelope::<C::Payload>::parse_job(&msg.body, fields) {
            Ok(parsed) => parsed,
            Err(poison) => {
                record_ids(&poison.ids);
                return self
                    // Poison is never attempted, so its letter says 1 attempt even when crashes
                    // of its batch delivered it more than once.
                    .dead_letter(msg, &poison.ids, None, 1, ErrorKind::Poison, poison.reason)
                    .await;
            }
        };
        record_ids(&envelope.ids());
        let (job_id, consumer) = (envelope.job_id, self.consumer.name());
        let policy = &self.settings.policy;
        // A first delivery cannot follow an execution of this message, so it runs without a
        // look at the ledger; a repeat delivery asks it first, in one statement.
        let charged = msg.receive_count > 1;
        let attempt = if charged {
            let start = start_execution(
                &self.pool,
                job_id,
                consumer,
                &msg.message_id,
                policy.max_attempts(),
                self.clock.now(),
            )
            .await;
            match start {
                Ok(Start::Run { attempt }) => attempt,
                Ok(Start::AlreadyProcessed { committed }) => {
                    return if conflicts(committed.as_ref(), &digest) {
                        self.conflict(msg, &envelope.ids(), &digest).await
                    } else {
                        RecordOutcome::Duplicate
                    };
                }
                Ok(Start::AlreadyLettered { id, kind }) => {
                    return RecordOutcome::DeadLettered {
                        kind,
                        letter: Recorded::AlreadyRecorded(id),
                        error: "this message's dead letter was already written".into(),
                    };
                }
                Ok(Start::OverBudget(ledger)) => {
                    let context = format!("delivered {} times", msg.receive_count);
                    let (kind, error) = ledger.verdict(policy.max_attempts(), &context);
                    return self
                        .dead_letter(
                            msg,
                            &envelope.ids(),
                            Some(&digest),
                            ledger.executions,
                            kind,
                            error,
                        )
                        .await;
                }
                Err(e) => {
                    let error = format!("reading the execution ledger: {e}");
                    return self.hand_back(error, self.unavailable_delay(msg));
                }
            }
        } else {
            1
        };
        tracing::Span::current().record("attempt", attempt);
        let job = Job {
            envelope,
            attempt,
            started_at: self.clock.now(),
            digest,
            metrics: self.metrics.clone(),
        };
        let failure = match self.attempt(&job, msg).await {
            Ok(FenceClaim::Claimed) => return RecordOutcome::Processed,
            Ok(FenceClaim::Duplicate) => return RecordOutcome::Duplicate,
            Ok(FenceClaim::Conflict) => {
                return self.conflict(msg, &job.envelope.ids(), &job.digest).await;
            }
            Err(AttemptError::Contended) => {
                if charged {
                    // It never ran: take the charge back (best effort; a failure only costs
                    // the job one of its attempts).
                    let _ = uncharge(&self.pool, job_id, consumer).await;
                }
                return RecordOutcome::Contended {
                    retry_after: self.settings.contended_retry_after,
                };
            }
            Err(AttemptError::CommitUnknown(e)) => {
                match self.settle_commit(msg, job_id, Some(&job.digest), e).await {
                    Ok(committed) => return committed,
                    Err(failure) => failure,
                }
            }
            Err(AttemptError::Failed(failure)) => failure,
        };
        let attempt = match &failure {
            ProcessError::Transient(error) => record_failure(
                &self.pool,
                job_id,
                consumer,
                charged,
                error.message(),
                self.clock.now(),
            )
            .await
            .unwrap_or(attempt),
            _ => attempt,
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
                let ids = job.envelope.ids();
                self.dead_letter(
                    msg,
                    &ids,
                    Some(&job.digest),
                    attempt,
                    kind,
                    failure.to_string(),
                )
                .await
            }
            Disposition::Ack => unreachable!("decide acks only success"),
        }
    }

    /// A copy of a processed job whose payload differs: another job under its id. Its letter
    /// is written without settling (the fence says the id committed, for the other job).
    pub(super) async fn conflict(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: &JobDigest,
    ) -> RecordOutcome {
        let error = CONFLICT_ERROR.to_owned();
        let kind = ErrorKind::Conflict;
        self.write_letter(msg, ids, Some(digest), 1, kind, error, false)
            .await
    }

    async fn dead_letter(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: Option<&JobDigest>,
        attempt: u32,
        kind: ErrorKind,
        error: String,
    ) -> RecordOutcome {
        self.write_letter(msg, ids, digest, attempt, kind, error, true)
            .await
    }

    /// Writes the letter (settled through the fence first, when `settle`), then pages.
    #[allow(clippy::too_many_arguments)]
    async fn write_letter(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: Option<&JobDigest>,
        attempt: u32,
        kind: ErrorKind,
        error: String,
        settle: bool,
    ) -> RecordOutcome {
        let letter = NewDeadLetter {
            job_id: ids.job_id,
            tenant_id: ids.tenant_id,
            consumer: self.consumer.name(),
            queue: &msg.queue,
            message_id: &msg.message_id,
            body: &msg.body,
            attempts: attempt,
            kind,
            last_error: &error,
            correlation_id: ids.correlation_id.as_deref(),
            replay_of: msg.replay_of,
        };
        let settled = if settle {
            record_unless_processed(
                &self.pool,
                &letter,
                digest,
                self.clock.now(),
                self.settings.lock_timeout,
            )
            .await
        } else {
            record_without_settling(&self.pool, &letter, digest, self.clock.now())
                .await
                .map(Settled::Recorded)
        };
        match settled {
            Ok(Settled::AlreadyProcessed) => RecordOutcome::Duplicate,
            Ok(settled @ (Settled::Recorded(letter) | Settled::Conflict(letter))) => {
                let kind = match settled {
                    Settled::Conflict(_) => ErrorKind::Conflict,
                    _ => kind,
                };
                if let (Recorded::New(_), Some(alerter)) = (letter, &self.alerter) {
                    // Boxed: the delivery's future is deep, and every caller of `process` would
                    // carry it inline (the compiler's layout depth overflows in consumers' tests).
                    let delivery = Box::pin(alerter.deliver_pending(ALERTS_PER_ROUND)).await;
                    self.metrics.count_delivery(&delivery);
                }
                RecordOutcome::DeadLettered {
                    kind,
                    letter,
                    error,
                }
            }
            Err(e) => RecordOutcome::DeadLetterFailed {
                retry_after: self.retry_after(&e, msg),
                error: format!(
                    "writing the {kind} dead letter failed: {e}; original error: {error}"
                ),
            },
        }
    }
}
