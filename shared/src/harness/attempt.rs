//! One execution's transaction and what an unknown outcome becomes: fence first, the work, the
//! check that the transaction is still whole (`core.finish_job`), `COMMIT`; a `COMMIT` that
//! errors is settled through the fence, never guessed.

use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job, ProcessError};
use crate::envelope::JobDigest;
use crate::fence::{
    FenceClaim, FenceError, claim_job_fence, finish_job, is_lock_timeout, settle_committed,
};
use crate::ids::JobId;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// Why an execution did not commit.
pub(super) enum AttemptError {
    Contended,
    /// `COMMIT` returned an error: the job may or may not have committed.
    CommitUnknown(sqlx::Error),
    Failed(ProcessError),
}

impl<C: Consumer> Harness<C> {
    /// A `COMMIT` that failed may still have committed (its reply was lost with the
    /// connection). The fence settles it: committed is `Ok(Processed)`; not committed is the
    /// transient failure to retry; an answer that cannot be had yet hands the record back.
    pub(super) async fn settle_commit(
        &self,
        msg: &IncomingMessage,
        job_id: JobId,
        digest: Option<&JobDigest>,
        commit_error: sqlx::Error,
    ) -> Result<RecordOutcome, ProcessError> {
        let settled = settle_committed(
            &self.pool,
            job_id,
            self.consumer.name(),
            digest,
            self.clock.now(),
            self.settings.lock_timeout,
        )
        .await;
        match settled {
            Ok(true) => {
                tracing::warn!(job_id = %job_id, error = %commit_error,
                    "COMMIT reported an error, but the fence shows the job committed");
                Ok(RecordOutcome::Processed)
            }
            Ok(false) => Err(ProcessError::transient(format!(
                "COMMIT failed ({commit_error}); the fence shows the job did not commit"
            ))),
            Err(e) => {
                let after = self.retry_after(&e, msg);
                Ok(self.hand_back(
                    format!("COMMIT failed ({commit_error}) and its outcome could not be settled yet: {e}"),
                    after,
                ))
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

    /// One transaction: fence first, work, a check that the transaction is still whole, commit.
    /// `Ok(Claimed)` means committed.
    pub(super) async fn attempt(
        &self,
        job: &Job<C::Payload>,
        msg: &IncomingMessage,
    ) -> Result<FenceClaim, AttemptError> {
        let failed = |e: sqlx::Error| AttemptError::Failed(e.into());
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let envelope = &job.envelope;
        let claim = claim_job_fence(
            &mut tx,
            envelope.job_id,
            self.consumer.name(),
            envelope.tenant_id,
            Some(&job.digest),
            job.started_at,
            self.settings.fence_ttl,
            self.settings.lock_timeout,
        )
        .await;
        match claim {
            Ok(FenceClaim::Claimed) => {}
            Ok(claim @ (FenceClaim::Duplicate | FenceClaim::Conflict)) => {
                let _ = tx.rollback().await;
                return Ok(claim);
            }
            Err(FenceError::Contended) => {
                let _ = tx.rollback().await;
                return Err(AttemptError::Contended);
            }
            Err(FenceError::Database(e)) => {
                let _ = tx.rollback().await;
                return Err(failed(e));
            }
        }
        let work = AssertUnwindSafe(self.consumer.handle(job, &mut tx))
            .catch_unwind()
            .await;
        let error = match work {
            Ok(Ok(())) => {
                let finished = finish_job(
                    &mut tx,
                    envelope.job_id,
                    self.consumer.name(),
                    &msg.message_id,
                    Some(&job.digest),
                    job.started_at,
                )
                .await;
                match finished {
                    Ok(true) => {
                        return match tx.commit().await {
                            Ok(()) => Ok(FenceClaim::Claimed),
                            Err(e) => Err(AttemptError::CommitUnknown(e)),
                        };
                    }
                    Ok(false) => ProcessError::transient(
                        "the handler returned Ok but ended the harness's transaction itself \
                         (COMMIT or ROLLBACK inside handle): the job's fence is not its own",
                    ),
                    Err(e) if is_lock_timeout(&e) => ProcessError::transient(format!(
                        "closing the letter still pending for this job waited past its lock \
                         timeout: another session holds the letter's row (a review, an open \
                         transaction) ({e})"
                    )),
                    Err(e) => ProcessError::transient(format!(
                        "the handler returned Ok from a transaction that cannot commit: an SQL \
                         error inside handle was not returned ({e})"
                    )),
                }
            }
            Ok(Err(error)) => error,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                ProcessError::transient(format!("handler panicked: {what}"))
            }
        };
        let _ = tx.rollback().await;
        Err(AttemptError::Failed(error))
    }
}
