//! The sweep's scenarios that more than one suite runs: `shared`'s sweeper tests on a plain
//! pool, and the e2e crate's through a transaction pooler.

use crate::{FENCE_TTL, t0};
use chrono::{DateTime, Duration as Span, Utc};
use shared::clock::ManualClock;
use shared::upkeep::sweep::{SweepSettings, SweepStop, sweep};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Seeds `n` fences of the reference consumer expiring at `expires_at` (processed a week before).
pub async fn seed_fences(pool: &PgPool, n: i64, expires_at: DateTime<Utc>) {
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         SELECT gen_random_uuid(), 'award-points', gen_random_uuid(), $2 - interval '7 days', $2
         FROM generate_series(1, $1)",
    )
    .bind(n)
    .bind(expires_at)
    .execute(pool)
    .await
    .expect("seeding fences");
}

/// How many fences there are.
pub async fn fence_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM core.processed_jobs")
        .fetch_one(pool)
        .await
        .expect("counting fences")
}

/// One sweep at a time: with 20,000 expired fences, a sweep on `sweeps` started while another
/// runs (40 batches of 500) returns at once (`Busy`) instead of waiting or competing for the
/// same rows; the first deletes them all, and the one after it runs (the turn was given back).
/// `observe` is a pool the sweeps do not use, to watch the first one start.
pub async fn assert_sweeps_take_turns(sweeps: &PgPool, observe: &PgPool) {
    seed_fences(observe, 20_000, t0() - Span::minutes(1)).await;
    let small = SweepSettings {
        batch_size: 500,
        budget: Duration::from_secs(600),
        pause: Duration::from_millis(5),
        ledger_ttl: FENCE_TTL,
    };
    let clock = Arc::new(ManualClock::new(t0()));
    let first = tokio::spawn({
        let (pool, clock) = (sweeps.clone(), clock.clone());
        async move { sweep(&pool, clock.as_ref(), small, None).await.unwrap() }
    });
    while fence_count(observe).await == 20_000 && !first.is_finished() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let second = sweep(sweeps, clock.as_ref(), small, None).await.unwrap();
    let first = first.await.unwrap();
    assert_eq!(
        (second.deleted, second.stop),
        (0, SweepStop::Busy),
        "{second:?}"
    );
    assert_eq!(
        (first.deleted, first.stop),
        (20_000, SweepStop::Done),
        "{first:?}"
    );
    assert_eq!(fence_count(observe).await, 0);
    let third = sweep(sweeps, clock.as_ref(), small, None).await.unwrap();
    assert_eq!(third.stop, SweepStop::Done, "the turn was given back");
}
