//! The reference consumer with a probe around it: it counts each job id's runs (entries into
//! its per-job work, which the harness charges as executions) and, when told, crashes a job's
//! process after its effect and before the harness commits it.
//!
//! Its payload is the reference one plus an optional `note` a producer may change between sends
//! of one job; when the history's consumer names its job fields (`account_id`, `points`), a
//! copy differing only in the note is the same job.
//!
//! Invariant: the probe changes nothing the consumer does except the crash; its counts outlive
//! a crashed process (the state is shared with the next one).

use super::bodies::Family;
use consumer::{Award, award, award_batch};
use serde::Deserialize;
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
    /// Runs per job (a family: the job id's payload, or an edit of it), alone or in a batch.
    family_runs: Mutex<HashMap<Family, u32>>,
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

    /// How often `family`'s work has been entered (alone, or in a batch's).
    pub fn family_runs(&self, family: Family) -> u32 {
        self.family_runs
            .lock()
            .unwrap()
            .get(&family)
            .copied()
            .unwrap_or(0)
    }

    fn ran(&self, points: i64) {
        *self
            .family_runs
            .lock()
            .unwrap()
            .entry(Family::of_points(points))
            .or_default() += 1;
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

/// The fields that make up a job of the model's consumer: all of the payload (none named), or,
/// in a history whose producer adds a changing note, the award's own.
pub fn job_fields(noted: bool) -> &'static [&'static str] {
    if noted {
        &["account_id", "points"]
    } else {
        &[]
    }
}

/// The reference payload ([`consumer::PointsAward`]: unknown fields refused, `points` an
/// `i64`), with a producer's note besides.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotedAward {
    account_id: String,
    points: i64,
    #[allow(dead_code)]
    note: Option<String>,
}

impl Award for NotedAward {
    fn account_id(&self) -> &str {
        &self.account_id
    }

    fn points(&self) -> i64 {
        self.points
    }
}

/// The reference consumer's work ([`consumer::AwardPoints`]) with the probe.
pub struct Probe {
    name: ConsumerName,
    noted: bool,
    state: std::sync::Arc<ProbeState>,
}

impl Probe {
    /// The reference consumer under `name`, naming its job fields if `noted`, probed by
    /// `state`.
    pub fn new(name: ConsumerName, noted: bool, state: std::sync::Arc<ProbeState>) -> Self {
        Self { name, noted, state }
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
    type Payload = NotedAward;

    fn name(&self) -> &ConsumerName {
        &self.name
    }

    fn job_fields(&self) -> &[&str] {
        job_fields(self.noted)
    }

    async fn handle(
        &self,
        job: &Job<NotedAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        let id = job.envelope.job_id;
        *self.state.runs.lock().unwrap().entry(id).or_default() += 1;
        self.state.ran(job.envelope.payload.points);
        award(job, tx).await?;
        if self.state.take_crash(&[id]) {
            self.die(true).await?;
        }
        Ok(())
    }

    async fn handle_batch(
        &self,
        jobs: &[Job<NotedAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        let ids: Vec<JobId> = jobs.iter().map(|j| j.envelope.job_id).collect();
        for job in jobs {
            self.state.ran(job.envelope.payload.points);
        }
        award_batch(jobs, tx).await?;
        if self.state.take_crash(&ids) {
            self.die(false).await?;
        }
        Ok(())
    }
}
