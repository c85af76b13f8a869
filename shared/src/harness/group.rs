//! Batch mode's commit group: the new jobs of one SQS batch committed in one transaction.
//!
//! Invariants:
//! - a group is the first deliveries' new jobs of one SQS batch, one record per job, two at
//!   least: their fences claimed in one statement in job id order (so overlapping groups never
//!   deadlock), their work, one check that the transaction is whole and every fence its own, one
//!   `COMMIT`, all through the one transaction routine ([`Harness::transact`]). A job's effect
//!   commits if and only if its fence does;
//! - whatever stops that transaction (an error of any class, a panic, a constraint, a contended
//!   fence, a `COMMIT` that fails) rolls it back whole, and the group's jobs then go one by one
//!   exactly as without batch mode: one bad job costs only itself, and its classification,
//!   retries and letter are the per-job ones; nothing is charged for the group's attempt.

use super::attempt::{Committed, Jobs, Unfinished};
use super::parsed::{ParsedJob, Record};
use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job};
use crate::ids::bounded_correlation_id;
use crate::metrics::Metric;
use crate::telemetry::{RECORD_SPAN_TARGET, otel};
use tracing::Instrument;

impl<C: Consumer> Harness<C> {
    /// Commits the new jobs of `fresh` (one record per job, see `process_batch`) as one group and
    /// writes the outcomes it settles. Returns the records left to go one by one: poison (each
    /// writes its own letter), a job whose fence appeared since the lookup (alone, the claim
    /// tells a duplicate from another job under its id), or all when the group did not commit.
    /// With `intake` (the statement receiving the batch's poison in the letters' intake), the
    /// rows commit with the group, and what its statement answered comes back; `None` when no row was received
    /// (no group formed, or it committed no job): the poison is still the caller's to receive.
    /// The rows come with the group's span, where the poison's records hang theirs.
    pub(super) async fn commit_group(
        &self,
        msgs: &[IncomingMessage],
        fresh: Vec<Record<C::Payload>>,
        order: WorkOrder,
        outcomes: &mut [Option<RecordOutcome>],
        intake: Option<&str>,
    ) -> (
        Vec<Record<C::Payload>>,
        Option<(Vec<sqlx::postgres::PgRow>, tracing::Span)>,
    ) {
        let (mut alone, runners) = split_poison(fresh);
        let (runners, repeated) = one_record_per_job(runners);
        alone.extend(repeated.into_iter().map(|(i, job)| (i, Ok(job))));
        if runners.len() < 2 {
            alone.extend(runners.into_iter().map(|(i, job)| (i, Ok(job))));
            return (alone, None);
        }
        let (members, mut group) = self.group_of(runners, order);
        let started = self.clock.now();
        // The group's statements are its jobs': a span of its own, which each job's hangs from.
        let span =
            tracing::error_span!(target: RECORD_SPAN_TARGET, "commit group", jobs = members.len());
        let wall = std::time::SystemTime::now();
        let committed = self
            .transact(Jobs::Group(&mut group, intake))
            .instrument(span.clone())
            .await;
        let (committed, received) = self.count_group(committed, members.len());
        for (i, job) in members.into_iter().zip(group) {
            if committed.contains(&job.envelope.job_id) {
                self.metrics.increment(Metric::Processed);
                self.observe_duration_since(started);
                let envelope = &job.envelope;
                let ids = [
                    ("consumer", self.consumer.name().as_str().to_owned()),
                    ("message_id", msgs[i].message_id.clone()),
                    ("job_id", envelope.job_id.to_string()),
                    ("tenant_id", envelope.tenant_id.to_string()),
                    (
                        "correlation_id",
                        bounded_correlation_id(&envelope.correlation_id).into_owned(),
                    ),
                    ("attempt", "1".to_owned()),
                ];
                otel::group_member(&span, wall, msgs[i].delivery(), &ids);
                outcomes[i] = Some(RecordOutcome::Processed);
            } else {
                alone.push((i, Ok((job.envelope, job.digest))));
            }
        }
        (alone, received.map(|rows| (rows, span)))
    }

    /// The jobs of a group in `order`, and the index of each one's record.
    fn group_of(
        &self,
        mut runners: Vec<Runner<C::Payload>>,
        order: WorkOrder,
    ) -> (Vec<usize>, Vec<Job<C::Payload>>) {
        match order {
            WorkOrder::JobId => runners.sort_by_key(|(_, (envelope, _))| envelope.job_id),
            WorkOrder::Delivery => runners.sort_by_key(|(i, _)| *i),
        }
        let started_at = self.clock.now();
        let job = |(envelope, digest)| Job {
            envelope,
            attempt: 1,
            started_at,
            digest,
            metrics: self.metrics.clone(),
        };
        runners
            .into_iter()
            .map(|(i, parsed)| (i, job(parsed)))
            .unzip()
    }

    /// Counts how the group's transaction ended, and says which of its jobs committed (none
    /// when it did not commit: then they all go one by one), and the intake rows it received.
    fn count_group(
        &self,
        ended: Result<Committed, Unfinished>,
        jobs: usize,
    ) -> (
        std::collections::HashSet<crate::ids::JobId>,
        Option<Vec<sqlx::postgres::PgRow>>,
    ) {
        match ended {
            Ok(Committed(claimed, received)) => {
                self.metrics.increment(Metric::BatchCommitted);
                (claimed, received)
            }
            Err(unfinished) => {
                self.metrics.increment(Metric::BatchFellBack);
                let reason = why_not_committed(&unfinished);
                tracing::warn!(jobs, reason = %reason,
                    "the batch did not commit; its jobs run one by one, each logged in its own span");
                Default::default()
            }
        }
    }
}

/// The order in which a commit group's work sees its jobs (its fences are claimed in job id
/// order either way: `core.claim_job_fences` orders them, so overlapping groups never deadlock
/// on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkOrder {
    /// Job id order: the consumer's own row locks are taken in one order too.
    JobId,
    /// The order the SQS batch delivered them in: a FIFO batch's, which is its groups' order.
    Delivery,
}

/// A record whose body is a job, which can join a group.
type Runner<P> = (usize, ParsedJob<P>);

/// Poison (each record writes its own letter), apart from the jobs that can join a group.
fn split_poison<P>(fresh: Vec<Record<P>>) -> (Vec<Record<P>>, Vec<Runner<P>>) {
    let (mut poison, mut runners) = (Vec::new(), Vec::new());
    for (i, parsed) in fresh {
        match parsed {
            Ok(job) => runners.push((i, job)),
            Err(e) => poison.push((i, Err(e))),
        }
    }
    (poison, runners)
}

/// The records of `runners` whose job id no earlier record of them has, and those that repeat
/// one: a group holds one record per job, since its claim and its outcome are by job id (the
/// batch's plan already keeps them apart; this keeps the group's own invariant whatever its
/// caller hands it).
fn one_record_per_job<P>(runners: Vec<Runner<P>>) -> (Vec<Runner<P>>, Vec<Runner<P>>) {
    let mut seen = std::collections::HashSet::new();
    runners
        .into_iter()
        .partition(|(_, (envelope, _))| seen.insert(envelope.job_id))
}

/// Why a group did not commit, as its fallback's warning says it.
fn why_not_committed(unfinished: &Unfinished) -> String {
    match unfinished {
        Unfinished::Claim(e) => format!("claiming the batch's fences: {e}"),
        Unfinished::Failed(e) => e.to_string(),
        Unfinished::CommitUnknown(e) => {
            format!("COMMIT failed ({e}); each job settles through its fence one by one")
        }
        // A group's claim leaves a job whose fence is there out of the group instead.
        Unfinished::Duplicate | Unfinished::Conflict => "the job's fence was there already".into(),
    }
}
