//! The one transaction routine, for one job and for a commit group alike: the fences first (the
//! statement that claims them opens the transaction), the work, the check that the transaction
//! is still whole (`core.close_job`, or `core.finish_jobs_of` for a group) and `COMMIT` in one
//! round trip. Whatever stops it rolls it back, and the `ROLLBACK` has been answered before the
//! routine returns; a `COMMIT` that errors is reported as such, for the caller to settle
//! through the fence, never guessed.

use super::Harness;
use super::lanes::Lane;
use super::work_errors::{caught, refusal};
use crate::consumer::{Consumer, Job, ProcessError};
use crate::fence::{
    CloseError, FenceClaim, FenceError, close_job, close_jobs_after, open_job, open_jobs,
};
use crate::ids::JobId;
use sqlx::PgConnection;
use std::collections::HashSet;

/// The jobs one transaction commits.
pub(super) enum Jobs<'a, P> {
    /// One job, with the message id of its delivery (per-job mode, and every job of a commit
    /// group that did not commit).
    One(&'a Job<P>, &'a str),
    /// A commit group: batch mode's new jobs of one SQS batch, in the order the consumer's work
    /// sees them (job id order, or a FIFO batch's delivery order); their fences are claimed in
    /// job id order whatever it is. They come back in the order given. With the statement that
    /// receives the batch's poison in the letters' intake
    /// ([`crate::dead_letter::receiving_statement`]), sent with the group's check and `COMMIT`:
    /// one commit for the jobs and the rows.
    Group(&'a mut [Job<P>], Option<&'a str>),
}

/// A transaction that committed: the jobs whose fences it claimed, committed with their work (a
/// group leaves out the jobs whose fence was there already), and the keys of the intake rows it
/// received with them, as its statement answered them (`None`: it carried none, or committed no
/// job and so no row).
pub(super) struct Committed(
    pub(super) HashSet<JobId>,
    pub(super) Option<Vec<sqlx::postgres::PgRow>>,
);

/// Why a transaction did not commit.
pub(super) enum Unfinished {
    /// The one job's fence is committed: a duplicate. Nothing ran.
    Duplicate,
    /// The one job's id is committed for another job (another digest). Nothing ran.
    Conflict,
    /// The fences could not be claimed: a concurrent copy held one past the lock timeout, or
    /// the database failed.
    Claim(FenceError),
    /// `BEGIN`, the work (a panic included) or the check before `COMMIT` failed.
    Failed(ProcessError),
    /// `COMMIT` returned an error: the jobs may or may not have committed.
    CommitUnknown(sqlx::Error),
}

impl<C: Consumer> Harness<C> {
    /// Runs `jobs` in one transaction, on a lane ([`super::lanes`]), in as few round trips as
    /// the guarantee allows: the claim and `BEGIN` in one, the work, the check and `COMMIT` in
    /// one (`core.open_job`, `core.close_job`). Anything but a `COMMIT` that errors rolls it
    /// back, and the `ROLLBACK` has been answered before this returns (or the connection is
    /// closed, which ends its transaction): what follows (a letter settled through the fence, a
    /// group's one-by-one fallback) must not meet the transaction's own uncommitted fences.
    pub(super) async fn transact(
        &self,
        mut jobs: Jobs<'_, C::Payload>,
    ) -> Result<Committed, Unfinished> {
        // No connection is no failure of the jobs': none of them ran.
        let mut lane = self
            .lanes
            .take(&self.pool)
            .await
            .map_err(|e| Unfinished::Claim(FenceError::Database(e)))?;
        let order: Vec<JobId> = match &jobs {
            Jobs::Group(group, _) => group.iter().map(|job| job.envelope.job_id).collect(),
            Jobs::One(..) => Vec::new(),
        };
        let ended = self.claim_and_work(&mut jobs, &mut lane).await;
        if let Jobs::Group(group, _) = jobs {
            // A group's job ids are distinct (one record per job).
            group.sort_by_key(|job| order.iter().position(|id| *id == job.envelope.job_id));
        }
        ended
    }

    /// The transaction: the fences (opening it), then (if any is this transaction's) the work,
    /// the check that the transaction is whole, and `COMMIT`. Returns the jobs whose fences it
    /// committed.
    async fn claim_and_work(
        &self,
        jobs: &mut Jobs<'_, C::Payload>,
        lane: &mut Lane<'_>,
    ) -> Result<Committed, Unfinished> {
        let claimed = self.open(jobs, lane).await?;
        if claimed.is_empty() {
            // A group whose every fence appeared since its lookup: nothing to run.
            return match lane.rollback().await {
                Ok(()) => Ok(Committed(claimed, None)),
                Err(e) => Err(Unfinished::Failed(e.into())),
            };
        }
        let worked = match jobs {
            Jobs::One(job, _) => self.work_one(job, lane.conn()).await,
            Jobs::Group(group, _) => {
                // The jobs it claimed first, still in their order; `transact` restores the rest.
                group.sort_by_key(|job| !claimed.contains(&job.envelope.job_id));
                self.work_group(&group[..claimed.len()], lane.conn()).await
            }
        };
        let closed = match worked {
            Ok(()) => self.close(jobs, claimed.len(), lane.conn()).await,
            Err(failure) => Err(CloseError::Check(failure)),
        };
        match closed {
            Ok(received) => {
                lane.ended();
                Ok(Committed(claimed, received))
            }
            Err(CloseError::Check(failure)) => {
                if let Err(e) = lane.rollback().await
                    && matches!(jobs, Jobs::Group(..))
                {
                    // The connection is broken (it is closed), and the server ends its
                    // transaction with it.
                    tracing::warn!(error = %e, "the batch's ROLLBACK failed");
                }
                Err(Unfinished::Failed(failure))
            }
            // The lane is closed: its state is not known.
            Err(CloseError::Commit(e)) => Err(Unfinished::CommitUnknown(e)),
        }
    }

    /// The claim that opens the transaction. A lane that died while idle is renewed once: the
    /// claim never reached a `COMMIT`, so nothing it sent can have committed.
    async fn open(
        &self,
        jobs: &Jobs<'_, C::Payload>,
        lane: &mut Lane<'_>,
    ) -> Result<HashSet<JobId>, Unfinished> {
        lane.entered();
        let mut claimed = self.claim(jobs, lane.conn()).await;
        if let Err(Unfinished::Claim(FenceError::Database(e))) = &claimed
            && lane.reused
            && e.as_database_error().is_none()
        {
            tracing::info!(error = %e, "a kept connection had died; claiming on a new one");
            lane.renew(&self.pool)
                .await
                .map_err(|e| Unfinished::Failed(e.into()))?;
            lane.entered();
            claimed = self.claim(jobs, lane.conn()).await;
        }
        match &claimed {
            Ok(_) => {}
            // The claim failed before `BEGIN`: no transaction is open.
            Err(Unfinished::Claim(FenceError::Database(e))) if e.as_database_error().is_none() => {}
            Err(_) => lane.ended(),
        }
        claimed
    }

    /// The fences, claimed by the statement that opens the transaction.
    async fn claim(
        &self,
        jobs: &Jobs<'_, C::Payload>,
        conn: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        match jobs {
            Jobs::One(job, _) => self.claim_one(job, conn).await,
            Jobs::Group(group, _) => self.claim_group(group, conn).await,
        }
    }

    /// One job's fence, claimed, or found committed (for this job or another under its id).
    async fn claim_one(
        &self,
        job: &Job<C::Payload>,
        conn: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        let envelope = &job.envelope;
        let claim = open_job(
            conn,
            envelope.job_id,
            self.consumer.name(),
            envelope.tenant_id,
            Some(&job.digest),
            job.started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await;
        match claim.map_err(Unfinished::Claim)? {
            FenceClaim::Claimed => Ok(HashSet::from([envelope.job_id])),
            FenceClaim::Duplicate => Err(Unfinished::Duplicate),
            FenceClaim::Conflict => Err(Unfinished::Conflict),
        }
    }

    /// A group's fences in one statement; a job whose fence was there already is left out.
    async fn claim_group(
        &self,
        group: &[Job<C::Payload>],
        conn: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        let fences: Vec<_> = group
            .iter()
            .map(|j| (j.envelope.job_id, j.envelope.tenant_id, Some(j.digest)))
            .collect();
        open_jobs(
            conn,
            self.consumer.name(),
            &fences,
            group[0].started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await
        .map_err(Unfinished::Claim)
    }

    /// [`Consumer::handle`].
    async fn work_one(
        &self,
        job: &Job<C::Payload>,
        conn: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        caught(self.consumer.handle(job, conn), |what| {
            ProcessError::transient(format!("handler panicked: {what}"))
        })
        .await
    }

    /// [`Consumer::handle_batch`] for the group's claimed jobs.
    async fn work_group(
        &self,
        claimed: &[Job<C::Payload>],
        conn: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        caught(self.consumer.handle_batch(claimed, conn), |_| {
            ProcessError::transient("the batch's work panicked")
        })
        .await
    }

    /// The check that the transaction is still whole and every fence its own, and `COMMIT`,
    /// in one round trip (a group's intake rows received in it too: what that answered is returned).
    /// A check that refuses is the transient failure it describes.
    async fn close(
        &self,
        jobs: &Jobs<'_, C::Payload>,
        claimed: usize,
        conn: &mut PgConnection,
    ) -> Result<Option<Vec<sqlx::postgres::PgRow>>, CloseError<ProcessError>> {
        let consumer = self.consumer.name();
        let closed = match jobs {
            Jobs::One(job, message_id) => {
                let envelope = &job.envelope;
                let digest = Some(&job.digest);
                close_job(
                    conn,
                    envelope.job_id,
                    consumer,
                    message_id,
                    digest,
                    job.started_at,
                )
                .await
                .map(|()| None)
            }
            Jobs::Group(group, intake) => {
                // The claimed jobs lead the group (see `claim_and_work`): the ones it worked.
                let finished: Vec<_> = group[..claimed]
                    .iter()
                    .map(|j| (j.envelope.job_id, Some(j.digest)))
                    .collect();
                let received =
                    close_jobs_after(conn, consumer, &finished, group[0].started_at, *intake);
                received.await.map(|keys| intake.map(|_| keys))
            }
        };
        closed.map_err(|e| match e {
            CloseError::Commit(e) => CloseError::Commit(e),
            CloseError::Check(refused) => {
                CloseError::Check(refusal(refused, matches!(jobs, Jobs::Group(..))))
            }
        })
    }
}
