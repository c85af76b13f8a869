//! The steps after a job's transaction: settle what its end means, charge a failure to the
//! ledger, and decide between a retry and a dead letter.

use super::attempt::{Committed, Unfinished};
use super::letter::Settle;
use super::life::{Attempt, Step, Stop};
use super::{Harness, IncomingMessage, RecordOutcome};
use crate::consumer::{Consumer, Job, ProcessError};
use crate::decision::AfterFailure;
use crate::fence::{FenceError, settle_committed};
use crate::ledger::{record_failure, uncharge};
use std::time::Duration;

impl<C: Consumer> Harness<C> {
    /// Settle: what the end of the job's transaction means. Committed, a duplicate, a conflict
    /// or a contended fence ends the life; a `COMMIT` whose reply was lost settles through the
    /// fence; a failure goes on to be decided.
    pub(super) async fn settle(
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
    pub(super) async fn charge_failure(
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
    pub(super) async fn decide(
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
