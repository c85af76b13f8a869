//! The reference consumer: awards points to an account, as a row in `reference.point_awards`.
//!
//! The consumer the tests and the demo run; `functions/redeem-reward` is the one to copy.
//! Its effect table has no unique constraint on `job_id` on purpose: only the fence prevents a
//! double award, so a broken fence shows up as two rows.
//!
//! `demo_fault` makes a job fail on purpose, so the demo and end-to-end runs can show every path.
//! It exists only with the `demo-faults` feature, which the test crate's local binaries enable:
//! the deployed consumer has no such field, so a message asking for a fault is poison there and
//! nobody who can send to the queue can make the consumer crash itself.

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
    /// A failure to simulate, for demos and end-to-end tests (this crate's feature `demo-faults` only).
    #[cfg(feature = "demo-faults")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demo_fault: Option<DemoFault>,
}

/// A failure the reference consumer simulates on request (this crate's feature `demo-faults` only).
#[cfg(feature = "demo-faults")]
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
        let award = &job.envelope.payload;
        validate(award)?;
        insert_award(
            tx,
            job.envelope.job_id,
            job.envelope.tenant_id,
            &award.account_id,
            award.points,
            job.started_at,
        )
        .await?;
        #[cfg(feature = "demo-faults")]
        return simulate(award.demo_fault, job);
        #[cfg(not(feature = "demo-faults"))]
        Ok(())
    }

    /// Batch mode: the batch's awards in one statement. A job that is not valid fails the
    /// batch, which then runs one job at a time, where that job alone becomes its letter.
    async fn handle_batch(
        &self,
        jobs: &[Job<PointsAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        for job in jobs {
            validate(&job.envelope.payload)?;
        }
        insert_awards(tx, jobs).await?;
        #[cfg(feature = "demo-faults")]
        for job in jobs {
            simulate(job.envelope.payload.demo_fault, job)?;
        }
        Ok(())
    }
}

/// What makes an award meaningless (poison): the same checks job by job and in a batch.
fn validate(award: &PointsAward) -> Result<(), ProcessError> {
    if award.points <= 0 {
        return Err(ProcessError::poison(format!(
            "points must be positive, got {}",
            award.points
        )));
    }
    if award.account_id.trim().is_empty() {
        return Err(ProcessError::poison("account_id is blank"));
    }
    Ok(())
}

/// Writes the awards of `jobs` on the caller's transaction, in one statement.
pub async fn insert_awards(tx: &mut PgConnection, jobs: &[Job<PointsAward>]) -> sqlx::Result<()> {
    let mut job_ids = Vec::with_capacity(jobs.len());
    let mut tenants = Vec::with_capacity(jobs.len());
    let mut accounts = Vec::with_capacity(jobs.len());
    let mut points = Vec::with_capacity(jobs.len());
    let mut at = Vec::with_capacity(jobs.len());
    for job in jobs {
        job_ids.push(job.envelope.job_id.0);
        tenants.push(job.envelope.tenant_id.0);
        accounts.push(job.envelope.payload.account_id.as_str());
        points.push(job.envelope.payload.points);
        at.push(job.started_at);
    }
    sqlx::query(
        "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
         SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::timestamptz[])",
    )
    .bind(&job_ids)
    .bind(&tenants)
    .bind(&accounts)
    .bind(&points)
    .bind(&at)
    .execute(tx)
    .await
    .map(drop)
}

#[cfg(feature = "demo-faults")]
fn simulate(fault: Option<DemoFault>, job: &Job<PointsAward>) -> Result<(), ProcessError> {
    match fault {
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

/// Writes one award on the caller's transaction.
pub async fn insert_award(
    tx: &mut PgConnection,
    job_id: JobId,
    tenant_id: TenantId,
    account_id: &str,
    points: i64,
    at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(job_id.0)
    .bind(tenant_id.0)
    .bind(account_id)
    .bind(points)
    .bind(at)
    .execute(tx)
    .await
    .map(drop)
}

/// How many awards exist for `job_id`: 1 after success, never more.
pub async fn count_awards(db: impl PgExecutor<'_>, job_id: JobId) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM reference.point_awards WHERE job_id = $1")
        .bind(job_id.0)
        .fetch_one(db)
        .await
}
