//! `bench-harness`: the harness against the physical limit, PostgreSQL doing the same
//! transactions through `pgbench`, side by side on one database (`DATABASE_URL`):
//!
//! - new jobs: fence + award + commit, at 1, 8 and 32 concurrent workers;
//! - duplicates: the fence insert that conflicts, then a rollback;
//! - batch mode (issue 17), 8 workers, batches of 10: new jobs against pgbench's per-job
//!   transaction and against pgbench running batch mode's own statements; a batch of ten
//!   duplicates against pgbench's duplicate path;
//! - the consumer binary's peak memory over 5,000 jobs in batches of 10;
//! - tracing's cost (issue 37): the consumer binary through the local Lambda host, batches of
//!   10 new jobs, with `TRACING=Active` exporting every span to an OTLP receiver in this process
//!   against the same binary with tracing off.
//!
//! Each pair runs alternately, in random order, for several rounds; medians and ratios are
//! printed and written to `target/bench/harness.json`. A measurement, not a test.

use e2e::bench::runs::{
    BATCH, BATCH_STEPS, DUPS, Load, bare_sqlx, harness, harness_batches, message, pgbench,
    pgbench_with,
};
use e2e::bench::{self, BenchDatabase, lambda, median, psql};
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const RUN: Duration = Duration::from_secs(4);
const LEVELS: [usize; 3] = [1, 8, 32];
const RSS_BATCHES: usize = 500;
/// Messages prepared per harness run: more than RUN can take at any concurrency here.
const MESSAGES_PER_RUN: usize = 200_000;

/// One side of a figure with `workers`, as every figure of this benchmark runs it.
fn load(workers: usize) -> Load {
    Load {
        workers,
        run: RUN,
        messages: MESSAGES_PER_RUN,
    }
}

/// One figure: `ROUNDS` rounds of pgbench, bare sqlx and the harness, in random order each round.
async fn trio(url: &str, name: &str, script: &str, workers: usize, duplicates: bool) -> Value {
    let (mut base, mut bare, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut order = [0, 1, 2];
        order.shuffle(&mut rand::rng());
        for side in order {
            match side {
                0 => base.push(pgbench(url, script, load(workers)).per_second),
                1 => bare.push(bare_sqlx(url, load(workers), duplicates).await.per_second),
                _ => ours.push(harness(url, load(workers), duplicates).await.per_second),
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
                0 => per_job.push(pgbench(url, "fence_effect.sql", load(workers)).per_second),
                1 => batch_sql.push(
                    pgbench_with(url, "batch.sql", &BATCH_STEPS, load(workers))
                        .times(BATCH)
                        .per_second,
                ),
                2 => ours.push(harness_batches(url, load(workers), false).await.per_second),
                3 => dup_base.push(pgbench(url, "duplicate.sql", load(workers)).per_second),
                4 => dup_ours.push(harness_batches(url, load(workers), true).await.per_second),
                step => step_runs[step - 5].push(
                    pgbench_with(url, "batch.sql", steps[step - 5].1, load(workers))
                        .times(BATCH)
                        .per_second,
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

/// An SQS event of `jobs` new jobs.
fn sqs_event(jobs: usize) -> Value {
    lambda::sqs_event((0..jobs).map(|_| message(uuid::Uuid::new_v4())))
}

/// The consumer binary's peak RSS (KiB) after one batch and after [`RSS_BATCHES`] batches of 10.
async fn consumer_memory(url: &str) -> (u64, u64, f64) {
    let binaries = e2e::stack::Binaries::beside_current_exe();
    let host = lambda::host(
        "consumer",
        binaries.consumer,
        url,
        &[("DATABASE_POOL_SIZE", "5")],
    );
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

/// Batches of ten timed per side and round in [`tracing_cost`].
const TRACED_BATCHES: usize = 60;

/// The consumer binary's jobs/s with tracing off and on (spans exported to a local OTLP
/// receiver each invocation), alternating in random order for [`ROUNDS`] rounds: medians.
async fn tracing_cost(url: &str) -> Value {
    let receiver = e2e::otlp_receiver::OtlpReceiver::start().await;
    let binary = e2e::stack::Binaries::beside_current_exe().consumer;
    let pool = ("DATABASE_POOL_SIZE", "5");
    let off = lambda::host("consumer-untraced", binary.clone(), url, &[pool]);
    let on = lambda::host(
        "consumer-traced",
        binary,
        url,
        &[
            pool,
            ("TRACING", "Active"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
        ],
    );
    let (mut rates_off, mut rates_on) = (Vec::new(), Vec::new());
    for host in [&off, &on] {
        host.invoke(&sqs_event(10))
            .await
            .expect("the consumer answers");
    }
    for _ in 0..ROUNDS {
        let mut sides = [(true, &on), (false, &off)];
        sides.shuffle(&mut rand::rng());
        for (traced, host) in sides {
            let started = Instant::now();
            for _ in 0..TRACED_BATCHES {
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
            let rate = (TRACED_BATCHES * 10) as f64 / started.elapsed().as_secs_f64();
            if traced {
                rates_on.push(rate)
            } else {
                rates_off.push(rate)
            }
        }
    }
    let (off_rate, on_rate) = (median(rates_off), median(rates_on));
    let spans = receiver.spans().len();
    println!(
        "\ntracing: consumer binary, batches of 10 through the local Lambda host: off {off_rate:.0} jobs/s, \
         on {on_rate:.0} jobs/s ({:.2} x; {spans} spans received)",
        on_rate / off_rate
    );
    json!({"figure": "tracing on / off", "unit": "jobs/s", "off": off_rate, "on": on_rate,
           "ratio": on_rate / off_rate, "spans_received": spans})
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
    // `bench-harness <text>` runs only the figures whose name contains it (for profiling), and
    // the memory figure only when <text> is `memory`.
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
    if "tracing".contains(&only) || only.is_empty() {
        figures.push(tracing_cost(&url).await);
    }
    // `bench-harness memory` runs only the consumer's memory; any other filter skips it.
    if !only.is_empty() && only != "memory" {
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
    bench::write_figures("harness", &out);
}
