//! The TTL sweep against real PostgreSQL (AC6): what it removes, what it must never remove, and
//! how it behaves in batches, next to another sweep, and next to consumers.

use chrono::{DateTime, Duration as Span};
use consumer::AwardPoints;
use shared::clock::ManualClock;
use shared::fence::fence_exists;
use shared::harness::RecordOutcome;
use shared::upkeep::sweep::{SweepSettings, SweepStop, sweep, sweep_expired};
use shared_testkit::reference::*;
use shared_testkit::sweeps::{fence_count as fences, seed_fences as seed};
use shared_testkit::*;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

const ALL_AT_ONCE: SweepSettings = SweepSettings {
    batch_size: 1_000,
    budget: Duration::from_secs(600),
    pause: Duration::ZERO,
    ledger_ttl: Duration::from_secs(7 * 86_400),
};

async fn expiring(pool: &PgPool, at: DateTime<chrono::Utc>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM core.processed_jobs WHERE expires_at = $1")
        .bind(at)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// AC6: rows just past their expiry go; rows just inside it stay.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac6_sweep_removes_rows_just_past_expiry_and_keeps_rows_just_inside(pool: PgPool) {
    let now = t0();
    seed(&pool, 3, now - Span::seconds(1)).await;
    seed(&pool, 4, now + Span::seconds(1)).await;
    seed(&pool, 2, now).await; // expires exactly now: not yet past
    let report = sweep(&pool, &ManualClock::new(now), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!((report.deleted, report.stop), (3, SweepStop::Done));
    assert_eq!(expiring(&pool, now - Span::seconds(1)).await, 0);
    assert_eq!(expiring(&pool, now + Span::seconds(1)).await, 4);
    assert_eq!(expiring(&pool, now).await, 2);
    assert_eq!(report.backlog, Duration::ZERO, "nothing overdue is left");
}

/// AC6: a fence inside its retry window is never removed, so the late retry is a duplicate.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac6_a_fence_inside_its_retry_window_is_never_removed(pool: PgPool) {
    let (harness, clock) = harness_with(&pool, award_points(), settings());
    let (job_id, body) = job(award(1));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    // The latest a copy can arrive: the whole retention (4 days) plus the retry window.
    let latest_copy = t0() + Span::days(4) + Span::seconds(675);
    let swept = sweep(&pool, &ManualClock::new(latest_copy), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(swept.deleted, 0);
    assert!(
        fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
    clock.set(latest_copy);
    assert_eq!(
        harness.process(&message(&body, 2)).await,
        RecordOutcome::Duplicate,
        "the late copy is fenced out"
    );
    // Past its TTL (7 days) the fence goes.
    let later = t0() + Span::days(7) + Span::seconds(1);
    assert_eq!(
        sweep(&pool, &ManualClock::new(later), ALL_AT_ONCE, None)
            .await
            .unwrap()
            .deleted,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_larger_than_one_batch_loops_until_a_short_batch(pool: PgPool) {
    seed(&pool, 12_345, t0() - Span::hours(1)).await;
    seed(&pool, 10, t0() + Span::days(1)).await;
    let report = sweep(&pool, &ManualClock::new(t0()), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.stop),
        (12_345, 13, SweepStop::Done)
    );
    assert_eq!(fences(&pool).await, 10);
    assert_eq!(
        report.oldest_age.unwrap(),
        Duration::from_secs(6 * 86_400),
        "oldest left: processed 6 days ago"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_stops_at_its_budget_and_reports_the_backlog(pool: PgPool) {
    seed(&pool, 5_000, t0() - Span::hours(2)).await;
    let budgeted = SweepSettings {
        batch_size: 1_000,
        budget: Duration::ZERO,
        pause: Duration::ZERO,
        ledger_ttl: Duration::from_secs(7 * 86_400),
    };
    let report = sweep(&pool, &ManualClock::new(t0()), budgeted, None)
        .await
        .unwrap();
    assert_eq!((report.deleted, report.stop), (0, SweepStop::Budget));
    assert_eq!(report.backlog, Duration::from_secs(2 * 3_600));
    let past = Some(tokio::time::Instant::now());
    assert_eq!(
        sweep(&pool, &ManualClock::new(t0()), ALL_AT_ONCE, past)
            .await
            .unwrap()
            .stop,
        SweepStop::Deadline
    );
}

/// One sweep at a time: a sweep started while another runs returns at once (`Busy`) instead of
/// waiting or competing for the same rows; the lease is given back when the first ends.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_started_while_another_runs_steps_aside(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = own_pool(connect, 4).await;
    shared_testkit::sweeps::assert_sweeps_take_turns(&pool, &pool).await;
}

/// A sweep that died holding the lease (its Lambda killed mid-run) blocks the next only until
/// the lease lapses: a live lease sends the next sweep aside, a lapsed one is taken over.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_dead_sweeps_lease_lapses_and_the_next_sweep_takes_it(pool: PgPool) {
    seed(&pool, 10, t0() - Span::minutes(1)).await;
    let lease = |until: &'static str| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO core.sweep_leases (name, holder, until)
             VALUES ('fences', gen_random_uuid(), clock_timestamp() + interval '{until}')
             ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until"
        )))
    };
    let clock = ManualClock::new(t0());
    lease("1 hour").execute(&pool).await.unwrap();
    let report = sweep(&pool, &clock, ALL_AT_ONCE, None).await.unwrap();
    assert_eq!((report.deleted, report.stop), (0, SweepStop::Busy));
    lease("-1 second").execute(&pool).await.unwrap();
    let report = sweep(&pool, &clock, ALL_AT_ONCE, None).await.unwrap();
    assert_eq!((report.deleted, report.stop), (10, SweepStop::Done));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM core.sweep_leases")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the sweep gives its lease back");
}

/// A sweep whose lease was taken over mid-run (a batch outlasted it, another sweep took it)
/// stops at its next batch instead of sweeping beside the new holder: each batch renews the
/// lease first.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_whose_lease_was_taken_over_stops_at_its_next_batch(pool: PgPool) {
    seed(&pool, 20_000, t0() - Span::minutes(1)).await;
    let paced = SweepSettings {
        batch_size: 500,
        pause: Duration::from_millis(20),
        ..ALL_AT_ONCE
    };
    let first = tokio::spawn({
        let pool = pool.clone();
        async move {
            sweep(&pool, &ManualClock::new(t0()), paced, None)
                .await
                .unwrap()
        }
    });
    while fences(&pool).await == 20_000 && !first.is_finished() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let taken: u64 = sqlx::query(
        "UPDATE core.sweep_leases
         SET holder = gen_random_uuid(), until = clock_timestamp() + interval '1 hour'",
    )
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    let first = first.await.unwrap();
    assert_eq!(taken, 1, "the first sweep held the lease");
    assert_eq!(first.stop, SweepStop::Busy, "{first:?}");
    assert!(first.deleted < 20_000, "{first:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM core.sweep_leases")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        left, 1,
        "the new holder's lease is not the first sweep's to give back"
    );
}

/// Consumers keep inserting fences while a sweep runs; the sweep takes only expired rows and
/// no consumer fails or waits for it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_while_consumers_insert_leaves_their_fences(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = own_pool(connect, 8).await;
    seed(&pool, 30_000, t0() - Span::days(1)).await;
    let harness = Arc::new(harness(&pool, award_points()));
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let harness = harness.clone();
            tokio::spawn(async move {
                let mut jobs = Vec::new();
                for _ in 0..100 {
                    let (job_id, body) = job(award(1));
                    assert_eq!(
                        harness.process(&message(&body, 1)).await,
                        RecordOutcome::Processed
                    );
                    jobs.push(job_id);
                }
                jobs
            })
        })
        .collect();
    let swept = sweep_batches(&pool).await;
    let mut processed = Vec::new();
    for c in consumers {
        processed.extend(c.await.unwrap());
    }
    assert_eq!(swept, 30_000);
    for job_id in processed {
        assert!(
            fence_exists(&pool, job_id, &reference_name())
                .await
                .unwrap(),
            "fence of {job_id} kept"
        );
    }
    assert_eq!(fences(&pool).await, 400);
}

async fn sweep_batches(pool: &PgPool) -> u64 {
    let mut total = 0;
    loop {
        let (n, _) = sweep_expired(pool, t0(), None, 500).await.unwrap();
        total += n;
        if n < 500 {
            return total;
        }
    }
}

/// A letter of `job_id`, replayed by an operator at `t0()`, whose message no queue has taken
/// yet (`replay_outcome = queued`).
async fn queued_replay(pool: &PgPool, job_id: shared::ids::JobId) -> shared::ids::DeadLetterId {
    use shared::dead_letter::{ReplayOutcome, Verdict, lock_letter};
    let body = serde_json::json!({"job_id": job_id, "payload": {}}).to_string();
    let letter = TestLetter::new(Some(job_id), &reference_name(), QUEUE, &body);
    let id = record_letter(pool, &letter, t0()).await;
    let mut locked = lock_letter(pool, id, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let verdict = Verdict::Replayed {
        body: None,
        outcome: ReplayOutcome::Queued,
        reason: Some("the ledger is back".into()),
    };
    locked.mark(&verdict, "ops-1", t0()).await.unwrap();
    locked.commit().await.unwrap();
    id
}

/// Issue 22, item 3: a replay recorded but not yet sent (its queue refused it) may be sent at
/// any later time. If its job committed meanwhile (the replay's first send went out, and only
/// its record was lost), the fence is what makes that late send a no-op: it is kept while the
/// replay is queued, and it is not backlog. Once the replay is sent, the fence expires as any.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_fence_of_a_job_whose_replay_is_queued_is_never_swept(pool: PgPool) {
    let job_id = shared::ids::JobId(uuid::Uuid::new_v4());
    let letter = queued_replay(&pool, job_id).await;
    let expired = t0() - Span::days(30);
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         VALUES ($1, $2, gen_random_uuid(), $3 - interval '7 days', $3)",
    )
    .bind(job_id.0)
    .bind(reference_name().as_str())
    .bind(expired)
    .execute(&pool)
    .await
    .unwrap();
    seed(&pool, 3, expired).await; // fences nothing waits for

    let report = sweep(&pool, &ManualClock::new(t0()), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(report.deleted, 3, "{report:?}");
    assert!(
        fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap(),
        "kept while its replay is queued"
    );
    assert_eq!(
        report.backlog,
        Duration::ZERO,
        "a fence kept for a queued replay is not backlog"
    );

    shared::dead_letter::record_replay_sent(&pool, letter, "m-1", t0())
        .await
        .unwrap()
        .expect("was queued");
    let report = sweep(&pool, &ManualClock::new(t0()), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(report.deleted, 1, "sent: the fence expires as any other");
    assert!(
        !fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
}

/// Issue 36: a record received in the letters' intake and not yet settled is settled through
/// its job's fence. If that fence were swept first (the settlers down for longer than the TTL),
/// the settle would find no fence and write a letter for a job that committed. The sweep keeps
/// every fence that expired after the oldest received row (less an hour): a copy that arrived
/// within its job's TTL still finds the fence when it settles. Once settled, the fence goes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fences_that_expired_after_the_oldest_received_letter_are_kept_until_it_settles(
    pool: PgPool,
) {
    let now = t0();
    let received_at = now - Span::days(10);
    seed(&pool, 3, received_at - Span::days(1)).await; // expired before the row came: go
    seed(&pool, 4, received_at + Span::days(1)).await; // expired since: kept for it
    sqlx::query(
        "INSERT INTO core.letter_intake (consumer, received_at, queue, message_id, body,
                                         attempts, error_kind, last_error)
         VALUES ($1, $2, 'jobs', 'm-1', 'not json', 1, 'poison', 'not JSON')",
    )
    .bind(reference_name().as_str())
    .bind(received_at)
    .execute(&pool)
    .await
    .unwrap();
    let report = sweep(&pool, &ManualClock::new(now), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(report.deleted, 3, "{report:?}");
    assert_eq!(fences(&pool).await, 4);

    // A row set aside (refused even as received) is never settled: it keeps nothing.
    sqlx::query("UPDATE core.letter_intake SET refused = 'refused'")
        .execute(&pool)
        .await
        .unwrap();
    let report = sweep(&pool, &ManualClock::new(now), ALL_AT_ONCE, None)
        .await
        .unwrap();
    assert_eq!(report.deleted, 4, "{report:?}");
}
