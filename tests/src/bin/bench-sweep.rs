//! `bench-sweep`: the sweeper's delete rate against a raw batched DELETE of the same rows, and
//! consumer throughput with and without a concurrent sweep, side by side in one run on one
//! database (`DATABASE_URL`). Pairs alternate over several rounds; medians and ratios are printed
//! and written to `target/bench/sweep.json`. A measurement, not a test: it asserts nothing.

use consumer::AwardPoints;
use e2e::bench::{self, BenchDatabase, median, psql};
use rand::seq::SliceRandom;
use serde_json::json;
use shared::clock::SystemClock;
use shared::harness::RecordOutcome;
use shared::upkeep::sweep::{SweepSettings, sweep};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const BACKLOG: u64 = 200_000;
/// Live fences around the backlog, as at steady state (a sweep must not scan them).
const LIVE: u64 = 2_000_000;
const JOBS: usize = 3_000;
const CONCURRENCY: usize = 8;
/// Unpaced: how fast the sweeper's statements delete, against the raw loop.
const FLAT_OUT: SweepSettings = SweepSettings {
    batch_size: 5_000,
    budget: Duration::from_secs(600),
    pause: Duration::ZERO,
    ledger_ttl: Duration::from_secs(7 * 86_400),
};
/// The defaults (`SWEEP_BATCH_SIZE`, `SWEEP_PAUSE_MS`): what consumers share the database with.
const PACED: SweepSettings = SweepSettings {
    batch_size: 5_000,
    budget: Duration::from_secs(600),
    pause: Duration::from_millis(20),
    ledger_ttl: Duration::from_secs(7 * 86_400),
};

async fn consumers(pool: &PgPool) -> f64 {
    let harness = Arc::new(e2e::harness(
        pool.clone(),
        AwardPoints::new(e2e::consumer_name()),
    ));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let harness = harness.clone();
            tokio::spawn(async move {
                for _ in 0..JOBS / CONCURRENCY {
                    let body =
                        json!({"job_id": uuid::Uuid::new_v4(), "tenant_id": uuid::Uuid::new_v4(),
                        "correlation_id": "bench", "payload": {"account_id": "a", "points": 1}})
                        .to_string();
                    let msg = shared::harness::IncomingMessage {
                        message_id: uuid::Uuid::new_v4().to_string(),
                        queue: "bench".into(),
                        body,
                        receive_count: 1,
                        replay_of: None,
                        message_group: None,
                        trace: Default::default(),
                    };
                    assert_eq!(harness.process(&msg).await, RecordOutcome::Processed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (JOBS / CONCURRENCY * CONCURRENCY) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let BenchDatabase { url, pool, version } =
        bench::open(CONCURRENCY as u32 + 4, &format!("{ROUNDS} rounds, medians")).await;

    psql(
        &url,
        "reset_with_live_fences.sql",
        &[("live", LIVE.to_string())],
    );
    println!("table: {LIVE} live fences, plus a backlog of {BACKLOG} expired ones per round");

    // 1. Delete rate: the same backlog deleted by the raw loop and by the sweeper, alternating.
    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut order = [true, false];
        order.shuffle(&mut rand::rng());
        for is_raw in order {
            psql(&url, "seed_fences.sql", &[("n", BACKLOG.to_string())]);
            let started = Instant::now();
            let deleted = if is_raw {
                psql(&url, "raw_sweep.sql", &[]);
                BACKLOG
            } else {
                sweep(&pool, &SystemClock, FLAT_OUT, None)
                    .await
                    .unwrap()
                    .deleted
            };
            let rate = deleted as f64 / started.elapsed().as_secs_f64();
            if is_raw {
                raw.push(rate)
            } else {
                ours.push(rate)
            }
            println!(
                "  round {round}: {:<8} {rate:>10.0} rows/s",
                if is_raw { "raw" } else { "sweeper" }
            );
        }
    }
    let (raw_rate, our_rate) = (median(raw), median(ours));

    // 2. Consumer throughput without and with a sweep of a large backlog running beside it.
    let (mut alone, mut beside, mut paced) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut order = [false, true];
        order.shuffle(&mut rand::rng());
        for with_sweep in order {
            let sweeper = with_sweep.then(|| {
                psql(&url, "seed_fences.sql", &[("n", (2 * BACKLOG).to_string())]);
                let pool = pool.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let report = sweep(&pool, &SystemClock, PACED, None).await.unwrap();
                    (
                        report.deleted as f64 / started.elapsed().as_secs_f64(),
                        started.elapsed(),
                    )
                })
            });
            let started = Instant::now();
            let rate = consumers(&pool).await;
            let consumers_took = started.elapsed();
            if let Some(s) = sweeper {
                let (sweep_rate, sweep_took) = s.await.unwrap();
                if sweep_took < consumers_took {
                    println!("  (the sweep ended before the consumers: seed a larger backlog)");
                }
                paced.push(sweep_rate);
            }
            if with_sweep {
                beside.push(rate)
            } else {
                alone.push(rate)
            }
            println!(
                "  round {round}: consumers {:<14} {rate:>8.0} jobs/s",
                if with_sweep {
                    "during a sweep"
                } else {
                    "alone"
                }
            );
        }
    }
    let (alone_rate, beside_rate) = (median(alone), median(beside));

    println!(
        "\n{:<44} {:>12} {:>12} {:>7} {:>6}",
        "figure", "baseline", "ours", "ratio", "goal"
    );
    println!(
        "{:<44} {:>12.0} {:>12.0} {:>7.2} {:>6}",
        "sweep delete rate (rows/s) vs raw DELETE",
        raw_rate,
        our_rate,
        our_rate / raw_rate,
        "≥0.80"
    );
    println!(
        "{:<44} {:>12.0} {:>12.0} {:>7.2} {:>6}",
        "consumer jobs/s during a paced sweep vs alone",
        alone_rate,
        beside_rate,
        beside_rate / alone_rate,
        "≥0.80"
    );
    let paced_rate = median(paced);
    println!(
        "paced sweep (defaults: 5,000 rows, 20 ms rest) deleted {paced_rate:.0} rows/s meanwhile, {:.0}x the 1,000 rows/s that 1,000 jobs/s need",
        paced_rate / 1_000.0
    );
    let report = json!({
        "rounds": ROUNDS, "postgres": version,
        "sweep_delete_rate": {"baseline_raw_delete_rows_per_s": raw_rate, "ours_rows_per_s": our_rate, "ratio": our_rate / raw_rate},
        "consumers_during_sweep": {"baseline_alone_jobs_per_s": alone_rate, "ours_during_sweep_jobs_per_s": beside_rate, "ratio": beside_rate / alone_rate, "paced_sweep_rows_per_s": paced_rate},
    });
    bench::write_figures("sweep", &report);
}
