//! A whole SQS batch through the harness: the duplicates found in one statement, the new jobs
//! committed as one commit group in batch mode, the rest one by one. Each body is parsed once,
//! and what it parsed to is carried to wherever the record goes.
//!
//! Invariants:
//! - a record whose job's fence is committed is acked as a duplicate without a transaction (a
//!   committed fence is final); one statement answers that for the whole SQS batch;
//! - in batch mode the first deliveries' new jobs share one transaction, a commit group (see
//!   [`super::group`]);
//! - repeat deliveries (retries, survivors of a crash) never join a commit group: they run one at
//!   a time, fewest executions first, so a crash is charged to the job that was running.

use super::parsed::{Parsed, Record, digest_of, key_of};
use super::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use crate::consumer::Consumer;
use crate::envelope::{JobDigest, PartialIds};
use crate::fence::{conflicts, processed_digests};
use crate::ids::JobId;
use crate::ledger::executions_of;
use futures_util::StreamExt;
use std::collections::HashMap;

/// An SQS batch sorted by what each of its records needs.
pub(super) struct Plan<P> {
    /// The job id each record's one parse read ([`key_of`]): the lookup's, the commit group's
    /// and the ledger's.
    pub(super) keys: Vec<Option<JobId>>,
    /// New jobs on their first delivery: a commit group in batch mode, else concurrently.
    pub(super) fresh: Vec<Record<P>>,
    /// Repeat deliveries: one at a time, fewest executions first.
    pub(super) repeats: Vec<Record<P>>,
    /// Records of a job id met earlier in the batch with another digest (another job under
    /// the id): each runs alone after the record before it, never in a commit group, so the
    /// fence decides it as it would two messages.
    pub(super) later: Vec<Record<P>>,
    /// For each record in `later` that follows an earlier record of its job id, that record.
    pub(super) follows: HashMap<usize, usize>,
    /// Copies of a processed job under its id but with another digest: conflict letters.
    pub(super) conflicting: Vec<(usize, PartialIds, JobDigest)>,
    /// Later records of a job with the same digest, each with the record that runs the job and
    /// its ids (from its one parse).
    pub(super) copies: Vec<(usize, usize, PartialIds)>,
}

impl<P> Plan<P> {
    fn new(keys: Vec<Option<JobId>>) -> Self {
        Self {
            keys,
            fresh: Vec::new(),
            repeats: Vec::new(),
            later: Vec::new(),
            follows: HashMap::new(),
            conflicting: Vec::new(),
            copies: Vec::new(),
        }
    }

    /// Where the first record of a job in the batch goes: a first delivery is fresh, any other
    /// a repeat.
    fn runs(&mut self, msg: &IncomingMessage) -> &mut Vec<Record<P>> {
        if msg.receive_count == 1 {
            &mut self.fresh
        } else {
            &mut self.repeats
        }
    }
}

impl<C: Consumer> Harness<C> {
    /// Processes one SQS batch and says what became of each message, in order: `None` for one
    /// not started because `may_start` said no (the Lambda deadline is near; hand it back
    /// untouched). First deliveries run together in batch mode, else concurrently up to
    /// `concurrency`; repeat deliveries run one at a time, fewest executions first.
    pub async fn process_batch(
        &self,
        msgs: &[IncomingMessage],
        may_start: &(dyn Fn() -> bool + Sync),
        concurrency: usize,
    ) -> Vec<Option<RecordOutcome>> {
        if msgs.iter().any(|m| m.message_group.is_some()) {
            return self.process_fifo_batch(msgs, may_start, concurrency).await;
        }
        let mut outcomes: Vec<Option<RecordOutcome>> = vec![None; msgs.len()];
        let mut plan = self.plan(msgs, &mut outcomes).await;
        let batch = self.settings.commit == CommitMode::Batch;
        let poison = plan.fresh.iter().filter(|(_, p)| p.is_err()).count();
        // Poison has no effect to commit, so it goes together in either commit mode (per job,
        // a lone poison record goes on its own: one letter needs no intake round; unless the
        // consumer settles with a due, when its row is one insert and the round that settles
        // it takes the rows received beside it, see `SETTLE_DUE`).
        let lone = poison > 0 && !self.settings.settle_due.is_zero();
        let grouped = plan.fresh.len() > 1 && (poison > 1 || (batch && poison > 0));
        let together = (grouped || lone) && may_start();
        let (poison, fresh): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.fresh)
            .into_iter()
            .partition(|(_, p)| together && p.is_err());
        // The poison is received beside the jobs, not before them: it has no effect, and its
        // settle goes through each job's fence as any other writer's settle does (a settler of
        // another invocation settles beside this batch's jobs all the same). In batch mode its
        // rows ride in the commit group's transaction (one commit for both); otherwise, or if
        // the group received none, in a statement of their own beside the jobs.
        let mut poison_outcomes: Vec<Option<RecordOutcome>> = vec![None; msgs.len()];
        let (mut fresh, mut poison) = (fresh, poison);
        if batch && fresh.len() > 1 && may_start() {
            (fresh, poison) = (self.commit_group_receiving(
                msgs,
                fresh,
                poison,
                &mut outcomes,
                &mut poison_outcomes,
            ))
            .await;
        }
        let poisoned = self.poison_together(msgs, poison, &mut poison_outcomes);
        let jobs = self.run_beside(msgs, fresh, may_start, concurrency);
        let (unreceived, ran) = futures_util::join!(poisoned, jobs);
        // Poison that could not be received together goes one by one (each with the
        // as-received fallback).
        let ran = ran.into_iter().chain(
            self.run_beside(msgs, unreceived, may_start, concurrency)
                .await,
        );
        for (i, outcome) in ran.chain(poison_outcomes.into_iter().enumerate()) {
            if outcome.is_some() {
                outcomes[i] = outcome;
            }
        }
        // Then one at a time: repeats least run first, then the later records of a job id.
        let repeats = self.least_run_first(msgs, &plan.keys, plan.repeats).await;
        for record in repeats.into_iter().chain(plan.later) {
            let (i, outcome) = self.start(msgs, record, may_start).await;
            outcomes[i] = outcome;
        }
        self.write_conflicts(msgs, plan.conflicting, may_start, &mut outcomes)
            .await;
        self.answer_copies(msgs, plan.copies, &mut outcomes);
        outcomes
    }

    /// `records` run side by side, up to `concurrency` at once: each record's outcome, `None`
    /// for one not started because `may_start` said no.
    async fn run_beside(
        &self,
        msgs: &[IncomingMessage],
        records: Vec<Record<C::Payload>>,
        may_start: &(dyn Fn() -> bool + Sync),
        concurrency: usize,
    ) -> Vec<(usize, Option<RecordOutcome>)> {
        futures_util::stream::iter(records)
            .map(|record| self.start(msgs, record, may_start))
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await
    }

    /// One record run on its own, unless `may_start` says no (then handed back unstarted).
    async fn start(
        &self,
        msgs: &[IncomingMessage],
        (i, parsed): Record<C::Payload>,
        may_start: &(dyn Fn() -> bool + Sync),
    ) -> (usize, Option<RecordOutcome>) {
        if !may_start() {
            self.unstarted(&msgs[i], &super::parsed::ids_of(&parsed));
            return (i, None);
        }
        (i, Some(self.process_parsed(&msgs[i], parsed).await))
    }

    /// Says, in the record's span, that `msg` is handed back unstarted: the deadline is near.
    pub(super) fn unstarted(&self, msg: &IncomingMessage, ids: &PartialIds) {
        let span = self.span(msg, ids);
        crate::telemetry::otel::conclude_job(&span, "handed_back", false);
        let _in_its_span = span.entered();
        tracing::warn!("deadline near: handing the record back unstarted");
    }

    /// The committed fences among `jobs`, each with its digest: one statement, on a lane (no
    /// round trip of the pool's own when it is done).
    async fn lookup(&self, jobs: &[JobId]) -> sqlx::Result<HashMap<JobId, Option<JobDigest>>> {
        let mut lane = self.lanes.take(&self.pool).await?;
        lane.entered();
        let found = processed_digests(lane.conn(), self.consumer.name(), jobs).await?;
        lane.ended();
        Ok(found)
    }

    /// Looks the batch's jobs up in one statement (if it fails, every record finds out on its
    /// own) and sorts the records; a duplicate of a processed job is answered at once.
    pub(super) async fn plan(
        &self,
        msgs: &[IncomingMessage],
        outcomes: &mut [Option<RecordOutcome>],
    ) -> Plan<C::Payload> {
        let parsed: Vec<Parsed<C::Payload>> = msgs.iter().map(|m| self.parse(m)).collect();
        let keys: Vec<Option<JobId>> = parsed.iter().map(key_of).collect();
        let known: Vec<JobId> = keys.iter().flatten().copied().collect();
        let done = self.lookup(&known).await.unwrap_or_default();
        let mut plan = Plan::new(keys);
        // A job runs once per SQS batch, by its first record; its later records with the same
        // digest (the same job, however it is spelled) take their outcome from that run and are
        // never charged an execution of their own. One with another digest is another job
        // under the id: it runs on its own, after the others. So does a replay beside another
        // delivery of its job (or a delivery beside a replay): its letter's review sent it to
        // run, and the other's outcome (the letter it already had) does not answer for it.
        let mut first_of: HashMap<JobId, (usize, Option<JobDigest>)> = HashMap::new();
        for (i, (msg, parsed)) in msgs.iter().zip(parsed).enumerate() {
            let key = plan.keys[i];
            let digest = digest_of(&parsed);
            if let Some(committed) = key.and_then(|j| done.get(&j)) {
                outcomes[i] = self.copy_of_processed(&mut plan, i, msg, parsed, committed.as_ref());
            } else if let Some(&(first, first_digest)) = key.and_then(|j| first_of.get(&j)) {
                if digest.is_some()
                    && digest == first_digest
                    && msg.replay_of == msgs[first].replay_of
                {
                    plan.copies.push((i, first, super::parsed::ids_of(&parsed)));
                } else {
                    plan.follows.insert(i, first);
                    plan.later.push((i, parsed));
                }
            } else {
                // Poison is never the record a job's copies take their outcome from: a copy
                // of it in a spelling the payload type reads must run, not take its letter.
                if let (Some(job), true) = (key, parsed.is_ok()) {
                    first_of.insert(job, (i, digest));
                }
                plan.runs(msg).push((i, parsed));
            }
        }
        plan
    }

    /// A record of a job whose fence is committed (with the digest `committed`): a duplicate,
    /// answered now, or another job under its id, planned as a conflict letter.
    fn copy_of_processed(
        &self,
        plan: &mut Plan<C::Payload>,
        i: usize,
        msg: &IncomingMessage,
        parsed: Parsed<C::Payload>,
        committed: Option<&JobDigest>,
    ) -> Option<RecordOutcome> {
        let ids = super::parsed::ids_of(&parsed);
        match digest_of(&parsed) {
            Some(digest) if conflicts(committed, &digest) => {
                plan.conflicting.push((i, ids, digest));
                None
            }
            // Poison that still reads as the committed job's id: its digest says whether it is
            // the job (a duplicate) or not (its own letter, which the fence settles).
            None => {
                plan.later.push((i, parsed));
                None
            }
            Some(_) => {
                // Counted and logged in its own span, as every record the harness answers.
                self.count_and_log(&self.span(msg, &ids), &RecordOutcome::Duplicate);
                Some(RecordOutcome::Duplicate)
            }
        }
    }

    /// Repeat deliveries ordered so that jobs with fewer executions charged go first (see
    /// [`Harness::least_run_key`]).
    async fn least_run_first(
        &self,
        msgs: &[IncomingMessage],
        keys: &[Option<JobId>],
        mut repeats: Vec<Record<C::Payload>>,
    ) -> Vec<Record<C::Payload>> {
        if repeats.len() < 2 {
            return repeats;
        }
        let records: Vec<usize> = repeats.iter().map(|&(i, _)| i).collect();
        let key = self.least_run_key(msgs, keys, &records).await;
        repeats.sort_by_key(|&(i, _)| key(i));
        repeats
    }

    /// The sort key that puts the records at `records` with fewer executions charged first: a
    /// job that crashed its batch has been charged for it, so its batch-mates, which never ran,
    /// commit before it runs again. Ties go to fewer receives. One read of the ledger; if it
    /// cannot be read, receives alone order them (each record then reports its own database
    /// failure).
    pub(super) async fn least_run_key<'a>(
        &self,
        msgs: &'a [IncomingMessage],
        keys: &'a [Option<JobId>],
        records: &[usize],
    ) -> impl Fn(usize) -> (u32, u32) + 'a {
        let known: Vec<JobId> = records.iter().filter_map(|&i| keys[i]).collect();
        let executions = executions_of(&self.pool, self.consumer.name(), &known)
            .await
            .unwrap_or_default();
        move |i| {
            let ran = keys[i]
                .and_then(|j| executions.get(&j).copied())
                .unwrap_or(0);
            (ran, msgs[i].receive_count)
        }
    }

    /// The conflict letters of the batch, while the deadline allows.
    async fn write_conflicts(
        &self,
        msgs: &[IncomingMessage],
        conflicting: Vec<(usize, PartialIds, JobDigest)>,
        may_start: &(dyn Fn() -> bool + Sync),
        outcomes: &mut [Option<RecordOutcome>],
    ) {
        for (i, ids, digest) in conflicting {
            if may_start() {
                outcomes[i] = Some(self.conflict_letter(&msgs[i], &ids, &digest).await);
            }
        }
    }

    /// Each copy of a job in the batch takes its outcome from the record that ran the job.
    fn answer_copies(
        &self,
        msgs: &[IncomingMessage],
        copies: Vec<(usize, usize, PartialIds)>,
        outcomes: &mut [Option<RecordOutcome>],
    ) {
        for (copy, first, ids) in copies {
            let outcome = outcomes[first].as_ref().map(RecordOutcome::of_a_copy);
            if let Some(outcome) = &outcome {
                // In its own span, as the FIFO path answers a copy: its delivery is traced too.
                self.count_and_log(&self.span(&msgs[copy], &ids), outcome);
            }
            outcomes[copy] = outcome;
        }
    }
}
