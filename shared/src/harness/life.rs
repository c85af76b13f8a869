//! The life of one message, as named steps: parse, ledger, claim and run (one transaction),
//! settle, decide. Each step hands the next what it needs, or stops the life with the message's
//! outcome; [`Harness::live`] reads as the story. What a body is read as is in `parsed.rs`;
//! the steps after the transaction (settle, charge, decide) in `failure.rs`.

use super::attempt::Jobs;
use super::letter::Settle;
use super::parsed::{Parsed, ParsedJob};
use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job};
use crate::dead_letter::{ErrorKind, Recorded};
use crate::envelope::{Envelope, JobDigest, Poison};
use crate::fence::conflicts;
use crate::ledger::{Ledger, Start, start_execution};

/// The end of a message's life, reached before its last step: the outcome is final.
pub(super) struct Stop(pub(super) RecordOutcome);

/// What a step gives the next one, or the [`Stop`] that ends the life there.
pub(super) type Step<T> = Result<T, Stop>;

/// Which execution a delivery is, and whether the ledger charged it before it ran.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempt {
    pub(super) number: u32,
    pub(super) charged: bool,
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
}
