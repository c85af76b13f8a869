//! The reference consumer on the test kit: what a consumer's own tests look like.

use consumer::{AwardPoints, count_awards};
use serde_json::json;
use shared::dead_letter::ErrorKind;
use shared::harness::RecordOutcome;
use shared::metrics::Metric;
use shared_testkit::{TestKit, consumer_name};
use sqlx::PgPool;

fn kit(pool: &PgPool) -> TestKit<AwardPoints> {
    TestKit::new(
        pool.clone(),
        AwardPoints::new(consumer_name("award-points")),
    )
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_award_applies_once_however_often_it_is_delivered(pool: PgPool) {
    let kit = kit(&pool);
    let job = kit.job(json!({"account_id": "acct-1", "points": 40}));
    assert_eq!(kit.deliver(&job).await, RecordOutcome::Processed);
    assert_eq!(kit.deliver(&job).await, RecordOutcome::Duplicate);
    assert_eq!(kit.deliver_copy(&job).await, RecordOutcome::Duplicate);
    assert!(kit.is_processed(&job).await);
    assert_eq!(count_awards(&pool, job.job_id).await.unwrap(), 1);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn negative_points_a_blank_account_or_a_body_that_is_no_envelope_are_poison(pool: PgPool) {
    let kit = kit(&pool);
    for job in [
        kit.job(json!({"account_id": "acct-1", "points": -3})),
        kit.job(json!({"account_id": " ", "points": 3})),
        kit.raw("not an envelope"),
    ] {
        assert_eq!(
            kit.deliver(&job).await.dead_letter_kind(),
            Some(ErrorKind::Poison)
        );
        assert_eq!(count_awards(&pool, job.job_id).await.unwrap(), 0);
    }
}

/// The reference consumer runs in batch mode (its stanza sets `COMMIT_MODE=batch`): ten awards
/// in one transaction; a batch delivered again is ten duplicates; a poison award in a batch is
/// its own letter and costs its batch-mates nothing.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn in_batch_mode_ten_awards_commit_together_and_a_poison_one_costs_only_itself(pool: PgPool) {
    let kit = TestKit::in_batch_mode(
        pool.clone(),
        AwardPoints::new(consumer_name("award-points")),
    );
    let jobs: Vec<_> = (1..=10)
        .map(|points| kit.job(json!({"account_id": "acct-1", "points": points})))
        .collect();
    let batch: Vec<_> = jobs.iter().collect();
    assert_eq!(
        kit.deliver_batch(&batch).await,
        vec![RecordOutcome::Processed; 10]
    );
    assert_eq!(
        kit.deliver_batch(&batch).await,
        vec![RecordOutcome::Duplicate; 10]
    );
    assert_eq!(kit.harness().metrics().get(Metric::BatchCommitted), 1);

    let good = kit.job(json!({"account_id": "acct-2", "points": 5}));
    let poison = kit.job(json!({"account_id": "acct-2", "points": -5}));
    let outcomes = kit.deliver_batch(&[&good, &poison]).await;
    assert_eq!(outcomes[0], RecordOutcome::Processed);
    assert_eq!(outcomes[1].dead_letter_kind(), Some(ErrorKind::Poison));
    assert_eq!(count_awards(&pool, good.job_id).await.unwrap(), 1);
    assert_eq!(count_awards(&pool, poison.job_id).await.unwrap(), 0);
    for job in &jobs {
        assert_eq!(count_awards(&pool, job.job_id).await.unwrap(), 1);
    }
}
