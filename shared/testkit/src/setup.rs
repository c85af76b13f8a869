//! What a test starts from: the kit's clock start, seed, settings and sweep, harnesses built
//! from them, a batch run the way the Lambda runs one, and a pool of the test's own size.

use chrono::{DateTime, TimeZone, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use shared::clock::{Clock, ManualClock};
use shared::consumer::Consumer;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::upkeep::sweep::SweepSettings;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// When the kit's clock starts: 2026-11-30T12:00:00Z.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

/// The seed of every harness's backoff RNG.
pub const SEED: u64 = 42;

/// How long a copy waits for a concurrent copy's fence: longer than the default, so that many
/// copies racing on a loaded machine wait for the winner instead of being handed back (tests
/// of contention set their own, shorter).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the kit's fences live: a week (above the floor for the SQS default retention of
/// four days and the retry window), so that a test's "past the TTL" is a week on.
pub const FENCE_TTL: Duration = Duration::from_secs(7 * 86_400);

/// A sweep for tests: up to 1,000 rows a statement, a minute's budget, no pause, ledger rows
/// kept as long as the kit's fences ([`FENCE_TTL`]).
pub const SWEEP: SweepSettings = SweepSettings {
    batch_size: 1_000,
    budget: Duration::from_secs(60),
    pause: Duration::ZERO,
    ledger_ttl: FENCE_TTL,
};

/// The settings of the kit's harnesses: the defaults (platform retry policy, one transaction
/// per job), with [`FENCE_TTL`] and [`LOCK_TIMEOUT`]. A test changes what it tests:
/// `HarnessSettings { commit: CommitMode::Batch, ..settings() }`.
pub fn settings() -> HarnessSettings {
    HarnessSettings {
        fence_ttl: FENCE_TTL,
        lock_timeout: LOCK_TIMEOUT,
        ..Default::default()
    }
}

/// A harness for `consumer` on `pool` with `settings`, on `clock`, its RNG seeded with [`SEED`].
pub fn harness_on<C: Consumer>(
    pool: &PgPool,
    consumer: C,
    settings: HarnessSettings,
    clock: Arc<dyn Clock>,
) -> Harness<C> {
    Harness::new(
        consumer,
        pool.clone(),
        settings,
        clock,
        StdRng::seed_from_u64(SEED),
    )
}

/// A harness with `settings` on a [`ManualClock`] at [`t0`], and the clock to move it.
pub fn harness_with<C: Consumer>(
    pool: &PgPool,
    consumer: C,
    settings: HarnessSettings,
) -> (Harness<C>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let harness = harness_on(pool, consumer, settings, clock.clone());
    (harness, clock)
}

/// A harness with the kit's [`settings`], its clock standing at [`t0`].
pub fn harness<C: Consumer>(pool: &PgPool, consumer: C) -> Harness<C> {
    harness_with(pool, consumer, settings()).0
}

/// [`harness`] committing one transaction per job, or per batch.
pub fn harness_in<C: Consumer>(pool: &PgPool, consumer: C, commit: CommitMode) -> Harness<C> {
    harness_with(
        pool,
        consumer,
        HarnessSettings {
            commit,
            ..settings()
        },
    )
    .0
}

/// How many records of a batch the kit's harnesses run at once (as many as an SQS batch holds).
pub const CONCURRENCY: usize = 10;

/// `batch` through the harness as one SQS batch, no deadline, up to [`CONCURRENCY`] records at
/// once: the outcomes in the batch's order.
pub async fn run_batch<C: Consumer>(
    harness: &Harness<C>,
    batch: &[IncomingMessage],
) -> Vec<RecordOutcome> {
    run_batch_at(harness, batch, CONCURRENCY).await
}

/// [`run_batch`], up to `concurrency` records at once (a process deploys as many as its pool
/// has connections).
pub async fn run_batch_at<C: Consumer>(
    harness: &Harness<C>,
    batch: &[IncomingMessage],
    concurrency: usize,
) -> Vec<RecordOutcome> {
    harness
        .process_batch(batch, &|| true, concurrency)
        .await
        .into_iter()
        .map(|outcome| outcome.expect("every record starts: no deadline in the kit"))
        .collect()
}

/// A pool of its own on the test's database (`connect`, as `#[sqlx::test]` hands it over), of
/// up to `max_connections`: for tests whose copies or sessions each hold a connection at once
/// (the test's own pool is capped lower).
pub async fn own_pool(connect: PgConnectOptions, max_connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(connect)
        .await
        .expect("connecting to the test's database")
}
