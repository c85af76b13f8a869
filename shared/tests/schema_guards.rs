//! The database itself keeps `core.dead_letters` append-only: these tests go around every API
//! with raw SQL, as a careless script or a bug would, and must be refused.

use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;

async fn a_letter(pool: &PgPool) -> uuid::Uuid {
    let payload = serde_json::json!({"job_id": uuid::Uuid::new_v4()});
    let job_id = shared::ids::JobId(uuid::Uuid::new_v4());
    let letter = TestLetter {
        correlation_id: Some("c".into()),
        ..TestLetter::new(Some(job_id), &reference_name(), QUEUE, &payload.to_string())
    };
    record_letter(pool, &letter, t0()).await.0
}

async fn refused(pool: &PgPool, sql: &'static str, id: uuid::Uuid) -> String {
    let err = sqlx::query(sql)
        .bind(id)
        .execute(pool)
        .await
        .expect_err(sql);
    err.to_string()
}

async fn status_of(pool: &PgPool, id: uuid::Uuid) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, discard_reason FROM core.dead_letters WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn deleting_a_dead_letter_is_rejected(pool: PgPool) {
    let id = a_letter(&pool).await;
    let err = refused(&pool, "DELETE FROM core.dead_letters WHERE id = $1", id).await;
    assert!(err.contains("append-only"), "{err}");
    // Refused by the alert groups' foreign key, and with CASCADE by the append-only guard.
    let pool = &pool;
    let truncate = |sql: &'static str| async move {
        sqlx::query(sql)
            .execute(pool)
            .await
            .unwrap_err()
            .to_string()
    };
    let plain = truncate("TRUNCATE core.dead_letters").await;
    assert!(plain.contains("foreign key"), "{plain}");
    let cascade = truncate("TRUNCATE core.dead_letters CASCADE").await;
    assert!(cascade.contains("append-only"), "{cascade}");
    assert_eq!(status_of(pool, id).await.0, "pending_review");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn changing_a_dead_letters_payload_or_history_is_rejected(pool: PgPool) {
    let id = a_letter(&pool).await;
    for sql in [
        "UPDATE core.dead_letters SET payload = '{}' WHERE id = $1",
        "UPDATE core.dead_letters SET attempts = 1 WHERE id = $1",
        "UPDATE core.dead_letters SET last_error = 'nothing happened' WHERE id = $1",
        "UPDATE core.dead_letters SET group_id = NULL WHERE id = $1",
    ] {
        let err = refused(&pool, sql, id).await;
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    // Sneaking a payload change in with a legitimate review is refused too.
    let err = refused(
        &pool,
        "UPDATE core.dead_letters SET status = 'replayed', reviewed_by = 'ops', reviewed_at = now(),
                payload = '{}' WHERE id = $1",
        id,
    )
    .await;
    assert!(err.contains("only the review columns"), "{err}");
    assert_eq!(status_of(&pool, id).await.0, "pending_review");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn discarding_without_a_reason_is_rejected(pool: PgPool) {
    let id = a_letter(&pool).await;
    for sql in [
        "UPDATE core.dead_letters SET status = 'discarded', reviewed_by = 'ops', reviewed_at = now() WHERE id = $1",
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = '  ', reviewed_by = 'ops', reviewed_at = now() WHERE id = $1",
    ] {
        let err = refused(&pool, sql, id).await;
        assert!(err.contains("dead_letters_discard_needs_reason"), "{err}");
    }
    assert_eq!(status_of(&pool, id).await, ("pending_review".into(), None));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_review_needs_a_reviewer_and_a_time(pool: PgPool) {
    let id = a_letter(&pool).await;
    let err = refused(
        &pool,
        "UPDATE core.dead_letters SET status = 'replayed' WHERE id = $1",
        id,
    )
    .await;
    assert!(err.contains("dead_letters_reviewer_iff_reviewed"), "{err}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reviewed_letter_cannot_move_again(pool: PgPool) {
    let id = a_letter(&pool).await;
    sqlx::query("UPDATE core.dead_letters SET status = 'replayed', reviewed_by = 'ops', reviewed_at = now() WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .expect("pending_review -> replayed is the allowed transition");
    for sql in [
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'oops' WHERE id = $1",
        "UPDATE core.dead_letters SET status = 'pending_review', reviewed_by = NULL, reviewed_at = NULL WHERE id = $1",
    ] {
        let err = refused(&pool, sql, id).await;
        assert!(err.contains("may only move pending_review"), "{sql}: {err}");
    }
    assert_eq!(status_of(&pool, id).await.0, "replayed");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn discarding_with_a_reason_is_the_allowed_transition(pool: PgPool) {
    let id = a_letter(&pool).await;
    sqlx::query(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'test traffic',
                reviewed_by = 'ops', reviewed_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        status_of(&pool, id).await,
        ("discarded".into(), Some("test traffic".into()))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_dead_letter_without_a_job_must_be_poison(pool: PgPool) {
    let err = sqlx::query(
        "INSERT INTO core.dead_letters (consumer, queue, message_id, payload, attempts, error_kind, last_error, created_at)
         VALUES ('c', 'q', 'm', '{}', 5, 'exhausted', 'x', now())",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("dead_letters_identified"), "{err}");
}

/// A letter costs what it must (issue 36, migrations 0033-0036): the list indexes by tenant, by
/// correlation id and by job keep only letters that have one (every query that reads them asks
/// for one with `=`), so a poison message that carried none writes no entry in them; and the
/// queries that read them still take them: the list by each, and the sweep's "no pending letter
/// for this job", whose job comes from the fence it joins.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_list_indexes_of_nullable_columns_keep_only_letters_that_have_a_value(pool: PgPool) {
    for (index, column) in [
        ("dead_letters_tenant_created_idx", "tenant_id"),
        ("dead_letters_correlation_created_idx", "correlation_id"),
        ("dead_letters_job_idx", "job_id"),
    ] {
        let predicate: Option<String> = sqlx::query_scalar(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i
              WHERE i.indexrelid = ('core.' || $1)::regclass",
        )
        .bind(index)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            predicate,
            Some(format!("({column} IS NOT NULL)")),
            "{index}"
        );
    }
    a_letter(&pool).await;
    // Enough letters and expired fences for the plans a large table gets.
    for sql in [
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
             attempts, error_kind, last_error, created_at)
         SELECT CASE WHEN g % 3 > 0 THEN gen_random_uuid() END, 'c', 'q', 'm' || g, NULL, '[]',
                1, 'poison', 'not an envelope', now()
           FROM generate_series(1, 2000) AS g",
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         SELECT gen_random_uuid(), 'c', gen_random_uuid(), now() - interval '2 days',
                now() - interval '1 day'
           FROM generate_series(1, 2000)",
        "ANALYZE core.dead_letters",
        "ANALYZE core.processed_jobs",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    // The tables are tiny here: the plans a large table gets (index scans, the sweep's nested
    // loop probing the letters per fence) are asked for, to see the partial index can serve them.
    // In one transaction, its settings local to it: through a transaction pooler (the guarantee
    // tests' second pass) a session's `SET` stays on whichever server connection it ran on, and
    // the next statement may run on another (it did once, a hash anti join).
    let mut tx = shared::db::begin(&pool).await.unwrap();
    for off in ["enable_seqscan", "enable_hashjoin", "enable_mergejoin"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("SET LOCAL {off} = off")))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    for (sql, index) in [
        (
            "EXPLAIN SELECT id FROM core.dead_letters WHERE tenant_id = $1::uuid
              ORDER BY created_at DESC, id DESC LIMIT 50",
            "dead_letters_tenant_created_idx",
        ),
        (
            "EXPLAIN SELECT id FROM core.dead_letters WHERE correlation_id = $1::text
              ORDER BY created_at DESC, id DESC LIMIT 50",
            "dead_letters_correlation_created_idx",
        ),
        (
            "EXPLAIN SELECT p.job_id FROM core.processed_jobs p
              WHERE p.expires_at < now() AND p.job_id <> $1::uuid
                AND NOT EXISTS (SELECT 1 FROM core.dead_letters d
                                 WHERE d.job_id = p.job_id AND d.consumer = p.consumer
                                   AND d.status = 'pending_review')",
            "dead_letters_job_idx",
        ),
    ] {
        let value = "00000000-0000-0000-0000-000000000001";
        let plan: Vec<String> = sqlx::query_scalar(sql)
            .bind(value)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains(index), "{sql}:\n{plan}");
    }
    tx.rollback().await.unwrap();
}
