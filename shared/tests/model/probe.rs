//! The reference consumer with a probe around it: it counts each job id's runs (entries into
//! its per-job work, which the harness charges as executions) and, when told, crashes a job's
//! process after its effect and before the harness commits it.
//!
//! Invariant: the probe changes nothing the consumer does except the crash; its counts outlive
//! a crashed process (the state is shared with the next one).

use consumer::{AwardPoints, PointsAward, award_batch};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::{ConsumerName, JobId};
use sqlx::PgConnection;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// What every process of one history's consumer shares.
#[derive(Default)]
pub struct ProbeState {
    runs: Mutex<HashMap<JobId, u32>>,
    crash: Mutex<Option<JobId>>,
    /// Told when the crash point is reached: the work is done, nothing committed.
    pub crashed: Notify,
    /// Whether the crash happened in the per-job work (else in the batch's).
    pub crashed_alone: AtomicBool,
}

impl ProbeState {
    /// How often `job`'s per-job work has been entered.
    pub fn runs(&self, job: JobId) -> u32 {
        self.runs.lock().unwrap().get(&job).copied().unwrap_or(0)
    }

    /// The next run of `job` (alone or in a batch) dies after its work.
    pub fn crash_next(&self, job: JobId) {
        *self.crash.lock().unwrap() = Some(job);
        self.crashed_alone.store(false, Ordering::SeqCst);
    }

    /// Takes the crash back (it did not happen).
    pub fn disarm(&self) -> bool {
        self.crash.lock().unwrap().take().is_some()
    }

    fn take_crash(&self, jobs: &[JobId]) -> bool {
        let mut crash = self.crash.lock().unwrap();
        if crash.is_some_and(|c| jobs.contains(&c)) {
            *crash = None;
            true
        } else {
            false
        }
    }
}

/// [`AwardPoints`] with the probe.
pub struct Probe {
    inner: AwardPoints,
    state: std::sync::Arc<ProbeState>,
}

impl Probe {
    /// The reference consumer under `name`, probed by `state`.
    pub fn new(name: ConsumerName, state: std::sync::Arc<ProbeState>) -> Self {
        Self {
            inner: AwardPoints::new(name),
            state,
        }
    }

    async fn die(&self, alone: bool) -> Result<(), ProcessError> {
        self.state.crashed_alone.store(alone, Ordering::SeqCst);
        self.state.crashed.notify_one();
        // The process is killed here; the test drops this future with its connections.
        std::future::pending::<()>().await;
        unreachable!("a crashed process never returns")
    }
}

impl Consumer for Probe {
    type Payload = PointsAward;

    fn name(&self) -> &ConsumerName {
        self.inner.name()
    }

    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        let id = job.envelope.job_id;
        *self.state.runs.lock().unwrap().entry(id).or_default() += 1;
        self.inner.handle(job, tx).await?;
        if self.state.take_crash(&[id]) {
            self.die(true).await?;
        }
        Ok(())
    }

    async fn handle_batch(
        &self,
        jobs: &[Job<PointsAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        let ids: Vec<JobId> = jobs.iter().map(|j| j.envelope.job_id).collect();
        award_batch(jobs, tx).await?;
        if self.state.take_crash(&ids) {
            self.die(false).await?;
        }
        Ok(())
    }
}
