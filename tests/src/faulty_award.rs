//! The reference consumer with failures on request, for the demo, the soak and the end-to-end
//! tests: `local-consumer` runs it. It lives here, in the test crate, and nowhere that deploys:
//! the deployed consumer's payload has no `demo_fault`, so there a fault request is poison.
//!
//! Same consumer name and same effect as [`consumer::AwardPoints`] ([`consumer::award`],
//! [`consumer::award_batch`], not a copy), plus the payload field `demo_fault`: the JSON is the
//! reference payload's, `{"account_id", "points", "demo_fault"?}`, with [`DemoFault`]'s forms
//! (`"always_transient"`, `"permanent"`, `"crash_before_commit"`,
//! `{"transient_until_attempt": n}`).

use consumer::Award;
use serde::{Deserialize, Serialize};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::ConsumerName;
use sqlx::PgConnection;

/// The reference consumer's payload, and a failure to simulate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultyAward {
    /// The account credited.
    pub account_id: String,
    /// How many points; must be positive, or the job is poison.
    pub points: i64,
    /// A failure to simulate after the award is written (so it must roll back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demo_fault: Option<DemoFault>,
}

impl Award for FaultyAward {
    fn account_id(&self) -> &str {
        &self.account_id
    }

    fn points(&self) -> i64 {
        self.points
    }
}

/// A failure the test consumer simulates on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemoFault {
    /// Fails transiently (after writing its effect, which must roll back) on attempts before
    /// this one, then succeeds.
    TransientUntilAttempt(u32),
    /// Fails transiently on every attempt.
    AlwaysTransient,
    /// Fails permanently.
    Permanent,
    /// Ends its own process after writing its effect, before the commit.
    CrashBeforeCommit,
}

/// The reference consumer, failing on request.
#[derive(Debug, Clone)]
pub struct AwardPointsWithFaults {
    name: ConsumerName,
}

impl AwardPointsWithFaults {
    /// A consumer that fences under `name` (the reference consumer's is `award-points`).
    pub fn new(name: ConsumerName) -> Self {
        Self { name }
    }
}

impl Consumer for AwardPointsWithFaults {
    type Payload = FaultyAward;

    fn name(&self) -> &ConsumerName {
        &self.name
    }

    async fn handle(
        &self,
        job: &Job<FaultyAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        consumer::award(job, tx).await?;
        simulate(job)
    }

    /// The reference consumer's batch work, then each job's fault in the batch's order.
    async fn handle_batch(
        &self,
        jobs: &[Job<FaultyAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        consumer::award_batch(jobs, tx).await?;
        jobs.iter().try_for_each(simulate)
    }
}

fn simulate(job: &Job<FaultyAward>) -> Result<(), ProcessError> {
    match job.envelope.payload.demo_fault {
        None => Ok(()),
        Some(DemoFault::TransientUntilAttempt(n)) if job.attempt >= n => Ok(()),
        Some(DemoFault::TransientUntilAttempt(_)) | Some(DemoFault::AlwaysTransient) => {
            Err(ProcessError::transient(format!(
                "simulated provider timeout on attempt {}",
                job.attempt
            )))
        }
        Some(DemoFault::Permanent) => Err(ProcessError::permanent("simulated: account is closed")),
        Some(DemoFault::CrashBeforeCommit) => {
            tracing::error!(job_id = %job.envelope.job_id, "simulated crash before commit");
            std::process::exit(137)
        }
    }
}
