//! What a test reads back (a fence, a job's letters, its executions, every table's row count)
//! and the few states it sets up by hand (executions charged, a fence held, a letter written, a
//! replay queued).
//! Each panics on a database error: a test has nothing better to do with one.

use crate::TestLetter;
use chrono::{DateTime, Utc};
use shared::dead_letter::{
    DeadLetter, ReplayOutcome, Verdict, letters_for_job, lock_letter, record_dead_letter,
};
use shared::fence::{FenceClaim, claim_fence, fence_exists};
use shared::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::BTreeMap;
use std::time::Duration;

/// Whether `job_id`'s fence for `consumer` has committed (its effect has).
pub async fn fence_committed(pool: &PgPool, job_id: JobId, consumer: &ConsumerName) -> bool {
    fence_exists(pool, job_id, consumer)
        .await
        .expect("reading the fence")
}

/// `job_id`'s dead letters for `consumer`, oldest first.
pub async fn letters(pool: &PgPool, job_id: JobId, consumer: &ConsumerName) -> Vec<DeadLetter> {
    letters_for_job(pool, job_id, consumer)
        .await
        .expect("reading the letters")
}

/// The executions `job_id`'s ledger for `consumer` has charged (0 without a ledger row).
pub async fn executions(pool: &PgPool, job_id: JobId, consumer: &ConsumerName) -> u32 {
    shared::ledger::executions_of(pool, consumer, &[job_id])
        .await
        .expect("reading the ledger")
        .get(&job_id)
        .copied()
        .unwrap_or(0)
}

/// Sets `job_id`'s execution ledger for `consumer` as if `executions` had run, the last ending
/// with `last_error` (`None`: without an outcome, as a crash leaves it). For testing what a
/// consumer does on its last attempt, or past its budget, without running it that often.
pub async fn charge_executions(
    pool: &PgPool,
    job_id: JobId,
    consumer: &ConsumerName,
    executions: u32,
    last_error: Option<&str>,
) {
    sqlx::query(
        "INSERT INTO core.job_executions (job_id, consumer, executions, last_error, updated_at)
         VALUES ($1, $2, $3, $4, now())
         ON CONFLICT (job_id, consumer) DO UPDATE SET executions = $3, last_error = $4",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .bind(i32::try_from(executions).expect("executions fit an i32"))
    .bind(last_error)
    .execute(pool)
    .await
    .expect("charging executions");
}

/// A transaction that has claimed `job_id`'s fence for `consumer` (of `tenant_id`, at `now`,
/// living a day) and holds it: another copy of the job is inside its transaction. Commit it to
/// let the copy's work count, drop or roll it back to let it go.
pub async fn hold_fence(
    pool: &PgPool,
    job_id: JobId,
    consumer: &ConsumerName,
    tenant_id: TenantId,
    now: DateTime<Utc>,
) -> Transaction<'static, Postgres> {
    let mut holder = shared::db::begin(pool).await.expect("BEGIN");
    let claim = claim_fence(
        &mut holder,
        job_id,
        consumer,
        tenant_id,
        now,
        Duration::from_secs(86_400),
        Duration::from_secs(1),
    )
    .await
    .expect("claiming the fence");
    assert_eq!(claim, FenceClaim::Claimed, "the fence was free");
    holder
}

/// Writes `letter` at `at`, as [`record_dead_letter`] does; its id.
pub async fn record_letter(pool: &PgPool, letter: &TestLetter, at: DateTime<Utc>) -> DeadLetterId {
    let mut conn = shared::db::acquire(pool).await.expect("a connection");
    let recorded = record_dead_letter(&mut conn, &letter.as_new(), at)
        .await
        .expect("writing the letter");
    conn.give_back();
    recorded
        .id()
        .expect("a letter written where it lives has its id")
}

/// Row counts of every table in every user schema, keyed `schema.table`.
pub async fn table_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT table_schema || '.' || table_name,
                (xpath('/row/c/text()', query_to_xml(
                    format('SELECT count(*) AS c FROM %I.%I', table_schema, table_name), false, true, '')))[1]::text::bigint
         FROM information_schema.tables
         WHERE table_type = 'BASE TABLE'
           AND table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_all(pool)
    .await
    .expect("counting rows")
    .into_iter()
    .collect()
}

/// Reviews letter `id` as replayed and queued, as the API's replay route records it before it
/// sends (with `edit`, the edited body an edit sends instead): what is sent, and when, is the
/// test's.
pub async fn queue_replay(pool: &PgPool, id: DeadLetterId, edit: Option<&str>) {
    let mut locked = lock_letter(pool, id, Duration::from_secs(5))
        .await
        .expect("locking the letter")
        .expect("the letter");
    let verdict = Verdict::Replayed {
        outcome: ReplayOutcome::Queued,
        reason: edit.map(|_| "an operator's correction".to_owned()),
        body: edit.map(str::to_owned),
    };
    locked
        .mark(&verdict, "ops-1", crate::t0())
        .await
        .expect("recording the replay");
    locked.commit().await.expect("committing the review");
}
