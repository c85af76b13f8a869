//! The one transaction routine, for one job and for a commit group alike: `BEGIN`, the fences
//! first, the work, the check that the transaction is still whole (`core.finish_job_of`, or
//! `core.finish_jobs_of` for a group), `COMMIT`. Whatever stops it rolls it back, and the
//! `ROLLBACK` has been answered before the routine returns; a `COMMIT` that errors is reported as
//! such, for the caller to settle through the fence, never guessed.

use super::Harness;
use crate::consumer::{Consumer, Job, ProcessError};
use crate::fence::{
    FenceClaim, FenceError, claim_job_fence, claim_job_fences, finish_job, finish_jobs,
    is_lock_timeout,
};
use crate::ids::JobId;
use futures_util::FutureExt;
use sqlx::PgConnection;
use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;

/// The jobs one transaction commits.
pub(super) enum Jobs<'a, P> {
    /// One job, with the message id of its delivery (per-job mode, and every job of a commit
    /// group that did not commit).
    One(&'a Job<P>, &'a str),
    /// A commit group: batch mode's new jobs of one SQS batch, in job id order (their fences are
    /// claimed so, and the consumer's work sees them so). They come back in that order.
    Group(&'a mut [Job<P>]),
}

/// A transaction that committed: the jobs whose fences it claimed, committed with their work (a
/// group leaves out the jobs whose fence was there already).
pub(super) struct Committed(pub(super) HashSet<JobId>);

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
    /// Runs `jobs` in one transaction. Anything but a `COMMIT` that errors rolls it back, and
    /// the `ROLLBACK` has been answered before this returns: what follows (a letter settled
    /// through the fence, a group's one-by-one fallback) must not meet the transaction's own
    /// uncommitted fences (a dropped transaction would send its `ROLLBACK` only later, from the
    /// pool, and they would be found held).
    pub(super) async fn transact(
        &self,
        mut jobs: Jobs<'_, C::Payload>,
    ) -> Result<Committed, Unfinished> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| Unfinished::Failed(e.into()))?;
        let worked = self.claim_and_work(&mut jobs, &mut tx).await;
        let group = match jobs {
            Jobs::One(..) => false,
            Jobs::Group(group) => {
                group.sort_by_key(|job| job.envelope.job_id);
                true
            }
        };
        match worked {
            Ok(claimed) => match tx.commit().await {
                Ok(()) => Ok(Committed(claimed)),
                Err(e) => Err(Unfinished::CommitUnknown(e)),
            },
            Err(unfinished) => {
                if let Err(e) = tx.rollback().await
                    && group
                {
                    // The connection is broken, and the server ends its transaction with it.
                    tracing::warn!(error = %e, "the batch's ROLLBACK failed");
                }
                Err(unfinished)
            }
        }
    }

    /// The transaction up to its `COMMIT`: the fences, then (if any is this transaction's) the
    /// work and the check that the transaction is whole. Returns the jobs whose fences it holds.
    async fn claim_and_work(
        &self,
        jobs: &mut Jobs<'_, C::Payload>,
        tx: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        let claimed = match jobs {
            Jobs::One(job, _) => self.claim_one(job, tx).await?,
            Jobs::Group(group) => self.claim_group(group, tx).await?,
        };
        if claimed.is_empty() {
            return Ok(claimed);
        }
        let worked = match jobs {
            Jobs::One(job, message_id) => self.work_one(job, message_id, tx).await,
            Jobs::Group(group) => {
                // The jobs it claimed first, still in job id order; `transact` restores the order.
                group.sort_by_key(|job| !claimed.contains(&job.envelope.job_id));
                self.work_group(&group[..claimed.len()], tx).await
            }
        };
        worked.map(|()| claimed).map_err(Unfinished::Failed)
    }

    /// One job's fence, claimed, or found committed (for this job or another under its id).
    async fn claim_one(
        &self,
        job: &Job<C::Payload>,
        tx: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        let envelope = &job.envelope;
        let claim = claim_job_fence(
            tx,
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
        tx: &mut PgConnection,
    ) -> Result<HashSet<JobId>, Unfinished> {
        let fences: Vec<_> = group
            .iter()
            .map(|j| (j.envelope.job_id, j.envelope.tenant_id, Some(j.digest)))
            .collect();
        claim_job_fences(
            tx,
            self.consumer.name(),
            &fences,
            group[0].started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await
        .map_err(Unfinished::Claim)
    }

    /// [`Consumer::handle`], then the check that the transaction is still whole and the fence
    /// its own.
    async fn work_one(
        &self,
        job: &Job<C::Payload>,
        message_id: &str,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        caught(self.consumer.handle(job, tx), |what| {
            ProcessError::transient(format!("handler panicked: {what}"))
        })
        .await?;
        let envelope = &job.envelope;
        let consumer = self.consumer.name();
        let digest = Some(&job.digest);
        match finish_job(
            tx,
            envelope.job_id,
            consumer,
            message_id,
            digest,
            job.started_at,
        )
        .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(ProcessError::transient(
                "the handler returned Ok but ended the harness's transaction itself \
                 (COMMIT or ROLLBACK inside handle): the job's fence is not its own",
            )),
            Err(e) if is_lock_timeout(&e) => Err(ProcessError::transient(format!(
                "closing the letter still pending for this job waited past its lock \
                 timeout: another session holds the letter's row (a review, an open \
                 transaction) ({e})"
            ))),
            Err(e) => Err(ProcessError::transient(format!(
                "the handler returned Ok from a transaction that cannot commit: an SQL \
                 error inside handle was not returned ({e})"
            ))),
        }
    }

    /// [`Consumer::handle_batch`] for the group's claimed jobs, then one check that the
    /// transaction is whole and every fence its own.
    async fn work_group(
        &self,
        claimed: &[Job<C::Payload>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        caught(self.consumer.handle_batch(claimed, tx), |_| {
            ProcessError::transient("the batch's work panicked")
        })
        .await?;
        let finished: Vec<_> = claimed
            .iter()
            .map(|j| (j.envelope.job_id, Some(j.digest)))
            .collect();
        finish_jobs(tx, self.consumer.name(), &finished, claimed[0].started_at)
            .await
            .map_err(|e| {
                ProcessError::transient(format!("the batch's transaction is not whole: {e}"))
            })
    }
}

/// The consumer's `work`, a panic in it becoming the failure `panicked` makes of its message.
async fn caught(
    work: impl Future<Output = Result<(), ProcessError>>,
    panicked: impl FnOnce(String) -> ProcessError,
) -> Result<(), ProcessError> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(panicked(what))
        }
    }
}
