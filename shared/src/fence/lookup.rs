//! Reading fences: which jobs committed, with which digest, and until when.

use crate::envelope::JobDigest;
use crate::ids::{ConsumerName, JobId};
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

/// The committed fences among `jobs` for `consumer`, each with the digest it keeps (none for a
/// fence an older version wrote): one statement for a whole batch.
pub async fn processed_digests(
    db: impl PgExecutor<'_>,
    consumer: &ConsumerName,
    jobs: &[JobId],
) -> sqlx::Result<std::collections::HashMap<JobId, Option<JobDigest>>> {
    let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.0).collect();
    let found = sqlx::query!(
        "SELECT job_id, payload_digest FROM core.processed_jobs
         WHERE consumer = $1 AND job_id = ANY($2)",
        consumer.as_str(),
        &ids,
    )
    .fetch_all(db)
    .await?;
    Ok(found
        .into_iter()
        .map(|row| {
            let digest = row.payload_digest.as_deref().and_then(digest_of);
            (JobId(row.job_id), digest)
        })
        .collect())
}

/// A stored digest as a [`JobDigest`] (anything but 32 bytes is no digest).
pub(crate) fn digest_of(bytes: &[u8]) -> Option<JobDigest> {
    bytes.try_into().ok().map(JobDigest)
}

/// Whether a committed fence exists for (`job_id`, `consumer`): if so, a replay will be a no-op.
pub async fn fence_exists(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2)
             AS "exists!""#,
        job_id.0,
        consumer.as_str(),
    )
    .fetch_one(db)
    .await
}

/// Whether the committed fence of (`job_id`, `consumer`) stands for the job whose digest is
/// `digest`: the same digest, or one of its family of edits (`core.same_job`). False without
/// a fence.
pub async fn fenced_as_the_same_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
    digest: &JobDigest,
) -> sqlx::Result<bool> {
    Ok(fenced_job(db, job_id, consumer, Some(digest)).await? == Some(true))
}

/// What the committed fence of (`job_id`, `consumer`) says of the job whose digest is `digest`,
/// in one read: `None` without a fence; `Some(true)` for the same job (the same digest, one of
/// its family of edits, or a digest unknown on either side: `core.same_job`); `Some(false)` for
/// another job committed under the id.
pub async fn fenced_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
    digest: Option<&JobDigest>,
) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar!(
        r#"SELECT core.same_job($1, $2, $3, payload_digest) AS "same!" FROM core.processed_jobs
         WHERE job_id = $1 AND consumer = $2"#,
        job_id.0,
        consumer.as_str(),
        digest.map(|d| d.0.as_slice()),
    )
    .fetch_optional(db)
    .await
}

/// A committed fence, as operators see it (the API's `GET /v1/core/processed-jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ProcessedJob {
    /// The job.
    pub job_id: uuid::Uuid,
    /// The consumer whose work committed with it.
    pub consumer: String,
    /// The job's tenant.
    pub tenant_id: uuid::Uuid,
    /// When the work committed.
    pub processed_at: chrono::DateTime<chrono::Utc>,
    /// Until when a copy of the job is skipped as a duplicate (then the sweep removes it).
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// The committed fence of (`job_id`, `consumer`), if any.
pub async fn processed_job(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Option<ProcessedJob>> {
    sqlx::query_as!(
        ProcessedJob,
        "SELECT job_id, consumer, tenant_id, processed_at, expires_at
           FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2",
        job_id.0,
        consumer.as_str(),
    )
    .fetch_optional(db)
    .await
}

/// When the fence of (`job_id`, `consumer`) expires, if it exists.
pub async fn fence_expiry(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!(
        "SELECT expires_at FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2",
        job_id.0,
        consumer.as_str(),
    )
    .fetch_optional(db)
    .await
}

/// How many fences exist for `job_id` across all consumers.
pub async fn count_fences(db: impl PgExecutor<'_>, job_id: JobId) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM core.processed_jobs WHERE job_id = $1"#,
        job_id.0,
    )
    .fetch_one(db)
    .await
}
