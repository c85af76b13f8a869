//! A batch from a FIFO queue: SQS's order kept within each message group.
//!
//! Invariants:
//! - within a group, records run one at a time in the order SQS delivered them; once one is
//!   not done (it failed, was handed back, its letter could not be written, or it was not
//!   started), every later record of its group in the batch is held back unprocessed and
//!   uncharged ([`RecordOutcome::HeldBack`]), as SQS requires of a FIFO partial batch response.
//!   No later record of a group commits before an earlier one has;
//! - a record that becomes a letter (poison, permanent, exhausted, conflict) is done: its group
//!   goes on behind it, and a duplicate is done without running;
//! - a job runs once per batch: a later record of it with the same digest, in its group or
//!   another, takes the outcome of the record that ran it when its turn comes, and is held back
//!   (uncharged) if that record has not settled yet; one with another digest (another job under
//!   the id) runs alone in its place, never in a commit group beside the first;
//! - groups are independent. On a batch of first deliveries they run concurrently, unless two
//!   records of one job id are in it (then one group at a time in delivery order); when any
//!   record was delivered before (a crash may have been its doing), one record at a time, the
//!   groups whose next job has the fewest executions charged going first, so a crash is charged
//!   to the job that was running and not to another group's;
//! - in batch mode each group's leading new jobs join one commit group, its work seeing them in
//!   delivery order; what it does not commit runs as above, in order.

use super::batch::Plan;
use super::group::WorkOrder;
use super::parsed::{Parsed, Record, ids_of};
use super::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use crate::consumer::Consumer;
use crate::envelope::{JobDigest, PartialIds};
use crate::ids::JobId;
use futures_util::StreamExt;

/// What one record of a FIFO batch still needs.
enum Step<P> {
    /// Its life, from its parsed body.
    Run(Parsed<P>),
    /// Its life, from its parsed body, alone: a later record of a job id met earlier in the
    /// batch with another digest (never in a commit group beside it), once the record at the
    /// index, if any, has settled (held back until then: the first of the two decides first).
    Alone(Parsed<P>, Option<usize>),
    /// A later record of a job met earlier in the batch with the same digest: the outcome of
    /// the record at this index, which ran the job, once it has settled.
    CopyOf(usize, PartialIds),
    /// A conflict letter: a copy of a processed job under its id with another digest.
    Conflict(PartialIds, JobDigest),
}

/// One message group's records still to settle, in delivery order.
type Group<P> = Vec<(usize, Step<P>)>;

/// Each record's step, by its index, as the batch's plan sorted them.
fn steps_of<P>(plan: Plan<P>, len: usize) -> Vec<Option<Step<P>>> {
    let mut steps: Vec<Option<Step<P>>> = (0..len).map(|_| None).collect();
    for (i, parsed) in plan.fresh.into_iter().chain(plan.repeats) {
        steps[i] = Some(Step::Run(parsed));
    }
    for (i, parsed) in plan.later {
        steps[i] = Some(Step::Alone(parsed, plan.follows.get(&i).copied()));
    }
    for (i, ids, digest) in plan.conflicting {
        steps[i] = Some(Step::Conflict(ids, digest));
    }
    for (i, first, ids) in plan.copies {
        steps[i] = Some(Step::CopyOf(first, ids));
    }
    steps
}

/// The message groups' records still to settle (the steps not taken yet), in delivery order;
/// groups with none left out.
fn groups_to_settle<P>(order: &[Vec<usize>], steps: &mut [Option<Step<P>>]) -> Vec<Group<P>> {
    order
        .iter()
        .map(|members| {
            let members = members.iter();
            members
                .filter_map(|&i| steps[i].take().map(|step| (i, step)))
                .collect()
        })
        .filter(|group: &Group<P>| !group.is_empty())
        .collect()
}

impl<C: Consumer> Harness<C> {
    /// [`Harness::process_batch`] for a batch whose records carry message groups: the
    /// duplicates found in one statement as ever, then each group in order (see the module's
    /// invariants).
    pub(super) async fn process_fifo_batch(
        &self,
        msgs: &[IncomingMessage],
        may_start: &(dyn Fn() -> bool + Sync),
        concurrency: usize,
    ) -> Vec<Option<RecordOutcome>> {
        let mut outcomes: Vec<Option<RecordOutcome>> = vec![None; msgs.len()];
        let plan = self.plan(msgs, &mut outcomes).await;
        let one_job_in_two_records = !plan.copies.is_empty() || !plan.later.is_empty();
        let keys = plan.keys.clone();
        let mut steps = steps_of(plan, msgs.len());
        let order = groups(msgs);
        if self.settings.commit == CommitMode::Batch && may_start() {
            self.commit_leading(&order, &mut steps, &mut outcomes, msgs)
                .await;
        }
        let groups = groups_to_settle(&order, &mut steps);
        let settled = self
            .settle_groups(
                msgs,
                &keys,
                groups,
                one_job_in_two_records,
                may_start,
                concurrency,
            )
            .await;
        for (i, outcome) in settled.into_iter().flatten() {
            outcomes[i] = outcome;
        }
        outcomes
    }

    /// Settles the message groups: side by side when every record is a first delivery of its
    /// own job; else one record at a time, least run first after a crash, or in delivery order,
    /// so that of two records of one job id the first decides first.
    async fn settle_groups(
        &self,
        msgs: &[IncomingMessage],
        keys: &[Option<JobId>],
        groups: Vec<Group<C::Payload>>,
        one_job_in_two_records: bool,
        may_start: &(dyn Fn() -> bool + Sync),
        concurrency: usize,
    ) -> Vec<Vec<(usize, Option<RecordOutcome>)>> {
        let first_deliveries = msgs.iter().all(|m| m.receive_count == 1);
        let settled_so_far = std::sync::Mutex::new(vec![None; msgs.len()]);
        if first_deliveries && !one_job_in_two_records {
            return futures_util::stream::iter(groups)
                .map(|group| self.settle_group(msgs, group, may_start, &settled_so_far))
                .buffer_unordered(concurrency.max(1))
                .collect()
                .await;
        }
        let groups = match first_deliveries {
            true => groups,
            false => self.least_run_groups_first(msgs, keys, groups).await,
        };
        let mut settled = Vec::new();
        for group in groups {
            let group = self.settle_group(msgs, group, may_start, &settled_so_far);
            settled.push(group.await);
        }
        settled
    }

    /// Batch mode: the leading first deliveries of each group (new jobs, before anything else
    /// of their group that is still to settle) as one commit group, in delivery order. What it
    /// does not commit goes back to its place.
    async fn commit_leading(
        &self,
        order: &[Vec<usize>],
        steps: &mut [Option<Step<C::Payload>>],
        outcomes: &mut [Option<RecordOutcome>],
        msgs: &[IncomingMessage],
    ) {
        let mut leading: Vec<Record<C::Payload>> = Vec::new();
        for members in order {
            let pending: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| steps[i].is_some())
                .collect();
            for i in pending {
                let new_job =
                    msgs[i].receive_count == 1 && matches!(steps[i], Some(Step::Run(Ok(_))));
                if !new_job {
                    break;
                }
                if let Some(Step::Run(parsed)) = steps[i].take() {
                    leading.push((i, parsed));
                }
            }
        }
        leading.sort_by_key(|(i, _)| *i);
        let (left, _) =
            (self.commit_group(msgs, leading, WorkOrder::Delivery, outcomes, None)).await;
        for (i, parsed) in left {
            steps[i] = Some(Step::Run(parsed));
        }
    }

    /// Settles one group's records in order, until one is not done; the rest are held back.
    async fn settle_group(
        &self,
        msgs: &[IncomingMessage],
        group: Group<C::Payload>,
        may_start: &(dyn Fn() -> bool + Sync),
        so_far: &std::sync::Mutex<Vec<Option<RecordOutcome>>>,
    ) -> Vec<(usize, Option<RecordOutcome>)> {
        let mut settled = Vec::with_capacity(group.len());
        let mut blocked = false;
        for (i, step) in group {
            let msg = &msgs[i];
            let outcome = if blocked {
                Some(self.held_back(msg, &step))
            } else if !may_start() {
                self.unstarted(msg, &ids(&step));
                None
            } else {
                let settled = |first: usize| so_far.lock().expect("outcomes lock")[first].is_some();
                Some(match step {
                    Step::Alone(parsed, Some(first)) if !settled(first) => {
                        self.held_back(msg, &Step::Alone(parsed, None))
                    }
                    Step::Run(parsed) | Step::Alone(parsed, _) => {
                        self.process_parsed(msg, parsed).await
                    }
                    Step::Conflict(ids, digest) => self.conflict_letter(msg, &ids, &digest).await,
                    Step::CopyOf(first, ids) => {
                        let ran = so_far.lock().expect("outcomes lock")[first].clone();
                        self.copy_answer(msg, &ids, ran.as_ref())
                    }
                })
            };
            blocked = blocked || !outcome.as_ref().is_some_and(RecordOutcome::is_ack);
            so_far.lock().expect("outcomes lock")[i] = outcome.clone();
            settled.push((i, outcome));
        }
        settled
    }

    /// A copy of a job that another record of the batch ran: that record's outcome as a copy's,
    /// or held back (uncharged) when that record has not settled yet.
    fn copy_answer(
        &self,
        msg: &IncomingMessage,
        ids: &PartialIds,
        ran: Option<&RecordOutcome>,
    ) -> RecordOutcome {
        let outcome = ran.map_or(RecordOutcome::HeldBack, RecordOutcome::of_a_copy);
        self.count_and_log(&self.span(msg, ids), &outcome);
        outcome
    }

    /// A record held back behind its group's earlier record that is not done: counted and
    /// logged in its own span, never run.
    fn held_back(&self, msg: &IncomingMessage, step: &Step<C::Payload>) -> RecordOutcome {
        let outcome = RecordOutcome::HeldBack;
        self.count_and_log(&self.span(msg, &ids(step)), &outcome);
        outcome
    }

    /// Groups ordered so that those whose next job has fewer executions charged go first
    /// ([`Harness::least_run_key`] on each group's first record); ties keep delivery order.
    async fn least_run_groups_first(
        &self,
        msgs: &[IncomingMessage],
        keys: &[Option<JobId>],
        mut groups: Vec<Group<C::Payload>>,
    ) -> Vec<Group<C::Payload>> {
        if groups.len() < 2 {
            return groups;
        }
        let heads: Vec<usize> = groups.iter().map(|group| group[0].0).collect();
        let key = self.least_run_key(msgs, keys, &heads).await;
        groups.sort_by_key(|group| key(group[0].0));
        groups
    }
}

/// The ids a record's step carries.
fn ids<P>(step: &Step<P>) -> PartialIds {
    match step {
        Step::Run(parsed) | Step::Alone(parsed, _) => ids_of(parsed),
        Step::Conflict(ids, _) | Step::CopyOf(_, ids) => ids.clone(),
    }
}

/// The batch's records by message group, groups in the order they first appear, each group's
/// records in delivery order. A record without a group (SQS gives every FIFO message one) is a
/// group of its own, in no order with the rest.
fn groups(msgs: &[IncomingMessage]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for (i, msg) in msgs.iter().enumerate() {
        let key = msg.message_group.as_deref();
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(group: Option<&str>) -> IncomingMessage {
        IncomingMessage {
            message_id: uuid::Uuid::new_v4().to_string(),
            queue: "q.fifo".into(),
            body: "{}".into(),
            receive_count: 1,
            replay_of: None,
            message_group: group.map(str::to_owned),
            trace: Default::default(),
        }
    }

    #[test]
    fn records_group_by_message_group_in_delivery_order() {
        let msgs = [
            msg(Some("a")),
            msg(Some("b")),
            msg(Some("a")),
            msg(None),
            msg(Some("b")),
            msg(None),
            msg(Some("a")),
        ];
        assert_eq!(
            groups(&msgs),
            vec![vec![0, 2, 6], vec![1, 4], vec![3], vec![5]]
        );
    }
}
