//! The reference consumer: awards points to an account, as a row in `reference.point_awards`.
//!
//! The consumer the tests and the demo run; `functions/redeem-reward` is the one to copy.
//! Its effect table has no unique constraint on `job_id` on purpose: only the fence prevents a
//! double award, so a broken fence shows up as two rows.
//!
//! This crate has no features, so what deploys is what its tests run. Failures on request (the
//! demo's and the end-to-end tests' `demo_fault`) live in the test crate
//! (`tests/src/faulty_award.rs`): a consumer of its own under the same name, which reuses the
//! effect here ([`award`], [`award_batch`]). The payload here has no such field, so a message
//! asking for a fault is poison and nobody who can send to the queue can make the consumer
//! fail or crash itself.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::{ConsumerName, JobId, TenantId};
use sqlx::{PgConnection, PgExecutor};

/// The payload of an award job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointsAward {
    /// The account credited.
    pub account_id: String,
    /// How many points; must be positive, or the job is poison.
    pub points: i64,
}

/// What an award job asks for, whatever else its payload carries: the effect's input. The
/// reference payload is one; a test consumer's payload with more fields is another, and reuses
/// [`award`] and [`award_batch`] as they are.
pub trait Award {
    /// The account credited.
    fn account_id(&self) -> &str;
    /// How many points.
    fn points(&self) -> i64;
}

impl Award for PointsAward {
    fn account_id(&self) -> &str {
        &self.account_id
    }

    fn points(&self) -> i64 {
        self.points
    }
}

/// The reference consumer.
#[derive(Debug, Clone)]
pub struct AwardPoints {
    name: ConsumerName,
}

impl AwardPoints {
    /// A consumer that fences under `name`.
    pub fn new(name: ConsumerName) -> Self {
        Self { name }
    }
}

impl Consumer for AwardPoints {
    type Payload = PointsAward;

    fn name(&self) -> &ConsumerName {
        &self.name
    }

    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        award(job, tx).await
    }

    /// Batch mode: the batch's awards in one statement. A job that is not valid fails the
    /// batch, which then runs one job at a time, where that job alone becomes its letter.
    async fn handle_batch(
        &self,
        jobs: &[Job<PointsAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        award_batch(jobs, tx).await
    }
}

/// The reference consumer's work for one job, on the harness's transaction: the award is
/// validated (poison if meaningless), then written.
pub async fn award<P: Award>(job: &Job<P>, tx: &mut PgConnection) -> Result<(), ProcessError> {
    let award = &job.envelope.payload;
    validate(award)?;
    insert_award(
        tx,
        job.envelope.job_id,
        job.envelope.tenant_id,
        award.account_id(),
        award.points(),
        job.started_at,
    )
    .await?;
    Ok(())
}

/// The reference consumer's work for a batch, on one transaction: every award is validated,
/// then all are written in one statement. A job that is not valid fails the batch (the harness
/// then runs its jobs one at a time).
pub async fn award_batch<P: Award>(
    jobs: &[Job<P>],
    tx: &mut PgConnection,
) -> Result<(), ProcessError> {
    for job in jobs {
        validate(&job.envelope.payload)?;
    }
    insert_awards(tx, jobs).await?;
    Ok(())
}

/// What makes an award meaningless (poison): the same checks job by job and in a batch.
pub fn validate(award: &impl Award) -> Result<(), ProcessError> {
    if award.points() <= 0 {
        return Err(ProcessError::poison(format!(
            "points must be positive, got {}",
            award.points()
        )));
    }
    if award.account_id().trim().is_empty() {
        return Err(ProcessError::poison("account_id is blank"));
    }
    Ok(())
}

/// Writes the awards of `jobs` on the caller's transaction, in one statement.
pub async fn insert_awards<P: Award>(tx: &mut PgConnection, jobs: &[Job<P>]) -> sqlx::Result<()> {
    let mut job_ids = Vec::with_capacity(jobs.len());
    let mut tenants = Vec::with_capacity(jobs.len());
    let mut accounts = Vec::with_capacity(jobs.len());
    let mut points = Vec::with_capacity(jobs.len());
    let mut at = Vec::with_capacity(jobs.len());
    for job in jobs {
        job_ids.push(job.envelope.job_id.0);
        tenants.push(job.envelope.tenant_id.0);
        accounts.push(job.envelope.payload.account_id());
        points.push(job.envelope.payload.points());
        at.push(job.started_at);
    }
    sqlx::query!(
        "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
         SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::timestamptz[])",
        &job_ids,
        &tenants,
        // `&[&str]` for `text[]`, which the macro's check knows only as `&[String]`.
        &accounts as _,
        &points,
        &at,
    )
    .execute(tx)
    .await
    .map(drop)
}

/// Writes one award on the caller's transaction.
pub async fn insert_award(
    tx: &mut PgConnection,
    job_id: JobId,
    tenant_id: TenantId,
    account_id: &str,
    points: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
         VALUES ($1, $2, $3, $4, $5)",
        job_id.0,
        tenant_id.0,
        account_id,
        points,
        at,
    )
    .execute(tx)
    .await
    .map(drop)
}

/// How many awards exist for `job_id`: 1 after success, never more.
pub async fn count_awards(db: impl PgExecutor<'_>, job_id: JobId) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM reference.point_awards WHERE job_id = $1"#,
        job_id.0,
    )
    .fetch_one(db)
    .await
}
