//! `bench-latency`: the harness against pgbench where users run it, at a network's latency and
//! with a commit that waits for a synchronous standby (Lambda → RDS Proxy → PostgreSQL
//! Multi-AZ), on this machine:
//!
//! - a throwaway primary and a streaming standby of its own (`synchronous_commit = on`,
//!   `synchronous_standby_names` = the standby), both started here ([`e2e::bench::standby`])
//!   and removed at the end;
//! - the latency proxy (`e2e::latency_proxy`) between every client and the primary and
//!   between the primary and its standby, at each round-trip time in [`RTTS`]; pgbench and the
//!   harness go through the same proxy, which counts every round trip each side makes;
//! - per round-trip time and at c = 1 and 8: pgbench's per-job transaction, its duplicate path
//!   and batch mode's set SQL, against the harness's per-job path, duplicate path and batch
//!   mode (new jobs and duplicates), in alternating rounds of random order; medians, ratios,
//!   and round trips per job, printed and written to `target/bench/latency.json`.
//!
//! `bench-latency pooler` puts PgBouncer in transaction mode behind the clients' proxy, at
//! 1 ms: 64 clients over 8 server connections against 8 clients direct ([`pooler`];
//! `target/bench/pooler.json`).
//!
//! A measurement, not a test (`tests/tests/round_trips.rs` pins the counts).

use e2e::bench::runs::{
    BATCH, BATCH_STEPS, Load, Rate, harness, harness_batches, pgbench, pgbench_extended,
    pgbench_with,
};
use e2e::bench::standby::{Deployment, calibrate};
use e2e::bench::{self, BenchDatabase, median};
use e2e::latency_proxy::LatencyProxy;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use std::time::Duration;

/// Round-trip times, in milliseconds.
const RTTS: [f64; 4] = [0.0, 0.5, 1.0, 2.0];
const LEVELS: [usize; 2] = [1, 8];
const ROUNDS: usize = 3;
const RUN: Duration = Duration::from_secs(3);
/// Messages prepared per harness run: more than RUN can take here through the proxy.
const MESSAGES_PER_RUN: usize = 40_000;

/// The sides of a figure: pgbench's three baselines, then the harness's four paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    PgbenchJob,
    PgbenchDuplicate,
    PgbenchSetSql,
    PerJob,
    PerJobDuplicate,
    Batch,
    BatchDuplicate,
}

const SIDES: [Side; 7] = [
    Side::PgbenchJob,
    Side::PgbenchDuplicate,
    Side::PgbenchSetSql,
    Side::PerJob,
    Side::PerJobDuplicate,
    Side::Batch,
    Side::BatchDuplicate,
];

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::PgbenchJob => "pgbench, per-job transaction",
            Side::PgbenchDuplicate => "pgbench, duplicate path",
            Side::PgbenchSetSql => "pgbench, batch mode's set SQL",
            Side::PerJob => "new job, per job",
            Side::PerJobDuplicate => "duplicate, per job",
            Side::Batch => "batch of 10 new jobs",
            Side::BatchDuplicate => "batch of 10 duplicates",
        }
    }

    async fn run(self, url: &str, load: Load) -> Rate {
        match self {
            Side::PgbenchJob => pgbench(url, "fence_effect.sql", load),
            Side::PgbenchDuplicate => pgbench(url, "duplicate.sql", load),
            Side::PgbenchSetSql => pgbench_with(url, "batch.sql", &BATCH_STEPS, load).times(BATCH),
            Side::PerJob => harness(url, load, false).await,
            Side::PerJobDuplicate => harness(url, load, true).await,
            Side::Batch => harness_batches(url, load, false).await,
            Side::BatchDuplicate => harness_batches(url, load, true).await,
        }
    }
}

/// The figures: ours, its baseline, the goal ratio (issue 24) and what the goal counts as a
/// round trip budget.
const FIGURES: [(Side, Side, f64, &str); 5] = [
    (Side::PerJob, Side::PgbenchJob, 1.0, "<= 4, aim 3"),
    (Side::PerJobDuplicate, Side::PgbenchDuplicate, 3.0, "1"),
    (Side::Batch, Side::PgbenchJob, 6.0, "<= 5 a batch"),
    (Side::Batch, Side::PgbenchSetSql, 0.0, "-"),
    (
        Side::BatchDuplicate,
        Side::PgbenchDuplicate,
        20.0,
        "1 a batch",
    ),
];

/// Each side's runs at one round-trip time and concurrency: rates and round trips per job.
#[derive(Default, Clone)]
struct Runs {
    rates: Vec<f64>,
    trips: Vec<f64>,
}

async fn measure(url: &str, proxy: &LatencyProxy, workers: usize) -> Vec<Runs> {
    let load = Load {
        workers,
        run: RUN,
        messages: MESSAGES_PER_RUN,
    };
    let mut runs = vec![Runs::default(); SIDES.len()];
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..SIDES.len()).collect();
        order.shuffle(&mut rand::rng());
        for i in order {
            let before = proxy.round_trips();
            let rate = SIDES[i].run(url, load).await;
            let trips = (proxy.round_trips() - before) as f64 / rate.jobs.max(1) as f64;
            runs[i].rates.push(rate.per_second);
            runs[i].trips.push(trips);
        }
    }
    runs
}

/// How the figures are taken, for the machine line.
fn rounds() -> String {
    format!(
        "{ROUNDS} rounds of {} s per side, alternating, medians",
        RUN.as_secs()
    )
}

/// Clients and server connections of the pooler part: 64 clients over 8.
const POOLED_CLIENTS: usize = 64;
const POOL_SIZE: u32 = 8;
/// The round-trip time of the pooler part (the deployment figure).
const POOLED_RTT_MS: f64 = 1.0;

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("pooler") {
        return pooler().await;
    }
    println!(
        "starting a primary and its synchronous standby (throwaway clusters), and the latency proxies"
    );
    let (
        deployment,
        BenchDatabase {
            url: direct,
            version,
            ..
        },
    ) = Deployment::seeded("through the latency proxy", &rounds()).await;
    let url = deployment.clients.url(&direct);

    let mut figures = Vec::new();
    for rtt_ms in RTTS {
        deployment.set_rtt(Duration::from_secs_f64(rtt_ms / 1000.0));
        let (trip, commit) = calibrate(&url).await;
        println!(
            "\nRTT {rtt_ms} ms set: a round trip through the proxy takes {trip:.2} ms, an autocommit \
             insert (one round trip and a commit the standby confirms) {commit:.2} ms"
        );
        for workers in LEVELS {
            let runs = measure(&url, &deployment.clients, workers).await;
            let of = |side: Side| &runs[SIDES.iter().position(|s| *s == side).unwrap()];
            println!(
                "\nRTT {rtt_ms} ms, c = {workers}   {:<30} {:>9} {:>9} {:>7} {:>6} {:>10} {:>10}",
                "", "baseline", "harness", "ratio", "goal", "trips/job", "base trips"
            );
            for (ours, base, goal, budget) in FIGURES {
                let (o, b) = (
                    median(of(ours).rates.clone()),
                    median(of(base).rates.clone()),
                );
                let (ot, bt) = (
                    median(of(ours).trips.clone()),
                    median(of(base).trips.clone()),
                );
                let label = format!("{} vs {}", ours.name(), base.name());
                let goal_text = if goal > 0.0 {
                    format!("{goal}")
                } else {
                    "-".into()
                };
                println!(
                    "  {label:<62} {b:>9.0} {o:>9.0} {:>7.2} {goal_text:>6} {ot:>10.2} {bt:>10.2}",
                    o / b
                );
                figures.push(json!({
                    "rtt_ms": rtt_ms, "measured_rtt_ms": trip, "measured_commit_ms": commit, "c": workers, "figure": ours.name(), "baseline_name": base.name(),
                    "unit": "jobs/s", "baseline": b, "ours": o, "ratio": o / b,
                    "goal_ratio": (goal > 0.0).then_some(goal), "round_trip_budget": budget,
                    "round_trips_per_job": ot, "baseline_round_trips_per_job": bt,
                    "our_runs": of(ours).rates, "baseline_runs": of(base).rates,
                }));
            }
        }
    }

    let out: Value = json!({"postgres": version, "rounds": ROUNDS, "run_seconds": RUN.as_secs(),
        "setup": "throwaway primary + synchronous streaming standby, latency proxy on both links",
        "figures": figures});
    bench::write_figures("latency", &out);
}

/// `bench-latency pooler`: at 1 ms RTT with the synchronous standby, clients reaching the
/// primary through PgBouncer in transaction mode (latency proxy → PgBouncer → primary, as
/// Lambda → RDS Proxy → PostgreSQL): 64 clients over 8 server connections, against 8 clients
/// straight to the primary, for pgbench and the harness alike. Multiplexing adds no round trip,
/// so 64 clients over 8 connections should do what 8 clients on their own connections do.
async fn pooler() {
    println!(
        "starting a primary and its synchronous standby, PgBouncer ({POOLED_CLIENTS} clients over {POOL_SIZE} server connections, transaction mode) and the latency proxies"
    );
    let (
        deployment,
        BenchDatabase {
            url: direct,
            version,
            ..
        },
    ) = Deployment::seeded(&format!("{POOLED_RTT_MS} ms RTT"), &rounds()).await;
    let bouncer = e2e::pooler::Pooler::start(&direct, POOL_SIZE);
    let to_bouncer = LatencyProxy::start(
        format!("127.0.0.1:{}", bouncer.port).parse().unwrap(),
        Duration::ZERO,
    );
    let rtt = Duration::from_secs_f64(POOLED_RTT_MS / 1000.0);
    deployment.set_rtt(rtt);
    to_bouncer.set_rtt(rtt);
    let straight = deployment.clients.url(&direct);
    let pooled = to_bouncer.url(&bouncer.url_for(&direct));
    let (trip, commit) = calibrate(&pooled).await;
    println!(
        "through PgBouncer: a round trip takes {trip:.2} ms, an autocommit insert {commit:.2} ms"
    );

    // (name, through the pooler?, side)
    let sides: [(&str, bool, Side); 6] = [
        ("pgbench -M extended, c = 8 direct", false, Side::PgbenchJob),
        ("pgbench -M extended, 64 over 8", true, Side::PgbenchJob),
        ("new jobs per job, c = 8 direct", false, Side::PerJob),
        ("new jobs per job, 64 over 8", true, Side::PerJob),
        ("batches of 10 new, c = 8 direct", false, Side::Batch),
        ("batches of 10 new, 64 over 8", true, Side::Batch),
    ];
    let mut rates = vec![Vec::new(); sides.len()];
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        order.shuffle(&mut rand::rng());
        for i in order {
            let (_, through, side) = sides[i];
            let (url, workers) = if through {
                (&pooled, POOLED_CLIENTS)
            } else {
                (&straight, POOL_SIZE as usize)
            };
            let load = Load {
                workers,
                run: RUN,
                messages: MESSAGES_PER_RUN,
            };
            // pgbench's prepared mode stalls behind a pooler with fewer server connections
            // than clients (see `pgbench_extended`); both of its sides run extended.
            let rate = match side {
                Side::PgbenchJob => pgbench_extended(url, "fence_effect.sql", load),
                _ => side.run(url, load).await,
            };
            rates[i].push(rate.per_second);
        }
    }
    let median_of = |i: usize| median(rates[i].clone());
    println!(
        "\n{POOLED_RTT_MS} ms RTT   {:<56} {:>9} {:>9} {:>7}",
        "", "baseline", "ours", "ratio"
    );
    let mut figures = Vec::new();
    // (ours, baseline): pooled against direct for each side, and the harness against pgbench
    // through the same pooler.
    for (ours, base) in [(1, 0), (3, 2), (5, 4), (3, 1), (5, 1)] {
        let (o, b) = (median_of(ours), median_of(base));
        let label = format!("{} vs {}", sides[ours].0, sides[base].0);
        println!("  {label:<66} {b:>9.0} {o:>9.0} {:>7.2}", o / b);
        figures.push(json!({
            "figure": sides[ours].0, "baseline_name": sides[base].0, "unit": "jobs/s",
            "ours": o, "baseline": b, "ratio": o / b,
            "our_runs": rates[ours], "baseline_runs": rates[base],
        }));
    }
    let out: Value = json!({"postgres": version, "rounds": ROUNDS, "run_seconds": RUN.as_secs(),
        "rtt_ms": POOLED_RTT_MS, "measured_rtt_ms": trip, "measured_commit_ms": commit,
        "clients": POOLED_CLIENTS, "server_connections": POOL_SIZE,
        "pgbouncer": format!("{}, pool_mode = transaction, max_prepared_statements = 500", e2e::pooler::Pooler::version()),
        "setup": "throwaway primary + synchronous streaming standby; latency proxy → PgBouncer → primary, and primary → standby",
        "figures": figures});
    bench::write_figures("pooler", &out);
}
