//! The redeem-reward consumer through the real harness, on the test kit: a fresh database with
//! the core schema and this consumer's, per test.

use redeem_reward::{RedeemReward, count_redemptions};
use serde_json::json;
use shared::dead_letter::ErrorKind;
use shared::harness::RecordOutcome;
use shared::retry::RetryPolicy;
use shared_testkit::{TestKit, consumer_name};
use sqlx::PgPool;
use std::time::Duration;

fn kit(pool: &PgPool) -> TestKit<RedeemReward> {
    let consumer = RedeemReward::new(consumer_name("redeem-reward"));
    // The queue's own policy, as template.yaml sets it.
    let policy = RetryPolicy::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    TestKit::with_policy(pool.clone(), consumer, policy)
}

#[sqlx::test(migrator = "redeem_reward::MIGRATOR_WITH_CORE")]
async fn a_redemption_applies_once_and_a_copy_is_a_duplicate(pool: PgPool) {
    let kit = kit(&pool);
    let job = kit.job(json!({"account_id": "a-1", "reward_sku": "mug", "cost_points": 500}));
    assert_eq!(kit.deliver(&job).await, RecordOutcome::Processed);
    assert_eq!(kit.deliver_copy(&job).await, RecordOutcome::Duplicate);
    assert_eq!(kit.deliver(&job).await, RecordOutcome::Duplicate);
    assert!(kit.is_processed(&job).await);
    assert_eq!(count_redemptions(&pool, job.job_id).await.unwrap(), 1);
    assert!(kit.letters(&job).await.is_empty());
    assert_eq!(
        kit.harness().metrics().custom("PointsRedeemed"),
        500,
        "its own metric"
    );
}

#[sqlx::test(migrator = "redeem_reward::MIGRATOR_WITH_CORE")]
async fn a_meaningless_redemption_is_poison_without_retry(pool: PgPool) {
    let kit = kit(&pool);
    for payload in [
        json!({"account_id": "a-1", "reward_sku": "mug", "cost_points": 0}),
        json!({"account_id": " ", "reward_sku": "mug", "cost_points": 5}),
        json!({"account_id": "a-1", "reward_sku": "mug"}),
    ] {
        let job = kit.job(payload);
        assert_eq!(
            kit.deliver(&job).await.dead_letter_kind(),
            Some(ErrorKind::Poison)
        );
        assert_eq!(kit.letters(&job).await[0].attempts, 1);
        assert_eq!(count_redemptions(&pool, job.job_id).await.unwrap(), 0);
    }
}

/// The queue's fast policy: a redemption that keeps failing is a letter after 3 executions.
#[sqlx::test(migrator = "redeem_reward::MIGRATOR_WITH_CORE")]
async fn a_redemption_that_keeps_failing_is_exhausted_after_three_executions(pool: PgPool) {
    let kit = kit(&pool);
    let job = kit.job(json!({"account_id": "a-1", "reward_sku": "mug", "cost_points": 5}));
    // The table is briefly unwritable (a migration holding a lock, say): every attempt fails.
    sqlx::query("ALTER TABLE rewards.redemptions ADD CONSTRAINT closed CHECK (false) NOT VALID")
        .execute(&pool)
        .await
        .unwrap();
    for attempt in 1..=2 {
        let outcome = kit.deliver(&job).await;
        assert!(
            matches!(outcome, RecordOutcome::Retry { attempt: a, .. } if a == attempt),
            "{outcome:?}"
        );
    }
    assert_eq!(
        kit.deliver(&job).await.dead_letter_kind(),
        Some(ErrorKind::Exhausted)
    );
    assert_eq!(kit.letters(&job).await[0].attempts, 3);
    assert_eq!(count_redemptions(&pool, job.job_id).await.unwrap(), 0);
}
