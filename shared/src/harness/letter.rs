//! A message's dead letter, written the one way the harness writes letters: settled through the
//! fence first (a letter is a true record: a job that committed gets none), then paged.

use super::group::WorkOrder;
use super::parsed::Record;
use super::{ALERTS_PER_ROUND, Harness, IncomingMessage, RecordOutcome};
use crate::consumer::Consumer;
use crate::dead_letter::{
    CONFLICT_ERROR, ErrorKind, NewDeadLetter, Received, Recorded, Settled, receipt_of,
    receive_and_settle, receiving_statement, record_unless_processed, record_without_settling,
    settle_received,
};
use crate::envelope::{JobDigest, PartialIds};
use crate::fence::FenceError;
use crate::ids::JobId;
use tracing::Instrument;

/// Whether a letter is settled through the fence before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// Only if the job did not commit (every letter but a conflict).
    ThroughTheFence,
    /// As it is (a conflict: the fence stands for another job).
    Not,
}

impl<C: Consumer> Harness<C> {
    /// The conflict letter of `msg`, a copy of a processed job under its id with another
    /// `digest`: in its record's span, with its metric and line, as every record the harness
    /// settles.
    pub(super) async fn conflict_letter(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: &JobDigest,
    ) -> RecordOutcome {
        let span = self.span(msg, ids);
        let outcome = self
            .conflict(msg, ids, digest)
            .instrument(span.clone())
            .await;
        self.count_and_log(&span, &outcome);
        outcome
    }

    /// A copy of a processed job whose payload differs: another job under its id. Its letter
    /// is written without settling (the fence says the id committed, for the other job). Unless
    /// it is the body an operator edited away from, the edit having committed: then it is the
    /// job's duplicate.
    pub(super) async fn conflict(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: &JobDigest,
    ) -> RecordOutcome {
        if let Some(job_id) = ids.job_id
            && self.edited_away(job_id, digest).await
        {
            return RecordOutcome::Duplicate;
        }
        let error = CONFLICT_ERROR.to_owned();
        let kind = ErrorKind::Conflict;
        self.dead_letter(msg, ids, Some(digest), 1, kind, error, Settle::Not)
            .await
    }

    /// Whether a copy of `job_id` with `digest` is a body of the committed job's family: one
    /// an operator edited away from, or an edit of it, a chain of any length
    /// (`core.job_family`). Unknown (the read failed): not a duplicate, and the conflict letter
    /// is written, a true record either way.
    async fn edited_away(&self, job_id: JobId, digest: &JobDigest) -> bool {
        let name = self.consumer.name();
        match crate::fence::fenced_as_the_same_job(&self.pool, job_id, name, digest).await {
            Ok(same) => same,
            Err(e) => {
                tracing::warn!(error = %e, "reading the job's family of edits failed; writing its conflict letter");
                false
            }
        }
    }

    /// The job's letter, once the fence has settled that it did not commit (or, for a
    /// [`conflict`](Self::conflict), without settling: the fence says the id committed, for
    /// another job), then paged.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn dead_letter(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        digest: Option<&JobDigest>,
        attempt: u32,
        kind: ErrorKind,
        error: String,
        settle: Settle,
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
            message_group: msg.message_group.as_deref(),
            digest_fields: self.consumer.job_fields(),
            trace: msg.trace.original(),
            nul_replaced: false,
        };
        let settled = self.record(&letter, digest, settle).await;
        match settled {
            Ok(Settled::AlreadyProcessed) => RecordOutcome::Duplicate,
            Ok(Settled::Recorded(letter)) => self.lettered(kind, letter, error).await,
            Ok(Settled::Conflict(letter)) => {
                self.lettered(ErrorKind::Conflict, letter, error).await
            }
            Err(e) => RecordOutcome::DeadLetterFailed {
                retry_after: self.retry_after(&e, msg),
                error: format!(
                    "writing the {kind} dead letter failed: {e}; original error: {error}"
                ),
            },
        }
    }

    /// Records `letter`, settled through the fence first unless told not to.
    async fn record(
        &self,
        letter: &NewDeadLetter<'_>,
        digest: Option<&JobDigest>,
        settle: Settle,
    ) -> Result<Settled, FenceError> {
        let (now, wait) = (self.clock.now(), self.settings.lock_timeout);
        if settle == Settle::ThroughTheFence {
            record_unless_processed(&self.pool, letter, digest, now, wait).await
        } else {
            record_without_settling(&self.pool, letter, digest, now)
                .await
                .map(Settled::Recorded)
        }
    }

    /// A letter is committed: a new one pages (within the alerter's budget), then the outcome.
    async fn lettered(&self, kind: ErrorKind, letter: Recorded, error: String) -> RecordOutcome {
        if let Recorded::New(_) = letter {
            self.page_new_letters().await;
        }
        RecordOutcome::DeadLettered {
            kind,
            letter,
            error,
        }
    }

    /// The paging rounds for `new_letters` a settle wrote (their groups paged before the writer
    /// returns), if alerting is on.
    async fn page_settled(&self, new_letters: usize) {
        if let Some(alerter) = &self.alerter {
            (alerter.page_new_letters(new_letters, ALERTS_PER_ROUND, &self.metrics)).await;
        }
    }

    /// One paging round for letters just committed (one or a batch's), if alerting is on.
    async fn page_new_letters(&self) {
        if let Some(alerter) = &self.alerter {
            let delivery = alerter.deliver_pending(ALERTS_PER_ROUND).await;
            self.metrics.count_delivery(&delivery);
        }
    }

    /// A batch's poison, received together (in either commit mode: poison has no effect to
    /// commit): the poison records of `fresh` (one or more) kept in the letters' intake and
    /// settled behind it ([`receive_and_settle`]: one narrow statement, then each through its
    /// job's fence, in bulk, one settler at a time per consumer). A record whose row this
    /// invocation settled is answered with its letter (or as a duplicate: its job committed);
    /// one left to the settler at work is answered [`Recorded::Received`]. Each is counted and
    /// logged in its own span. A storm of poison then costs its records one statement per
    /// batch, and its letters a round per hundreds. Returns the records left to go one by one:
    /// the rest, and the poison too if receiving them failed (each then writes its own letter,
    /// with the as-received fallback).
    pub(super) async fn poison_together(
        &self,
        msgs: &[IncomingMessage],
        fresh: Vec<Record<C::Payload>>,
        outcomes: &mut [Option<RecordOutcome>],
    ) -> Vec<Record<C::Payload>> {
        let (poison, mut rest): (Vec<_>, Vec<_>) = fresh.into_iter().partition(|(_, p)| p.is_err());
        if poison.is_empty() {
            return rest;
        }
        let started = self.clock.now();
        let letters = self.poison_letters(msgs, &poison);
        let (now, wait) = (self.clock.now(), self.settings.lock_timeout);
        let together = poison_span(letters.len());
        let due = self.settings.settle_due;
        let received = receive_and_settle(&self.pool, &letters, now, wait, due);
        let received = match received.instrument(together.clone()).await {
            Ok(received) => received,
            Err(e) => {
                tracing::warn!(error = %e, records = poison.len(),
                    "the batch's poison letters could not be received together; each goes alone");
                rest.extend(poison);
                return rest;
            }
        };
        drop(letters);
        self.answer_poison(msgs, poison, received, &together, started, outcomes)
            .await;
        rest
    }

    /// Batch mode's commit group for the new jobs of `fresh`, carrying the intake rows of the
    /// batch's `poison` in its transaction: one commit for the jobs and the rows, where the rows
    /// took one of their own ([`Harness::poison_together`]). The rows are settled behind the
    /// commit ([`settle_received`]) and each poison record answered as there, its span hanging
    /// from the group's, which holds the statement that received it. Returns the
    /// records left to go one by one (see [`Harness::commit_group`]) and the poison whose rows
    /// the group did not receive (no group formed, or it committed no job): all of it or none,
    /// for the caller to receive as before.
    pub(super) async fn commit_group_receiving(
        &self,
        msgs: &[IncomingMessage],
        fresh: Vec<Record<C::Payload>>,
        poison: Vec<Record<C::Payload>>,
        outcomes: &mut [Option<RecordOutcome>],
        poison_outcomes: &mut [Option<RecordOutcome>],
    ) -> (Vec<Record<C::Payload>>, Vec<Record<C::Payload>>) {
        let started = self.clock.now();
        let (now, wait) = (self.clock.now(), self.settings.lock_timeout);
        let letters = self.poison_letters(msgs, &poison);
        let probe = !self.settings.settle_due.is_zero();
        let statement = receiving_statement(&letters, now, probe);
        drop(letters);
        let order = WorkOrder::JobId;
        let group = self.commit_group(msgs, fresh, order, outcomes, statement.as_deref());
        let (left, received) = group.await;
        let Some((rows, together)) = received else {
            return (left, poison);
        };
        let receipt = match receipt_of(&rows) {
            Ok(receipt) if receipt.seqs.len() == poison.len() => receipt,
            // Committed, but not as the statement says it answers: the records are handed back
            // unanswered, and each is received again on its next delivery (its message's one
            // letter is settled once, whichever of its rows comes first).
            other => {
                tracing::error!(answered = ?other.map(|r| r.seqs.len()), records = poison.len(),
                    "the batch's poison rows were received with its group, and their keys misread");
                return (left, Vec::new());
            }
        };
        let (name, due) = (self.consumer.name(), self.settings.settle_due);
        let received = settle_received(&self.pool, name, receipt, now, wait, due);
        let received = received.instrument(together.clone()).await;
        self.answer_poison(msgs, poison, received, &together, started, poison_outcomes)
            .await;
        (left, Vec::new())
    }

    /// The letters of `poison` (the records whose bodies did not parse), as received.
    fn poison_letters<'a>(
        &'a self,
        msgs: &'a [IncomingMessage],
        poison: &'a [Record<C::Payload>],
    ) -> Vec<(NewDeadLetter<'a>, Option<&'a JobDigest>)> {
        poison
            .iter()
            .filter_map(|(i, parsed)| parsed.as_ref().err().map(|p| (&msgs[*i], p)))
            .map(|(msg, p)| {
                let letter = NewDeadLetter {
                    job_id: p.ids.job_id,
                    tenant_id: p.ids.tenant_id,
                    consumer: self.consumer.name(),
                    queue: &msg.queue,
                    message_id: &msg.message_id,
                    body: &msg.body,
                    attempts: 1,
                    kind: ErrorKind::Poison,
                    last_error: &p.reason,
                    correlation_id: p.ids.correlation_id.as_deref(),
                    replay_of: msg.replay_of,
                    message_group: msg.message_group.as_deref(),
                    digest_fields: self.consumer.job_fields(),
                    trace: msg.trace.original(),
                    nul_replaced: false,
                };
                (letter, p.digest.as_deref())
            })
            .collect()
    }

    /// The poison's rows are received (and settled as far as `received` says): paging rounds
    /// for the new letters the settle wrote (its own and others'), not one per letter (as many
    /// as their groups need, each of up to ALERTS_PER_ROUND); then each record answered, counted
    /// and logged in its own span, under `together`.
    async fn answer_poison(
        &self,
        msgs: &[IncomingMessage],
        poison: Vec<Record<C::Payload>>,
        received: Received,
        together: &tracing::Span,
        started: chrono::DateTime<chrono::Utc>,
        outcomes: &mut [Option<RecordOutcome>],
    ) {
        self.page_settled(received.new_letters).await;
        for ((i, parsed), settled) in poison.into_iter().zip(received.settled) {
            let Err(p) = parsed else { continue };
            let span = together.in_scope(|| self.span(&msgs[i], &p.ids));
            let lettered = |kind, letter, error| RecordOutcome::DeadLettered {
                kind,
                letter,
                error,
            };
            let outcome = match settled {
                Settled::AlreadyProcessed => RecordOutcome::Duplicate,
                Settled::Recorded(letter) => lettered(ErrorKind::Poison, letter, p.reason),
                Settled::Conflict(letter) => lettered(ErrorKind::Conflict, letter, p.reason),
            };
            self.observe_duration_since(started);
            self.count_and_log(&span, &outcome);
            outcomes[i] = Some(outcome);
        }
    }
}

/// The span of a call's letters: their statements are their jobs', and each job's span hangs
/// from it (as a commit group's does).
fn poison_span(jobs: usize) -> tracing::Span {
    tracing::error_span!(target: crate::telemetry::RECORD_SPAN_TARGET, "dead letters", jobs)
}
