//! The execution ledger, `core.job_executions`: how often a job's work has run, counted by the
//! harness rather than by SQS receives.
//!
//! Invariants: an execution is charged when it starts on a repeat delivery (a durable start
//! mark, before the work's transaction), or when a first delivery fails; a delivery that never
//! reaches the work (deadline hand-back, contended fence, a duplicate) charges nothing. Repeat
//! deliveries run one at a time, so a crash is charged to the job that was running and to no
//! batch-mate. A first delivery that succeeds writes nothing here (spec: successes are metrics).
//! The row goes when the job commits ([`crate::fence::finish_job`]) or is dead-lettered.

use crate::dead_letter::ErrorKind;
use crate::ids::{ConsumerName, DeadLetterId, JobId};
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use std::collections::HashMap;
use uuid::Uuid;

/// What the ledger says of a job before a repeat delivery runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Run it: this is execution `attempt` (1-based), already charged.
    Run {
        /// The execution's number.
        attempt: u32,
    },
    /// A committed fence exists: the job is done, with the digest its fence keeps (none for a
    /// fence an older version wrote).
    AlreadyProcessed {
        /// What made up the job that committed.
        committed: Option<crate::envelope::JobDigest>,
    },
    /// This very message already has its dead letter (its acknowledgement was lost).
    AlreadyLettered {
        /// The letter.
        id: DeadLetterId,
        /// Its kind.
        kind: ErrorKind,
    },
    /// The job has had all its executions; it must be dead-lettered without running again.
    OverBudget(Ledger),
}

/// A job's executions so far and how the last one ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Ledger {
    /// Executions charged.
    #[sqlx(try_from = "i32")]
    pub executions: u32,
    /// The last failure that ended normally; `None` when the last execution ended without an
    /// outcome (a crash, a timeout), or when none ran.
    pub last_error: Option<String>,
}

impl Ledger {
    /// The letter a job past its budget (or redriven to the DLQ) gets: `exhausted` with its last
    /// error when its last execution failed and was recorded, else `crashed`.
    pub fn verdict(&self, max_attempts: u32, context: &str) -> (ErrorKind, String) {
        match &self.last_error {
            Some(error) if self.executions >= max_attempts => (
                ErrorKind::Exhausted,
                format!(
                    "{error} (attempt {} of {max_attempts}; {context})",
                    self.executions
                ),
            ),
            _ => (
                ErrorKind::Crashed,
                format!(
                    "{context}; {} of {max_attempts} executions ran and the last ended without an \
                     outcome (a timeout, a crash or out of memory)",
                    self.executions
                ),
            ),
        }
    }
}

/// What [`start_execution`]'s statement returns: the fence (done, digest), this message's letter
/// (id, kind), the ledger (executions, last error), and the execution charged (if it was).
type StartRow = (
    bool,
    Option<Vec<u8>>,
    Option<Uuid>,
    Option<String>,
    Option<i32>,
    Option<String>,
    Option<i32>,
);

/// Before a repeat delivery runs: in one statement, is the job already done, does this message
/// already have its letter, is the job over its budget, and if none of these, charges the
/// execution (clearing the last error, so a crash leaves it empty).
// Long for its one statement: the SQL is most of it, and reads best whole.
pub async fn start_execution(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
    message_id: &str,
    max_attempts: u32,
    now: DateTime<Utc>,
) -> sqlx::Result<Start> {
    // As the letter keeps it (see `bounded_id`), so a long id finds its letter.
    let message_id = crate::ids::bounded_id(message_id, "message");
    // What the fence, the letters and the ledger say of the job, and the execution's charge
    // when none of them stops it.
    let row = sqlx::query!(
        r#"WITH fence AS (
             SELECT EXISTS (SELECT 1 FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2) AS done,
                    (SELECT payload_digest FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2) AS digest),
         letter AS (
             SELECT id, error_kind FROM core.dead_letters WHERE consumer = $2 AND message_id = $3),
         ledger AS (
             SELECT executions, last_error FROM core.job_executions WHERE job_id = $1 AND consumer = $2),
         mark AS (
             INSERT INTO core.job_executions AS e (job_id, consumer, executions, updated_at)
             SELECT $1, $2, 1, $5
             WHERE NOT (SELECT done FROM fence) AND NOT EXISTS (SELECT 1 FROM letter)
               AND coalesce((SELECT executions FROM ledger), 0) < $4
             ON CONFLICT (job_id, consumer) DO UPDATE
                 SET executions = e.executions + 1, last_error = NULL, updated_at = $5
                 WHERE e.executions < $4
             RETURNING executions)
         SELECT (SELECT done FROM fence) AS "done!",
                (SELECT digest FROM fence) AS "digest?",
                (SELECT id FROM letter) AS "letter?",
                (SELECT error_kind FROM letter) AS "letter_kind?",
                (SELECT executions FROM ledger) AS "executions?",
                (SELECT last_error FROM ledger) AS "last_error?",
                (SELECT executions FROM mark) AS "charged?""#,
        job_id.0,
        consumer.as_str(),
        &*message_id,
        i32::try_from(max_attempts).unwrap_or(i32::MAX),
        now,
    )
    .fetch_one(db)
    .await?;
    Ok(start_of((
        row.done,
        row.digest,
        row.letter,
        row.letter_kind,
        row.executions,
        row.last_error,
        row.charged,
    )))
}

/// What the row of [`start_execution`]'s statement says, in the order it is decided: done,
/// lettered, run, over budget.
fn start_of(row: StartRow) -> Start {
    let (processed, digest, letter, letter_kind, executions, last_error, charged) = row;
    if processed {
        Start::AlreadyProcessed {
            committed: digest.as_deref().and_then(crate::fence::digest_of),
        }
    } else if let Some(id) = letter {
        Start::AlreadyLettered {
            id: DeadLetterId(id),
            kind: letter_kind
                .as_deref()
                .and_then(ErrorKind::parse)
                .unwrap_or(ErrorKind::Crashed),
        }
    } else if let Some(attempt) = charged {
        Start::Run {
            attempt: attempt as u32,
        }
    } else {
        Start::OverBudget(Ledger {
            executions: executions.unwrap_or(0).max(0) as u32,
            last_error,
        })
    }
}

/// Takes back the charge of an execution that did not run after all (its fence was contended).
pub async fn uncharge(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE core.job_executions SET executions = greatest(executions - 1, 0)
         WHERE job_id = $1 AND consumer = $2",
        job_id.0,
        consumer.as_str(),
    )
    .execute(db)
    .await
    .map(drop)
}

/// Records that an execution failed transiently with `error`. `charged` says whether its start
/// was already counted (a repeat delivery); a first delivery is counted here. Returns the
/// job's executions so far, which number this attempt.
pub async fn record_failure(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
    charged: bool,
    error: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<u32> {
    let error = crate::dead_letter::storable_error(error);
    let executions: i32 = sqlx::query_scalar!(
        "INSERT INTO core.job_executions AS e (job_id, consumer, executions, last_error, updated_at)
         VALUES ($1, $2, 1, $3, $5)
         ON CONFLICT (job_id, consumer) DO UPDATE
             SET executions = e.executions + CASE WHEN $4 THEN 0 ELSE 1 END,
                 last_error = $3, updated_at = $5
         RETURNING executions",
        job_id.0,
        consumer.as_str(),
        &*error,
        charged,
        now,
    )
    .fetch_one(db)
    .await?;
    Ok(executions.max(1) as u32)
}

/// The ledger of one job (empty if none ran or it finished).
pub async fn ledger(
    db: impl PgExecutor<'_>,
    job_id: JobId,
    consumer: &ConsumerName,
) -> sqlx::Result<Ledger> {
    let Some(row) = sqlx::query!(
        "SELECT executions, last_error FROM core.job_executions WHERE job_id = $1 AND consumer = $2",
        job_id.0,
        consumer.as_str(),
    )
    .fetch_optional(db)
    .await?
    else {
        return Ok(Ledger::default());
    };
    ledger_of(row.executions, row.last_error)
}

/// The ledgers of `jobs` in one statement (a job with none is absent: it has none, or it
/// finished): what the DLQ ingester judges a batch's redriven jobs by, one read per batch.
pub async fn ledgers_of(
    db: impl PgExecutor<'_>,
    consumer: &ConsumerName,
    jobs: &[JobId],
) -> sqlx::Result<HashMap<JobId, Ledger>> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
    let rows = sqlx::query!(
        "SELECT job_id, executions, last_error FROM core.job_executions
         WHERE consumer = $1 AND job_id = ANY($2)",
        consumer.as_str(),
        &ids,
    )
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|r| Ok((JobId(r.job_id), ledger_of(r.executions, r.last_error)?)))
        .collect()
}

/// A ledger row as read: a count that is no `u32` is a decode error (the table's CHECK keeps it
/// at zero or more).
fn ledger_of(executions: i32, last_error: Option<String>) -> sqlx::Result<Ledger> {
    let executions = u32::try_from(executions).map_err(|e| sqlx::Error::ColumnDecode {
        index: "executions".into(),
        source: Box::new(e),
    })?;
    Ok(Ledger {
        executions,
        last_error,
    })
}

/// The executions charged to each of `jobs` (absent: none), for ordering a batch's repeat
/// deliveries so that jobs that have not run go before jobs that have.
pub async fn executions_of(
    db: impl PgExecutor<'_>,
    consumer: &ConsumerName,
    jobs: &[JobId],
) -> sqlx::Result<HashMap<JobId, u32>> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
    let rows = sqlx::query!(
        "SELECT job_id, executions FROM core.job_executions
         WHERE consumer = $1 AND job_id = ANY($2)",
        consumer.as_str(),
        &ids,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (JobId(r.job_id), r.executions.max(0) as u32))
        .collect())
}

/// Deletes up to `limit` ledger rows untouched since `before` (their job's messages are gone:
/// the caller passes a time at least one fence TTL ago). Returns how many.
pub async fn sweep_stale_ledgers(
    db: impl PgExecutor<'_>,
    before: DateTime<Utc>,
    limit: i64,
) -> sqlx::Result<u64> {
    sqlx::query!(
        "DELETE FROM core.job_executions WHERE ctid IN (
             SELECT ctid FROM core.job_executions WHERE updated_at < $1 ORDER BY updated_at LIMIT $2)",
        before,
        limit,
    )
    .execute(db)
    .await
    .map(|r| r.rows_affected())
}
