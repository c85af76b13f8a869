//! A whole SQS batch through the harness: the duplicates found in one statement, the new jobs
//! committed together in batch mode, the rest one by one.
//!
//! Invariants:
//! - a record whose job's fence is committed is acked as a duplicate without a transaction (a
//!   committed fence is final); one statement answers that for the whole batch;
//! - in batch mode the first deliveries' new jobs share one transaction: their fences claimed
//!   in one statement in job id order (so overlapping batches never deadlock), their work, one
//!   check that the transaction is whole and every fence its own, one `COMMIT`. A job's effect
//!   commits if and only if its fence does;
//! - whatever stops that transaction (an error of any class, a panic, a constraint, a contended
//!   fence, a `COMMIT` that fails) rolls it back whole, and the batch's jobs then go one by one
//!   exactly as without batch mode: one bad job costs only itself, and its classification,
//!   retries and letter are the per-job ones; nothing is charged for the batch's attempt;
//! - repeat deliveries (retries, survivors of a crash) never join a batch: they run one at a
//!   time, fewest executions first, so a crash is charged to the job that was running.

use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job, ProcessError};
use crate::envelope::JobDigest;
use crate::envelope::{Envelope, read_job_id};
use crate::execution::executions_of;
use crate::fence::{claim_job_fences, conflicts, finish_jobs, processed_digests};
use crate::ids::JobId;
use crate::metrics::Metric;
use futures_util::{FutureExt, StreamExt};
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;

/// How a consumer commits its new jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// One transaction per job (the default).
    #[default]
    PerJob,
    /// One transaction for a batch's new jobs ([`Consumer::handle_batch`]), falling back to
    /// one per job when it does not commit.
    Batch,
}

impl CommitMode {
    /// As `COMMIT_MODE` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PerJob => "per-job",
            Self::Batch => "batch",
        }
    }

    /// The mode spelled `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::PerJob, Self::Batch]
            .into_iter()
            .find(|m| m.as_str() == s)
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
        let mut outcomes: Vec<Option<RecordOutcome>> = vec![None; msgs.len()];
        let jobs: Vec<Option<JobId>> = msgs.iter().map(|m| read_job_id(&m.body)).collect();
        let known: Vec<JobId> = jobs.iter().flatten().copied().collect();
        // One round trip for the whole batch; if it fails, every record finds out on its own.
        let done = processed_digests(&self.pool, self.consumer.name(), &known)
            .await
            .unwrap_or_default();
        let mut conflicting = Vec::new();
        let (mut fresh, mut seen_before) = (Vec::new(), Vec::new());
        // A job runs once per SQS batch, by its first record; its later records with the same
        // body take their outcome from that run and are never charged an execution of their
        // own. One with another body is no copy: it runs on its own, after the others.
        let mut first_of: HashMap<JobId, usize> = HashMap::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for (i, msg) in msgs.iter().enumerate() {
            let first = jobs[i].and_then(|j| first_of.get(&j).copied());
            if let Some(committed) = jobs[i].and_then(|j| done.get(&j)) {
                if conflicts(committed.as_ref(), &self.digest_of(&msg.body)) {
                    conflicting.push(i);
                } else {
                    tracing::debug!(message_id = %msg.message_id, "duplicate of a processed job");
                    self.metrics.increment(Metric::DuplicateSkipped);
                    outcomes[i] = Some(RecordOutcome::Duplicate);
                }
            } else if let Some(first) = first {
                if msgs[first].body == msg.body {
                    copies.push((i, first));
                } else {
                    seen_before.push(i);
                }
            } else {
                if let Some(job) = jobs[i] {
                    first_of.insert(job, i);
                }
                if msg.receive_count == 1 {
                    fresh.push(i);
                } else {
                    seen_before.push(i);
                }
            }
        }
        if self.settings.commit == CommitMode::Batch && fresh.len() > 1 && may_start() {
            let (together, alone) = self.commit_together(msgs, &fresh).await;
            for (i, outcome) in together {
                outcomes[i] = Some(outcome);
            }
            fresh = alone;
        }
        let each = |i: usize| async move {
            if !may_start() {
                tracing::warn!(message_id = %msgs[i].message_id, "deadline near: handing the record back unstarted");
                return (i, None);
            }
            (i, Some(self.process(&msgs[i]).await))
        };
        let concurrent: Vec<(usize, Option<RecordOutcome>)> = futures_util::stream::iter(fresh)
            .map(each)
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for (i, outcome) in concurrent {
            outcomes[i] = outcome;
        }
        seen_before = self.least_run_first(msgs, &jobs, seen_before).await;
        for i in seen_before {
            let (i, outcome) = each(i).await;
            outcomes[i] = outcome;
        }
        for i in conflicting {
            if may_start() {
                let ids = crate::envelope::read_ids(&msgs[i].body);
                let digest = self.digest_of(&msgs[i].body);
                let outcome = self.conflict(&msgs[i], &ids, &digest).await;
                self.metrics.increment(outcome.metric());
                outcomes[i] = Some(outcome);
            }
        }
        for (copy, first) in copies {
            let outcome = outcomes[first].as_ref().map(RecordOutcome::of_a_copy);
            if let Some(outcome) = &outcome {
                self.metrics.increment(outcome.metric());
            }
            outcomes[copy] = outcome;
        }
        outcomes
    }

    /// The digest of what makes up the job in `body`, as [`Envelope::parse_job`] takes it.
    fn digest_of(&self, body: &str) -> JobDigest {
        let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        JobDigest::of(&value, self.consumer.job_fields())
    }

    /// Repeat deliveries ordered so that jobs with fewer executions charged go first: a job that
    /// crashed its batch has been charged for it, so its batch-mates, which never ran, commit
    /// before it runs again. Ties keep the order of fewer receives. If the ledger cannot be
    /// read, receives alone order them (each record then reports its own database failure).
    async fn least_run_first(
        &self,
        msgs: &[IncomingMessage],
        jobs: &[Option<JobId>],
        mut indices: Vec<usize>,
    ) -> Vec<usize> {
        if indices.len() < 2 {
            return indices;
        }
        let known: Vec<JobId> = indices.iter().filter_map(|&i| jobs[i]).collect();
        let executions = executions_of(&self.pool, self.consumer.name(), &known)
            .await
            .unwrap_or_default();
        indices.sort_by_key(|&i| {
            let ran = jobs[i]
                .and_then(|j| executions.get(&j).copied())
                .unwrap_or(0);
            (ran, msgs[i].receive_count)
        });
        indices
    }

    /// Commits the new jobs of `fresh` (indices into `msgs`) together. Returns the outcomes it
    /// settled, and the indices left to go one by one: poison (each writes its own letter), or
    /// everything when the batch did not commit.
    async fn commit_together(
        &self,
        msgs: &[IncomingMessage],
        fresh: &[usize],
    ) -> (Vec<(usize, RecordOutcome)>, Vec<usize>) {
        // `fresh` holds one record per job (see `process_batch`).
        let mut alone = Vec::new();
        let mut runners: Vec<(usize, Envelope<C::Payload>, JobDigest)> = Vec::new();
        for &i in fresh {
            match Envelope::<C::Payload>::parse_job(&msgs[i].body, self.consumer.job_fields()) {
                Err(_) => alone.push(i),
                Ok((envelope, digest)) => runners.push((i, envelope, digest)),
            }
        }
        if runners.len() < 2 {
            alone.extend(runners.iter().map(|(i, _, _)| *i));
            return (Vec::new(), alone);
        }
        // In job id order: the fences are claimed so (`core.claim_fences` orders them too), and
        // the consumer's batch work sees them so, which keeps its own row locks in one order.
        runners.sort_by_key(|(_, e, _)| e.job_id);
        let indices: Vec<(usize, JobId)> = runners.iter().map(|(i, e, _)| (*i, e.job_id)).collect();
        let started_at = self.clock.now();
        let jobs: Vec<Job<C::Payload>> = runners
            .into_iter()
            .map(|(_, envelope, digest)| Job {
                envelope,
                attempt: 1,
                started_at,
                digest,
                metrics: self.metrics.clone(),
            })
            .collect();
        match self.attempt_together(jobs).await {
            Ok(claimed) => {
                self.metrics.increment(Metric::BatchCommitted);
                let mut settled = Vec::new();
                for (i, job) in indices {
                    if claimed.contains(&job) {
                        self.metrics.increment(Metric::Processed);
                        settled.push((i, RecordOutcome::Processed));
                    } else {
                        // Its fence appeared since the lookup: alone, the claim tells a
                        // duplicate from another job under its id.
                        alone.push(i);
                    }
                }
                (settled, alone)
            }
            Err(reason) => {
                self.metrics.increment(Metric::BatchFellBack);
                tracing::warn!(jobs = indices.len(), reason = %reason,
                    "the batch did not commit; its jobs run one by one");
                alone.extend(indices.iter().map(|(i, _)| *i));
                (Vec::new(), alone)
            }
        }
    }

    /// One transaction for `jobs` (in job id order): their fences in one statement, the
    /// consumer's batch work, the check that the transaction is whole, `COMMIT`. Returns the
    /// jobs it committed (the others were already processed). Any failure rolls back all, and
    /// the `ROLLBACK` has been answered before this returns: the one-by-one fallback that
    /// follows must not meet the batch's own uncommitted fences (a dropped transaction would
    /// send its `ROLLBACK` only later, from the pool, and the fallback would find them held).
    async fn attempt_together(
        &self,
        jobs: Vec<Job<C::Payload>>,
    ) -> Result<HashSet<JobId>, ProcessError> {
        let mut tx = self.pool.begin().await?;
        match self.work_together(jobs, &mut tx).await {
            Ok(claimed) => {
                tx.commit().await.map_err(|e| {
                    ProcessError::transient(format!(
                        "COMMIT failed ({e}); each job settles through its fence one by one"
                    ))
                })?;
                Ok(claimed)
            }
            Err(error) => {
                if let Err(e) = tx.rollback().await {
                    // The connection is broken, and the server ends its transaction with it.
                    tracing::warn!(error = %e, "the batch's ROLLBACK failed");
                }
                Err(error)
            }
        }
    }

    /// The batch's transaction up to its `COMMIT`, on `tx`.
    async fn work_together(
        &self,
        jobs: Vec<Job<C::Payload>>,
        tx: &mut sqlx::PgConnection,
    ) -> Result<HashSet<JobId>, ProcessError> {
        let consumer = self.consumer.name();
        let started_at = jobs[0].started_at;
        let pairs: Vec<_> = jobs
            .iter()
            .map(|j| (j.envelope.job_id, j.envelope.tenant_id, Some(j.digest)))
            .collect();
        let claimed = claim_job_fences(
            tx,
            consumer,
            &pairs,
            started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await
        .map_err(|e| ProcessError::transient(format!("claiming the batch's fences: {e}")))?;
        let to_run: Vec<Job<C::Payload>> = jobs
            .into_iter()
            .filter(|j| claimed.contains(&j.envelope.job_id))
            .collect();
        if !to_run.is_empty() {
            let work = AssertUnwindSafe(self.consumer.handle_batch(&to_run, tx))
                .catch_unwind()
                .await;
            match work {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => return Err(ProcessError::transient("the batch's work panicked")),
            }
            let finished: Vec<(JobId, Option<JobDigest>)> = to_run
                .iter()
                .map(|j| (j.envelope.job_id, Some(j.digest)))
                .collect();
            finish_jobs(tx, consumer, &finished, started_at)
                .await
                .map_err(|e| {
                    ProcessError::transient(format!("the batch's transaction is not whole: {e}"))
                })?;
        }
        Ok(claimed)
    }
}
