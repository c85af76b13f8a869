//! The processing of one message: the life of a job as DESIGN.md describes it.
//!
//! Invariants:
//! - fence and work share one transaction, the fence inserted first, and `COMMIT` is run only
//!   after the transaction has proved itself whole ([`crate::fence::close_job`]);
//! - nothing is acked unless it committed, was a duplicate, or has its dead letter committed;
//! - a letter is written only after the fence settles that the job did not commit;
//! - attempts are executions, counted in [`crate::ledger`]'s ledger, not SQS receives;
//! - a panic or a database fault in the work is a transient failure, never a lost message.
//!
//! Where each part lives: the life of one message as named steps (`life.rs`), the one transaction
//! routine for a job or a commit group (`attempt.rs`), the letter a message gets (`letter.rs`), an
//! SQS batch (`batch.rs`) and batch mode's commit group (`group.rs`), what goes in and comes out
//! (`outcome.rs`).

use crate::clock::Clock;
use crate::consumer::Consumer;
use crate::envelope::PartialIds;
use crate::metrics::Metrics;
use crate::paging::Alerter;
use crate::retry::RetryPolicy;
use parsed::Parsed;
use rand::rngs::StdRng;
use sqlx::PgPool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

mod attempt;
mod batch;
mod failure;
mod fifo;
mod group;
mod lanes;
mod letter;
mod life;
mod outcome;
mod parsed;
mod work_errors;
pub use crate::config::CommitMode;
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
    /// One transaction per job, or per commit group (an SQS batch's new jobs).
    pub commit: CommitMode,
    /// How long after its consumer's newest letter a writer of poison settles behind its rows
    /// in the letters' intake (`LETTER_SETTLE_DUE_MS`; zero, the default: every writer settles
    /// behind its own at once; see [`crate::dead_letter::SETTLE_DUE`]).
    pub settle_due: Duration,
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
            settle_due: Duration::ZERO,
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
    lanes: lanes::Lanes,
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
            lanes: lanes::Lanes::new(&pool),
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
        self.process_parsed(msg, self.parse(msg)).await
    }

    /// One [`crate::metrics::JOB_DURATION`] sample: the time since `started`, by the clock.
    fn observe_duration_since(&self, started: chrono::DateTime<chrono::Utc>) {
        let took = (self.clock.now() - started).to_std().unwrap_or_default();
        self.metrics
            .observe_duration(crate::metrics::JOB_DURATION, took);
    }

    /// The span `msg`'s lines are written in ([`crate::telemetry::record_span`]).
    fn span(&self, msg: &IncomingMessage, ids: &PartialIds) -> tracing::Span {
        let span =
            crate::telemetry::record_span(self.consumer.name().as_str(), &msg.message_id, ids);
        crate::telemetry::otel::describe_job(&span, msg.delivery());
        span
    }

    /// [`Harness::process`] for a message whose body is already `parsed`: the life of the
    /// message in its span, then its metric and its log line.
    async fn process_parsed(
        &self,
        msg: &IncomingMessage,
        parsed: Parsed<C::Payload>,
    ) -> RecordOutcome {
        // Every line logged while the job runs, the handler's own included, carries these.
        let span = self.span(msg, &parsed::ids_of(&parsed));
        let started = self.clock.now();
        let outcome = self.live(msg, parsed).instrument(span.clone()).await;
        self.observe_duration_since(started);
        self.count_and_log(&span, &outcome);
        outcome
    }

    /// How every record the harness settles ends: its outcome counted, and its one line
    /// written in its span.
    fn count_and_log(&self, span: &tracing::Span, outcome: &RecordOutcome) {
        self.metrics.increment(outcome.metric());
        crate::telemetry::otel::conclude_job(span, outcome.name(), outcome.failed());
        let _entered = span.enter();
        log_outcome(outcome);
    }
}

/// The one line a processed message leaves at the end of its life.
fn log_outcome(outcome: &RecordOutcome) {
    match outcome {
        RecordOutcome::Processed | RecordOutcome::Duplicate | RecordOutcome::Contended { .. } => {
            tracing::debug!(?outcome, "record done")
        }
        RecordOutcome::HeldBack => {
            tracing::info!("held back behind an earlier message of its group that is not done")
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
            tracing::warn!(%kind, %letter, error, "dead-lettered")
        }
        RecordOutcome::HandedBack { error, .. } => {
            tracing::warn!(error, "handed back without running")
        }
        RecordOutcome::DeadLetterFailed { error, .. } => {
            tracing::error!(error, "dead letter not written; message kept")
        }
    }
}
