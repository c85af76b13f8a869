//! A job's fence claimed inside its work's transaction, or settled for a letter.

use super::{FenceClaim, FenceError, claim_error, expiry, lock_wait};
use crate::envelope::JobDigest;
use crate::ids::{ConsumerName, JobId, TenantId};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::time::Duration;

/// Inserts the fence of (`job_id`, `consumer`) in the caller's transaction, expiring at
/// `now + ttl`. Waits at most `wait` for a concurrent copy holding the fence; that bound
/// applies to the claim only, and the rest of the transaction (the work) waits as it needs.
/// A claim without a digest (a placeholder, rolled back) never finds a conflict.
pub async fn claim_fence(
    tx: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<FenceClaim, FenceError> {
    claim_job_fence(tx, job_id, consumer, tenant_id, None, now, ttl, wait).await
}

/// [`claim_fence`] for a job whose `digest` the fence keeps, and compares: an existing fence
/// with another digest is [`FenceClaim::Conflict`] (one written without a digest, by an older
/// version, compares equal to any).
#[allow(clippy::too_many_arguments)]
pub async fn claim_job_fence(
    tx: &mut PgConnection,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<FenceClaim, FenceError> {
    // One round trip: `core.claim_job_fence` sets the lock timeout for the insert only, and
    // compares the digest only when the fence was there (see migrations 0007 and 0014), so
    // the transaction is BEGIN, claim, work, COMMIT.
    let claim = sqlx::query_scalar!(
        r#"SELECT core.claim_job_fence($1, $2, $3, $4, $5, $6, $7) AS "claim!""#,
        job_id.0,
        consumer.as_str(),
        tenant_id.0,
        now,
        expiry(now, ttl),
        lock_wait(wait),
        digest.map(|d| d.0.as_slice()),
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(claim_error)?;
    Ok(match claim.as_str() {
        "claimed" => FenceClaim::Claimed,
        "conflict" => FenceClaim::Conflict,
        _ => FenceClaim::Duplicate,
    })
}

/// Whether `committed`, the digest a fence keeps, says a copy with `digest` is another job.
pub fn conflicts(committed: Option<&JobDigest>, digest: &JobDigest) -> bool {
    committed.is_some_and(|c| c != digest)
}

/// Whether the job's effect committed, settled through its fence rather than read: a claim
/// waits (at most `wait`) for a copy still inside its transaction, so an in-flight commit is
/// seen as it ends. The claim is rolled back. For a `COMMIT` whose reply was lost. With the
/// job's `digest`, a fence of another job under its id is not this job committed.
pub(crate) async fn settle_committed(
    pool: &sqlx::PgPool,
    job_id: JobId,
    consumer: &ConsumerName,
    digest: Option<&JobDigest>,
    now: DateTime<Utc>,
    wait: Duration,
) -> Result<bool, FenceError> {
    let mut tx = crate::db::begin(pool).await?;
    let placeholder = TenantId(uuid::Uuid::nil());
    let claim = claim_job_fence(
        &mut tx,
        job_id,
        consumer,
        placeholder,
        digest,
        now,
        Duration::from_secs(60),
        wait,
    )
    .await;
    // Answered before the caller goes on: a dropped transaction's ROLLBACK would go out later.
    tx.rollback().await?;
    Ok(claim? == FenceClaim::Duplicate)
}

/// Claims, in the caller's transaction and in job id order, the fences of a batch's jobs
/// (`(job, tenant, digest)`, the digest kept in the fence), expiring at `now + ttl`; returns the
/// jobs whose fence this transaction inserted. A job left out had a fence already: a duplicate,
/// or another job under its id, which the caller tells apart on its own. Waits at most `wait`
/// for a concurrent copy holding one of the fences ([`FenceError::Contended`] after that: the
/// transaction is aborted). Two batches that share jobs claim them in the same order, so they
/// wait on each other and never deadlock.
pub async fn claim_job_fences(
    tx: &mut PgConnection,
    consumer: &ConsumerName,
    jobs: &[(JobId, TenantId, Option<JobDigest>)],
    now: DateTime<Utc>,
    ttl: Duration,
    wait: Duration,
) -> Result<std::collections::HashSet<JobId>, FenceError> {
    let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.0.0).collect();
    let tenants: Vec<uuid::Uuid> = jobs.iter().map(|j| j.1.0).collect();
    let digests: Vec<Option<Vec<u8>>> = jobs.iter().map(|j| j.2.map(|d| d.0.to_vec())).collect();
    let claimed = sqlx::query_scalar!(
        r#"SELECT core.claim_job_fences($1, $2, $3, $4, $5, $6, $7) AS "claimed!""#,
        &ids,
        consumer.as_str(),
        &tenants,
        now,
        expiry(now, ttl),
        lock_wait(wait),
        // `bytea[]` with NULL elements, which the macro's check knows only as `&[Vec<u8>]`.
        &digests as _,
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(claim_error)?;
    Ok(claimed.into_iter().map(JobId).collect())
}
