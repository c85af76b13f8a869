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
