//! The two promises as every attack test reads them back in SQL, after whatever it did: no
//! job's effect applied twice (one award, one fence, no placeholder claim left), and no failure
//! without its true record (no letter pending for a job that committed, every letter in its
//! failure group, no pending letter in a resolved group, each group's counts equal to its
//! letters, one open group per failure).

use crate::groups::{counts_match_letters, one_open_group_per_failure};
use sqlx::PgPool;

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Asserts both promises over the reference consumer's effects and every letter.
pub async fn both_hold(pool: &PgPool) {
    let checks = [
        (
            "SELECT count(*) FROM (SELECT job_id FROM reference.point_awards
                 GROUP BY job_id HAVING count(*) > 1) twice",
            "a job's effect applied twice",
        ),
        (
            "SELECT count(*) FROM core.processed_jobs f
             WHERE NOT EXISTS (SELECT 1 FROM reference.point_awards a WHERE a.job_id = f.job_id)",
            "a fence without its effect: a placeholder claim outlived its call",
        ),
        (
            "SELECT count(*) FROM core.dead_letters d
             JOIN core.processed_jobs f ON f.job_id = d.job_id AND f.consumer = d.consumer
             WHERE d.status = 'pending_review' AND d.error_kind <> 'conflict'
               AND core.same_job(d.job_id, d.consumer, d.job_digest, f.payload_digest)",
            "a pending letter of a job whose effect committed",
        ),
        (
            "SELECT count(*) FROM core.dead_letters WHERE group_id IS NULL",
            "a letter in no failure group",
        ),
        (
            "SELECT count(*) FROM core.dead_letters d JOIN core.dead_letter_groups g ON g.id = d.group_id
             WHERE d.status = 'pending_review' AND g.resolved_at IS NOT NULL",
            "a pending letter in a resolved group",
        ),
    ];
    for (sql, broken) in checks {
        assert_eq!(count(pool, sql).await, 0, "{broken}");
    }
    counts_match_letters(pool).await;
    one_open_group_per_failure(pool).await;
}
