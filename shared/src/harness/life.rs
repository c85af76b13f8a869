//! The life of one message, as named steps: parse, ledger, claim and run (one transaction),
//! settle, decide. Each step hands the next what it needs, or stops the life with the message's
//! outcome; [`Harness::live`] reads as the story.

use super::attempt::{Committed, Jobs, Unfinished};
use super::letter::Settle;
use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job, ProcessError};
use crate::dead_letter::{ErrorKind, Recorded};
use crate::decision::AfterFailure;
use crate::envelope::{Envelope, JobDigest, PartialIds, Poison};
use crate::execution::{Ledger, Start, record_failure, start_execution, uncharge};
use crate::fence::{FenceError, conflicts, settle_committed};
use crate::ids::JobId;
use std::time::Duration;

/// A message's body read as the consumer's job: its envelope and digest, or poison. Read once
/// per message, by [`Harness::parse`], and carried from there.
pub(super) type Parsed<P> = Result<ParsedJob<P>, Poison>;

/// A body that is a job: its envelope, and the digest of what makes up the job.
pub(super) type ParsedJob<P> = (Envelope<P>, JobDigest);

/// One record, by its index in the SQS batch, with its parsed body.
pub(super) type Record<P> = (usize, Parsed<P>);

/// The ids a parsed message carries: all of them, or what a poison body still had.
pub(super) fn ids_of<P>(parsed: &Parsed<P>) -> PartialIds {
    match parsed {
        Ok((envelope, _)) => envelope.ids(),
        Err(poison) => poison.ids.clone(),
    }
}

/// The job id a parsed message is keyed by in its batch (the fence lookup, the commit group,
/// the ledger): the envelope's, or what a poison body still read as one (none for an
/// ambiguous body).
pub(super) fn key_of<P>(parsed: &Parsed<P>) -> Option<JobId> {
    match parsed {
        Ok((envelope, _)) => Some(envelope.job_id),
        Err(poison) => poison.ids.job_id,
    }
}

/// The digest a parsed message is compared by: the job's, or a poison body's as the fence
/// would compare it (none for a body that is not unambiguous JSON).
pub(super) fn digest_of<P>(parsed: &Parsed<P>) -> Option<JobDigest> {
    match parsed {
        Ok((_, digest)) => Some(*digest),
        Err(poison) => poison.digest.as_deref().copied(),
    }
}

/// The end of a message's life, reached before its last step: the outcome is final.
struct Stop(RecordOutcome);

/// What a step gives the next one, or the [`Stop`] that ends the life there.
type Step<T> = Result<T, Stop>;

/// Which execution a delivery is, and whether the ledger charged it before it ran.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    number: u32,
    charged: bool,
}

impl Attempt {
    /// A first delivery: attempt 1, charged only if it fails.
    const FIRST: Self = Self {
        number: 1,
        charged: false,
    };

    /// Execution `number`, charged by the ledger as it started.
    fn charged(number: u32) -> Self {
        Self {
            number,
            charged: true,
        }
    }
}

impl<C: Consumer> Harness<C> {
    /// The body of `msg` as this consumer's job.
    pub(super) fn parse(&self, msg: &IncomingMessage) -> Parsed<C::Payload> {
        Envelope::parse_job(&msg.body, self.consumer.job_fields())
    }

    /// The life of one message whose body is `parsed`.
    pub(super) async fn live(
        &self,
        msg: &IncomingMessage,
        parsed: Parsed<C::Payload>,
    ) -> RecordOutcome {
        match self.steps(msg, parsed).await {
            Ok(outcome) | Err(Stop(outcome)) => outcome,
        }
    }

    /// Parse, ledger, claim and run (one transaction), settle, decide: each step hands the next
    /// what it needs, or stops the life with the message's outcome.
    async fn steps(
        &self,
        msg: &IncomingMessage,
        parsed: Parsed<C::Payload>,
    ) -> Step<RecordOutcome> {
        let (envelope, digest) = self.accept(msg, parsed).await?;
        let attempt = self.consult_ledger(msg, &envelope, &digest).await?;
        let job = self.job(envelope, digest, attempt);
        let ended = self.transact(Jobs::One(&job, &msg.message_id)).await;
        let failure = self.settle(msg, &job, attempt, ended).await?;
        let number = self.charge_failure(&job, attempt, &failure).await;
        Ok(self.decide(msg, &job, number, failure).await)
    }

    /// Parse: poison is dead-lettered at once and never attempted.
    async fn accept(
        &self,
        msg: &IncomingMessage,
        parsed: Parsed<C::Payload>,
    ) -> Step<ParsedJob<C::Payload>> {
        match parsed {
            Ok((envelope, digest)) => Ok((envelope, digest)),
            Err(Poison {
                reason,
                ids,
                digest,
            }) => {
                // Poison is never attempted, so its letter says 1 attempt even when crashes of
                // its batch delivered it more than once. Its digest is kept: an edit of it and
                // the body it replaced are then one job's.
                let letter = self.dead_letter(
                    msg,
                    &ids,
                    digest.as_deref(),
                    1,
                    ErrorKind::Poison,
                    reason,
                    Settle::ThroughTheFence,
                );
                Err(Stop(letter.await))
            }
        }
    }

    /// Ledger: a first delivery cannot follow an execution of this message, so it runs as
    /// attempt 1 without a look; a repeat delivery asks the ledger first, in one statement,
    /// which charges the execution when the job is to run.
    async fn consult_ledger(
        &self,
        msg: &IncomingMessage,
        envelope: &Envelope<C::Payload>,
        digest: &JobDigest,
    ) -> Step<Attempt> {
        if msg.receive_count <= 1 {
            return Ok(Attempt::FIRST);
        }
        let (job_id, name, now) = (envelope.job_id, self.consumer.name(), self.clock.now());
        let max_attempts = self.settings.policy.max_attempts();
        let start = start_execution(&self.pool, job_id, name, &msg.message_id, max_attempts, now);
        let stop = match start.await {
            Ok(Start::Run { attempt }) => return Ok(Attempt::charged(attempt)),
            Ok(Start::AlreadyProcessed { committed }) if conflicts(committed.as_ref(), digest) => {
                self.conflict(msg, &envelope.ids(), digest).await
            }
            Ok(Start::AlreadyProcessed { .. }) => RecordOutcome::Duplicate,
            Ok(Start::AlreadyLettered { id, kind }) => RecordOutcome::DeadLettered {
                kind,
                letter: Recorded::AlreadyRecorded(id),
                error: "this message's dead letter was already written".into(),
            },
            Ok(Start::OverBudget(ledger)) => self.over_budget(msg, envelope, digest, ledger).await,
            Err(e) => {
                let error = format!("reading the execution ledger: {e}");
                self.hand_back(error, self.unavailable_delay(msg))
            }
        };
        Err(Stop(stop))
    }

    /// A job past its budget is dead-lettered without running again (the letter settles through
    /// the fence that it never committed).
    async fn over_budget(
        &self,
        msg: &IncomingMessage,
        envelope: &Envelope<C::Payload>,
        digest: &JobDigest,
        ledger: Ledger,
    ) -> RecordOutcome {
        let context = format!("delivered {} times", msg.receive_count);
        let (kind, error) = ledger.verdict(self.settings.policy.max_attempts(), &context);
        let (ids, executions) = (envelope.ids(), ledger.executions);
        self.dead_letter(
            msg,
            &ids,
            Some(digest),
            executions,
            kind,
            error,
            Settle::ThroughTheFence,
        )
        .await
    }

    /// The job one execution runs, its number in the span.
    fn job(
        &self,
        envelope: Envelope<C::Payload>,
        digest: JobDigest,
        attempt: Attempt,
    ) -> Job<C::Payload> {
        tracing::Span::current().record("attempt", attempt.number);
        Job {
            envelope,
            attempt: attempt.number,
            started_at: self.clock.now(),
            digest,
            metrics: self.metrics.clone(),
        }
    }

    /// Settle: what the end of the job's transaction means. Committed, a duplicate, a conflict
    /// or a contended fence ends the life; a `COMMIT` whose reply was lost settles through the
    /// fence; a failure goes on to be decided.
    async fn settle(
        &self,
        msg: &IncomingMessage,
        job: &Job<C::Payload>,
        attempt: Attempt,
        ended: Result<Committed, Unfinished>,
    ) -> Step<ProcessError> {
        let stop = match ended {
            Ok(_) => RecordOutcome::Processed,
            Err(Unfinished::Duplicate) => RecordOutcome::Duplicate,
            Err(Unfinished::Conflict) => self.conflict(msg, &job.envelope.ids(), &job.digest).await,
            Err(Unfinished::Claim(FenceError::Contended)) => self.contended(job, attempt).await,
            Err(Unfinished::Claim(FenceError::Database(e))) => {
                self.unclaimed(msg, job, attempt, e).await
            }
            Err(Unfinished::Failed(failure)) => return Ok(failure),
            Err(Unfinished::CommitUnknown(e)) => return self.settle_commit(msg, job, e).await,
        };
        Err(Stop(stop))
    }

    /// A concurrent copy holds the fence: the job never ran, so a charge is taken back (best
    /// effort; a failure only costs the job one of its attempts).
    async fn contended(&self, job: &Job<C::Payload>, attempt: Attempt) -> RecordOutcome {
        if attempt.charged {
            let _ = uncharge(&self.pool, job.envelope.job_id, self.consumer.name()).await;
        }
        RecordOutcome::Contended {
            retry_after: self.settings.contended_retry_after,
        }
    }

    /// The fence could not be claimed for a reason that is not the job's (no connection, a
    /// read-only or demoted server after a failover): the job never ran, so a charge is taken
    /// back (best effort) and the record is handed back after the backoff of its delivery, as
    /// an unavailable database's are. Only the job's own failures are charged as executions.
    async fn unclaimed(
        &self,
        msg: &IncomingMessage,
        job: &Job<C::Payload>,
        attempt: Attempt,
        error: sqlx::Error,
    ) -> RecordOutcome {
        if attempt.charged {
            let _ = uncharge(&self.pool, job.envelope.job_id, self.consumer.name()).await;
        }
        let error = format!("claiming the job's fence failed, the job did not run: {error}");
        self.hand_back(error, self.unavailable_delay(msg))
    }

    /// A `COMMIT` that failed may still have committed (its reply was lost with the
    /// connection). The fence settles it: committed ends the life as processed; not committed
    /// is the transient failure to decide; an answer that cannot be had yet hands it back.
    async fn settle_commit(
        &self,
        msg: &IncomingMessage,
        job: &Job<C::Payload>,
        commit_error: sqlx::Error,
    ) -> Step<ProcessError> {
        let job_id = job.envelope.job_id;
        let (name, now, wait) = (
            self.consumer.name(),
            self.clock.now(),
            self.settings.lock_timeout,
        );
        match settle_committed(&self.pool, job_id, name, Some(&job.digest), now, wait).await {
            Ok(true) => {
                tracing::warn!(job_id = %job_id, error = %commit_error,
                    "COMMIT reported an error, but the fence shows the job committed");
                Err(Stop(RecordOutcome::Processed))
            }
            Ok(false) => Ok(ProcessError::transient(format!(
                "COMMIT failed ({commit_error}); the fence shows the job did not commit"
            ))),
            Err(e) => {
                let after = self.retry_after(&e, msg);
                Err(Stop(self.hand_back(
                    format!("COMMIT failed ({commit_error}) and its outcome could not be settled yet: {e}"),
                    after,
                )))
            }
        }
    }

    /// Ledger, again: a transient failure is recorded (a first delivery is charged here), which
    /// numbers the attempt; if it cannot be written, the attempt keeps its number.
    async fn charge_failure(
        &self,
        job: &Job<C::Payload>,
        attempt: Attempt,
        failure: &ProcessError,
    ) -> u32 {
        let ProcessError::Transient(error) = failure else {
            return attempt.number;
        };
        let (job_id, consumer) = (job.envelope.job_id, self.consumer.name());
        let now = self.clock.now();
        record_failure(
            &self.pool,
            job_id,
            consumer,
            attempt.charged,
            error.message(),
            now,
        )
        .await
        .unwrap_or(attempt.number)
    }

    /// Decide: a retry after the backoff, or the dead letter.
    async fn decide(
        &self,
        msg: &IncomingMessage,
        job: &Job<C::Payload>,
        attempt: u32,
        failure: ProcessError,
    ) -> RecordOutcome {
        let policy = &self.settings.policy;
        let after = crate::decision::decide(
            &failure,
            attempt,
            policy,
            &mut *self.rng.lock().expect("rng lock"),
        );
        let error = failure.to_string();
        match after {
            AfterFailure::Retry { after } => RecordOutcome::Retry {
                attempt,
                after,
                error,
            },
            AfterFailure::DeadLetter(kind) => {
                let (ids, digest) = (job.envelope.ids(), Some(&job.digest));
                self.dead_letter(
                    msg,
                    &ids,
                    digest,
                    attempt,
                    kind,
                    error,
                    Settle::ThroughTheFence,
                )
                .await
            }
        }
    }

    pub(super) fn hand_back(&self, error: String, retry_after: Duration) -> RecordOutcome {
        RecordOutcome::HandedBack { retry_after, error }
    }

    /// How long a record waits when the database is unavailable: the retry policy's backoff for
    /// its delivery, so an outage does not spend the queue's receives (and its redrive) in
    /// seconds.
    pub(super) fn unavailable_delay(&self, msg: &IncomingMessage) -> Duration {
        let policy = &self.settings.policy;
        let n = msg.receive_count.clamp(1, policy.max_attempts());
        policy.delay_after(n, &mut *self.rng.lock().expect("rng lock"))
    }

    /// After a fence settle that could not finish: soon when a copy holds the fence (it will
    /// end shortly), with backoff when the database failed.
    pub(super) fn retry_after(&self, error: &FenceError, msg: &IncomingMessage) -> Duration {
        match error {
            FenceError::Contended => self.settings.contended_retry_after,
            FenceError::Database(_) => self.unavailable_delay(msg),
        }
    }
}
