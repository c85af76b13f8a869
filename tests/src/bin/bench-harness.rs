//! `bench-harness`: the harness against the physical limit, PostgreSQL doing the same
//! transactions through `pgbench`, side by side on one database (`DATABASE_URL`):
//!
//! - new jobs: fence + award + commit, at 1, 8 and 32 concurrent workers;
//! - duplicates: the fence insert that conflicts, then a rollback;
//! - batch mode (issue 17), 8 workers, batches of 10: new jobs against pgbench's per-job
//!   transaction and against pgbench running batch mode's own statements; a batch of ten
//!   duplicates against pgbench's duplicate path;
//! - the consumer binary's peak memory over 5,000 jobs in batches of 10.
//!
//! Each pair runs alternately, in random order, for several rounds; medians and ratios are
//! printed and written to `target/bench/harness.json`. A measurement, not a test.

use consumer::AwardPoints;
use e2e::bench::{self, BenchDatabase, median, psql};
use rand::RngExt;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use shared::harness::{IncomingMessage, RecordOutcome};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const RUN: Duration = Duration::from_secs(4);
const LEVELS: [usize; 3] = [1, 8, 32];
/// Already processed jobs, ids 1..DUPS, for the duplicate path.
const DUPS: u64 = 100_000;
const RSS_BATCHES: usize = 500;
/// Messages prepared per harness run: more than RUN can take at any concurrency here.
const MESSAGES_PER_RUN: usize = 200_000;

/// Jobs in one batch of batch mode.
const BATCH: usize = 10;
/// The switches of `bench/batch.sql`, one a step of batch mode's statements.
const BATCH_STEPS: [&str; 3] = ["lookup", "claim", "finish"];

/// Transactions per second of `pgbench` running `file` with `clients` connections.
fn pgbench(url: &str, file: &str, clients: usize) -> f64 {
    pgbench_with(url, file, &[], clients)
}

/// [`pgbench`] with `switches` set to 1 (`-D name=1`; every other switch of the script is 0).
fn pgbench_with(url: &str, file: &str, switches: &[&str], clients: usize) -> f64 {
    let mut defines = vec![format!("dups={DUPS}")];
    defines.extend(
        BATCH_STEPS
            .iter()
            .map(|step| format!("{step}={}", u8::from(switches.contains(step)))),
    );
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared"])
        .args(defines.iter().flat_map(|d| ["-D", d.as_str()]))
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args([
            "-T",
            &RUN.as_secs().to_string(),
            "-f",
            &bench::script(file),
            url,
        ])
        .output()
        .expect("pgbench runs (bash scripts/bench.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {stdout}"))
}

fn message(job_id: uuid::Uuid) -> IncomingMessage {
    IncomingMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        queue: "bench".into(),
        body: json!({"job_id": job_id, "tenant_id": uuid::Uuid::from_u128(1),
            "correlation_id": "bench", "payload": {"account_id": "a", "points": 1}})
        .to_string(),
        receive_count: 1,
        replay_of: None,
    }
}

/// `n` messages, ready as from SQS (building them is the producer's cost, not ours): new jobs
/// with random ids, or jobs drawn from the [`DUPS`] already processed.
fn messages(n: usize, duplicates: bool) -> Vec<IncomingMessage> {
    let mut rng: rand::rngs::StdRng = rand::make_rng();
    (0..n)
        .map(|_| {
            let n = if duplicates {
                rng.random_range(1..=DUPS)
            } else {
                rng.random::<u64>()
            };
            message(uuid::Uuid::from_u128(n.into()))
        })
        .collect()
}

/// What the harness must answer for each of [`messages`]`(_, duplicates)`.
fn expected(duplicates: bool) -> RecordOutcome {
    if duplicates {
        RecordOutcome::Duplicate
    } else {
        RecordOutcome::Processed
    }
}

/// Jobs per second of the harness in batch mode: `workers` concurrent workers, each handing it
/// SQS batches of [`BATCH`] messages (new jobs, or already processed ones).
async fn harness_batches(url: &str, workers: usize, duplicates: bool) -> f64 {
    let pool = bench::warm_pool(url, workers).await;
    let harness = Arc::new(e2e::harness_in(
        pool.clone(),
        AwardPoints::new(e2e::consumer_name()),
        shared::harness::CommitMode::Batch,
    ));
    // New jobs need fresh ids for the whole run; duplicates can go round a smaller set.
    let count = if duplicates {
        10_000
    } else {
        2 * MESSAGES_PER_RUN / BATCH
    };
    let batches: Arc<Vec<Vec<IncomingMessage>>> = Arc::new(
        messages(count * BATCH, duplicates)
            .chunks(BATCH)
            .map(<[_]>::to_vec)
            .collect(),
    );
    let expected = expected(duplicates);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (harness, next, done, batches) =
                (harness.clone(), next.clone(), done.clone(), batches.clone());
            let expected = expected.clone();
            tokio::spawn(async move {
                while started.elapsed() < RUN {
                    let mut i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if duplicates {
                        i %= batches.len();
                    }
                    let batch = batches.get(i).expect("enough batches for RUN");
                    let outcomes = harness.process_batch(batch, &|| true, 1).await;
                    assert!(
                        outcomes.iter().all(|o| o.as_ref() == Some(&expected)),
                        "{outcomes:?}"
                    );
                    done.fetch_add(BATCH as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let rate = jobs_per_second(tasks, &done, started, pool).await;
    let fell_back = harness
        .metrics()
        .get(shared::metrics::Metric::BatchFellBack);
    assert_eq!(fell_back, 0, "every batch committed whole");
    rate
}

/// Jobs per second of the harness with `workers` concurrent workers, each on its own connection.
async fn harness(url: &str, workers: usize, duplicates: bool) -> f64 {
    // The pool the functions build, sized like pgbench's clients.
    let pool = bench::warm_pool(url, workers).await;
    let harness = Arc::new(e2e::harness(
        pool.clone(),
        AwardPoints::new(e2e::consumer_name()),
    ));
    let messages: Arc<Vec<IncomingMessage>> = Arc::new(messages(MESSAGES_PER_RUN, duplicates));
    let expected = expected(duplicates);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (harness, done, messages) = (harness.clone(), done.clone(), messages.clone());
            let expected = expected.clone();
            tokio::spawn(async move {
                while started.elapsed() < RUN {
                    let next = done.fetch_add(1, Ordering::Relaxed) as usize;
                    let msg = messages
                        .get(next)
                        .expect("MESSAGES_PER_RUN is enough for RUN");
                    assert_eq!(harness.process(msg).await, expected);
                }
            })
        })
        .collect();
    jobs_per_second(tasks, &done, started, pool).await
}

/// Jobs per second of bare sqlx sending pgbench's statements (no harness): what this driver
/// and runtime can do on this machine, so the table separates the harness's cost from theirs.
async fn bare_sqlx(url: &str, workers: usize, duplicates: bool) -> f64 {
    let pool = bench::warm_pool(url, workers).await;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut rng: rand::rngs::StdRng = rand::make_rng();
                let tenant = uuid::Uuid::from_u128(1);
                while started.elapsed() < RUN {
                    let job = if duplicates {
                        uuid::Uuid::from_u128(u128::from(rng.random_range(1..=DUPS)))
                    } else {
                        uuid::Uuid::from_u128(rng.random::<u64>().into())
                    };
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query(
                        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
                         VALUES ($1, 'award-points', $2, now(), now() + interval '7 days')
                         ON CONFLICT (job_id, consumer) DO NOTHING",
                    )
                    .bind(job)
                    .bind(tenant)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                    if duplicates {
                        tx.rollback().await.unwrap();
                    } else {
                        sqlx::query(
                            "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
                             VALUES ($1, $2, 'a', 1, now())",
                        )
                        .bind(job)
                        .bind(tenant)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    jobs_per_second(tasks, &done, started, pool).await
}

/// Waits for the workers; the jobs they did per second of the run.
async fn jobs_per_second(
    workers: Vec<tokio::task::JoinHandle<()>>,
    done: &AtomicU64,
    started: Instant,
    pool: sqlx::PgPool,
) -> f64 {
    for worker in workers {
        worker.await.unwrap();
    }
    let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    pool.close().await;
    rate
}

/// One figure: `ROUNDS` rounds of pgbench, bare sqlx and the harness, in random order each round.
async fn trio(url: &str, name: &str, script: &str, workers: usize, duplicates: bool) -> Value {
    let (mut base, mut bare, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut order = [0, 1, 2];
        order.shuffle(&mut rand::rng());
        for side in order {
            match side {
                0 => base.push(pgbench(url, script, workers)),
                1 => bare.push(bare_sqlx(url, workers, duplicates).await),
                _ => ours.push(harness(url, workers, duplicates).await),
            }
        }
    }
    let (b, s, o) = (
        median(base.clone()),
        median(bare.clone()),
        median(ours.clone()),
    );
    println!(
        "{name:<22} {b:>10.0} {s:>10.0} {o:>10.0} {:>10.2} {:>10.2}",
        o / b,
        o / s
    );
    json!({"figure": name, "unit": "jobs/s", "baseline": b, "bare_sqlx": s, "ours": o,
           "ratio": o / b, "ratio_to_bare_sqlx": o / s,
           "baseline_runs": base, "bare_sqlx_runs": bare, "our_runs": ours})
}

/// Batch mode's figures: `ROUNDS` rounds of each side in random order. New jobs: ours against
/// pgbench's per-job transaction and against pgbench running batch mode's statements (one
/// transaction is ten jobs), and those statements step by step; duplicates: ours against
/// pgbench's duplicate path.
async fn batch_figures(url: &str, workers: usize) -> Vec<Value> {
    let (mut per_job, mut batch_sql, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dup_base, mut dup_ours) = (Vec::new(), Vec::new());
    // What each of the guarantee's statements costs: pgbench on the least a batch can send,
    // then adding the duplicate lookup, then the ordered, bounded claim (then the finish check:
    // the set SQL above).
    let steps: [(&str, &[&str]); 3] = [
        ("minimal", &[]),
        ("lookup", &["lookup"]),
        ("claim", &["lookup", "claim"]),
    ];
    let mut step_runs: Vec<Vec<f64>> = vec![Vec::new(); steps.len()];
    for _ in 0..ROUNDS {
        let mut order = [0, 1, 2, 3, 4, 5, 6, 7];
        order.shuffle(&mut rand::rng());
        for side in order {
            match side {
                0 => per_job.push(pgbench(url, "fence_effect.sql", workers)),
                1 => batch_sql
                    .push(pgbench_with(url, "batch.sql", &BATCH_STEPS, workers) * BATCH as f64),
                2 => ours.push(harness_batches(url, workers, false).await),
                3 => dup_base.push(pgbench(url, "duplicate.sql", workers)),
                4 => dup_ours.push(harness_batches(url, workers, true).await),
                step => step_runs[step - 5].push(
                    pgbench_with(url, "batch.sql", steps[step - 5].1, workers) * BATCH as f64,
                ),
            }
        }
    }
    let (p, b, o) = (
        median(per_job.clone()),
        median(batch_sql.clone()),
        median(ours.clone()),
    );
    let (db, dn) = (median(dup_base.clone()), median(dup_ours.clone()));
    println!(
        "\n{:<34} {:>12} {:>12} {:>10} {:>8} {:>8}",
        "batch mode, jobs/s", "pgbench/job", "pgbench set", "harness", "/job", "/set"
    );
    println!(
        "{:<34} {p:>12.0} {b:>12.0} {o:>10.0} {:>8.2} {:>8.2}   goals: >= 3 per job, >= 0.8 of the set SQL",
        format!("new jobs, batches of {BATCH}, c = {workers}"),
        o / p,
        o / b
    );
    println!(
        "{:<34} {db:>12.0} {:>12} {dn:>10.0} {:>8.2} {:>8}   goal: >= 5 x pgbench's duplicate path",
        format!("duplicates, batches of {BATCH}, c = {workers}"),
        "-",
        dn / db,
        "-"
    );
    let step_rates: Vec<f64> = step_runs.iter().map(|runs| median(runs.clone())).collect();
    println!(
        "{:<34} {}, + finish (the set SQL) {b:.0}: {} x pgbench/job",
        "the set SQL, step by step, jobs/s",
        steps
            .iter()
            .zip(&step_rates)
            .map(|((step, _), rate)| format!("{step} {rate:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        step_rates
            .iter()
            .chain([&b])
            .map(|rate| format!("{:.2}", rate / p))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    let step_figures: Vec<Value> = steps
        .iter()
        .zip(step_rates.iter().zip(&step_runs))
        .map(|((step, _), (rate, runs))| json!({"step": step, "jobs_per_s": rate, "ratio_to_per_job": rate / p, "runs": runs}))
        .collect();
    vec![
        json!({"figure": format!("batch mode, new jobs, batches of {BATCH}, c = {workers}"), "unit": "jobs/s",
               "baseline": p, "baseline_set_sql": b, "ours": o, "ratio": o / p, "ratio_to_set_sql": o / b,
               "goal_ratio": 3.0, "goal_ratio_to_set_sql": 0.8,
               "baseline_runs": per_job, "set_sql_runs": batch_sql, "our_runs": ours,
               "set_sql_steps": step_figures}),
        json!({"figure": format!("batch mode, duplicates, batches of {BATCH}, c = {workers}"), "unit": "jobs/s",
               "baseline": db, "ours": dn, "ratio": dn / db, "goal_ratio": 5.0,
               "baseline_runs": dup_base, "our_runs": dup_ours}),
    ]
}

fn sqs_event(jobs: usize) -> Value {
    let records: Vec<Value> = (0..jobs)
        .map(|_| {
            let msg = message(uuid::Uuid::new_v4());
            json!({"messageId": msg.message_id, "receiptHandle": "bench", "body": msg.body,
                "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
                "md5OfBody": "", "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:bench", "awsRegion": "us-east-1"})
        })
        .collect();
    json!({ "Records": records })
}

/// The consumer binary's peak RSS (KiB) after one batch and after [`RSS_BATCHES`] batches of 10.
async fn consumer_memory(url: &str) -> (u64, u64, f64) {
    let binaries = e2e::stack::Binaries::beside_current_exe();
    let host = e2e::lambda_host::LambdaHost::new(e2e::lambda_host::FunctionSpec {
        name: "consumer".into(),
        binary: binaries.consumer,
        env: [
            ("DATABASE_URL", url),
            ("CONSUMER_NAME", "award-points"),
            ("ALERTING_DISABLED", "true"),
            ("DATABASE_POOL_SIZE", "5"),
            ("RUST_LOG", "warn"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec(),
        timeout: Duration::from_secs(60),
        log_file: None,
        deadline_as_duration: false,
    });
    host.invoke(&sqs_event(10))
        .await
        .expect("the consumer answers");
    let first = host.peak_rss_kib().await.expect("a running consumer");
    let started = Instant::now();
    for _ in 1..RSS_BATCHES {
        let response = host
            .invoke(&sqs_event(10))
            .await
            .expect("the consumer answers");
        assert_eq!(
            response["batchItemFailures"],
            json!([]),
            "every record done"
        );
    }
    let rate = ((RSS_BATCHES - 1) * 10) as f64 / started.elapsed().as_secs_f64();
    (
        first,
        host.peak_rss_kib().await.expect("a running consumer"),
        rate,
    )
}

#[tokio::main]
async fn main() {
    let BenchDatabase { url, version, .. } = bench::open(
        2,
        &format!(
            "{ROUNDS} rounds of {} s per side, alternating, medians",
            RUN.as_secs()
        ),
    )
    .await;
    psql(&url, "reset_for_harness.sql", &[("dups", DUPS.to_string())]);

    println!(
        "\n{:<22} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "jobs/s", "pgbench", "bare sqlx", "harness", "/pgbench", "/sqlx"
    );
    // `bench-harness <text>` runs only the figures whose name contains it (for profiling).
    let only = std::env::args().nth(1).unwrap_or_default();
    let mut figures = Vec::new();
    for (kind, script, duplicates) in [
        ("new jobs", "fence_effect.sql", false),
        ("duplicates", "duplicate.sql", true),
    ] {
        for workers in LEVELS {
            let name = format!("{kind}, c = {workers}");
            if name.contains(&only) {
                figures.push(trio(&url, &name, script, workers, duplicates).await);
            }
        }
    }
    if "batch mode".contains(&only) || only.is_empty() {
        figures.extend(batch_figures(&url, 8).await);
    }
    if !only.is_empty() {
        return;
    }

    let (first, peak, rate) = consumer_memory(&url).await;
    println!(
        "\nconsumer binary: peak RSS {:.1} MB after 1 batch, {:.1} MB after {} jobs in batches of 10 \
         ({rate:.0} jobs/s through the local Lambda host); goal ≤ 64 MB",
        first as f64 / 1024.0,
        peak as f64 / 1024.0,
        RSS_BATCHES * 10
    );
    figures.push(json!({"figure": "consumer peak RSS", "unit": "MB",
        "after_one_batch": first as f64 / 1024.0, "ours": peak as f64 / 1024.0,
        "jobs": RSS_BATCHES * 10, "goal": 64}));

    let out = json!({"postgres": version, "rounds": ROUNDS, "run_seconds": RUN.as_secs(), "figures": figures});
    std::fs::create_dir_all("target/bench").unwrap();
    std::fs::write(
        "target/bench/harness.json",
        serde_json::to_string_pretty(&out).unwrap(),
    )
    .unwrap();
    println!("written to target/bench/harness.json");
}
