//! `bench-scale`: the fence table at scale (issue 17), with 2 million and with 20 million live
//! fences on `DATABASE_URL`: one job's claim (BEGIN, claim, COMMIT) and a batch of ten's (BEGIN,
//! the ten fences in one statement, COMMIT), the duplicate lookup of a batch of ten, and the sweeper's delete rate over an expired backlog;
//! the table's and its indexes' sizes. p50 and p99 of sequential calls. Written to
//! `target/bench/scale.json`; `docs/scale.md` works from these figures. A measurement, not a
//! test.

use e2e::bench::{self, BenchDatabase, median, psql};
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::envelope::JobDigest;
use shared::fence::{FenceClaim, claim_job_fence, claim_job_fences, processed_digests};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::upkeep::sweep::{SweepSettings, sweep};
use sqlx::PgPool;
use std::time::{Duration, Instant};

const SIZES: [u64; 2] = [2_000_000, 20_000_000];
const SAMPLES: usize = 2_000;
const BACKLOG: u64 = 200_000;
const TTL: Duration = Duration::from_secs(7 * 86_400);
const WAIT: Duration = Duration::from_secs(2);

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn summary(mut took: Vec<Duration>) -> Value {
    took.sort();
    json!({"p50_ms": percentile(&took, 0.5), "p99_ms": percentile(&took, 0.99), "calls": took.len()})
}

fn fresh() -> (JobId, TenantId) {
    (
        JobId(uuid::Uuid::new_v4()),
        TenantId(uuid::Uuid::from_u128(1)),
    )
}

/// A job's digest as the harness computes it, kept in its fence (what the claims store).
fn digest(job: JobId) -> JobDigest {
    JobDigest::of(&json!({"tenant_id": null, "payload": {"job": job}}), &[])
}

async fn claims(pool: &PgPool, consumer: &ConsumerName) -> Value {
    let mut took = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let (job, tenant) = fresh();
        let started = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        let claim = claim_job_fence(
            &mut tx,
            job,
            consumer,
            tenant,
            Some(&digest(job)),
            chrono::Utc::now(),
            TTL,
            WAIT,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        took.push(started.elapsed());
        assert_eq!(claim, FenceClaim::Claimed);
    }
    summary(took)
}

async fn batch_claims(pool: &PgPool, consumer: &ConsumerName) -> Value {
    let mut took = Vec::with_capacity(SAMPLES / 10);
    for _ in 0..SAMPLES / 10 {
        let jobs: Vec<_> = (0..10)
            .map(|_| fresh())
            .map(|(job, tenant)| (job, tenant, Some(digest(job))))
            .collect();
        let started = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        let claimed = claim_job_fences(&mut tx, consumer, &jobs, chrono::Utc::now(), TTL, WAIT)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        took.push(started.elapsed());
        assert_eq!(claimed.len(), 10);
    }
    summary(took)
}

async fn lookups(pool: &PgPool, consumer: &ConsumerName) -> Value {
    let existing: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT job_id FROM core.processed_jobs TABLESAMPLE SYSTEM (1) LIMIT $1",
    )
    .bind((SAMPLES * 10) as i64)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut took = Vec::with_capacity(SAMPLES / 10);
    for chunk in existing.chunks(10).take(SAMPLES / 10) {
        let jobs: Vec<JobId> = chunk.iter().map(|u| JobId(*u)).collect();
        let started = Instant::now();
        let found = processed_digests(pool, consumer, &jobs).await.unwrap();
        took.push(started.elapsed());
        assert_eq!(found.len(), jobs.len());
    }
    summary(took)
}

async fn sweep_rate(url: &str, pool: &PgPool) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..3 {
        psql(url, "seed_fences.sql", &[("n", BACKLOG.to_string())]);
        let settings = SweepSettings {
            batch_size: 5_000,
            budget: Duration::from_secs(600),
            pause: Duration::ZERO,
            ledger_ttl: TTL,
        };
        let started = Instant::now();
        let report = sweep(pool, &SystemClock, settings, None).await.unwrap();
        rates.push(report.deleted as f64 / started.elapsed().as_secs_f64());
    }
    median(rates)
}

async fn sizes(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*), pg_relation_size('core.processed_jobs'), pg_indexes_size('core.processed_jobs')
         FROM core.processed_jobs",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::main]
async fn main() {
    let BenchDatabase { url, pool, version } = bench::open(
        2,
        &format!("{SAMPLES} sequential calls per figure, p50 and p99"),
    )
    .await;
    let consumer = e2e::consumer_name();
    let mut figures = Vec::new();
    println!(
        "\n{:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>9}",
        "live fences",
        "claim p50",
        "p99",
        "batch p50",
        "p99",
        "dups p50",
        "p99",
        "sweep rows/s",
        "table MB",
        "index MB"
    );
    let mut had = 0;
    for size in SIZES {
        let extend = had > 0;
        println!("  (seeding {} live fences…)", size - had);
        psql(
            &url,
            "reset_scale.sql",
            &[
                ("live", (size - had).to_string()),
                ("extend", extend.to_string()),
            ],
        );
        had = size;
        let claim = claims(&pool, &consumer).await;
        let batch = batch_claims(&pool, &consumer).await;
        let dups = lookups(&pool, &consumer).await;
        let rate = sweep_rate(&url, &pool).await;
        let (rows, table, indexes) = sizes(&pool).await;
        let mb = |b: i64| b as f64 / 1_048_576.0;
        println!(
            "{size:>12} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {rate:>12.0} {:>9.0} {:>9.0}",
            claim["p50_ms"].as_f64().unwrap(),
            claim["p99_ms"].as_f64().unwrap(),
            batch["p50_ms"].as_f64().unwrap(),
            batch["p99_ms"].as_f64().unwrap(),
            dups["p50_ms"].as_f64().unwrap(),
            dups["p99_ms"].as_f64().unwrap(),
            mb(table),
            mb(indexes)
        );
        figures.push(
            json!({"live_fences": size, "rows": rows, "claim": claim, "batch_claim_of_10": batch,
            "duplicate_lookup_of_10": dups, "sweep_rows_per_s": rate, "table_bytes": table,
            "index_bytes": indexes, "bytes_per_fence": (table + indexes) as f64 / rows as f64}),
        );
    }
    let out = json!({"postgres": version, "samples": SAMPLES, "figures": figures});
    bench::write_figures("scale", &out);
}
