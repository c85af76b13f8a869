//! Cross-crate test support: consumers that misbehave on purpose around the reference
//! consumer's real effect, and the local demo runner.

pub mod demo;

use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::ConsumerName;
use shared::reference::{AwardPoints, PointsAward};
use sqlx::PgConnection;

/// What [`HangAfterWork`] prints once its work is written but not committed.
pub const WORK_WRITTEN: &str = "WORK_WRITTEN_NOT_COMMITTED";

/// Does the reference consumer's real work, announces it on stdout, then waits forever inside
/// the open transaction, so a test can kill the process between the work and the commit.
pub struct HangAfterWork(pub AwardPoints);

impl Consumer for HangAfterWork {
    type Payload = PointsAward;

    fn name(&self) -> &ConsumerName {
        self.0.name()
    }

    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.0.handle(job, tx).await?;
        println!("{WORK_WRITTEN} {}", job.envelope.job_id);
        std::future::pending::<()>().await;
        unreachable!("killed while waiting")
    }
}
