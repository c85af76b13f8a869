//! `bench-storm`: a storm in one failure group against the jobs it replaces (issue 36), end to
//! end through the functions' own binaries, each process in the local Lambda host
//! ([`e2e::lambda_host`]) invoked in a loop with SQS events of [`BATCH`] records, as the event
//! source mapping invokes it:
//!
//! - [`PROCESSES`] processes of the deployed consumer binary (`consumer`, with the pool
//!   `templates/consumer.yaml` gives it), in each commit mode (`COMMIT_MODE`), the same processes
//!   for every workload of a round: valid new jobs (random ids), all poison of one shape (an
//!   envelope without its `tenant_id`: each record a `poison` letter of one failure group), and
//!   one record in ten poison;
//! - as many processes of the DLQ ingester (`local-dlq-ingester`, `dlq-ingester`'s code) on
//!   redriven jobs that never ran: `crashed` letters of one group, against the valid new jobs;
//! - records acked per second; after each run the database counts them again (fences and
//!   awards, letters, and exactly one open group for a storm's letters); every round runs each
//!   side once, in random order; medians, and per commit mode the ratios all poison / valid
//!   (issue 36's goal: >= 0.8) and one in ten / valid (>= 0.9);
//! - for context, pgbench at c = 16 on the same tables: the fence + award transaction against a
//!   letter of one group, of distinct groups, and the consumer's whole poison transaction;
//! - the consumer's workloads and the ingester's again at 1 ms RTT, commits waiting for a
//!   synchronous standby ([`e2e::bench::standby`]), with the round trips each record costs
//!   through the proxy.
//!
//! `bench-storm [loopback|pgbench|latency]` runs one part; `--rounds` and `--seconds` set the
//! loopback rounds. Writes `target/bench/storm.json`. Every run starts from empty fences,
//! awards and letters (`bench/reset_storm.sql`), so it wants a database of its own:
//! `bash scripts/bench.sh storm` uses `jobs_bench_storm`. A measurement, not a test.

use clap::Parser;
use e2e::bench::lambda::{self, sqs_event};
use e2e::bench::runs::{BATCH, Load, message, pgbench_with};
use e2e::bench::standby::{Deployment, calibrate};
use e2e::bench::{self, BenchDatabase, median, psql};
use e2e::lambda_host::LambdaHost;
use e2e::latency_proxy::LatencyProxy;
use rand::RngExt;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use shared::config::CommitMode;
use shared::harness::IncomingMessage;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Function processes, each invoked by one loop (Lambda's concurrency).
const PROCESSES: usize = 8;
/// The consumer's pool, as `templates/consumer.yaml` deploys it (also the records of a batch
/// it runs at once); the ingester's, as `template.yaml` does.
const CONSUMER_POOL: &str = "5";
const INGESTER_POOL: &str = "2";
/// The job queue the records come from, and its DLQ (the ingester's event source).
const QUEUE: &str = "bench";
const DLQ: &str = "bench-dlq";
/// Issue 36's goals: letters of one group at this fraction of the valid rate, and a queue with
/// one poison record in ten at this fraction.
const POISON_GOAL: f64 = 0.8;
const MIXED_GOAL: f64 = 0.9;
/// The 1 ms part: its round-trip time, rounds and run length.
const RTT_MS: f64 = 1.0;
const LATENCY_ROUNDS: usize = 3;
const LATENCY_RUN: Duration = Duration::from_secs(8);
/// The pgbench part: clients, rounds, run length.
const PGBENCH_CLIENTS: usize = 16;
const PGBENCH_ROUNDS: usize = 3;
const PGBENCH_RUN: Duration = Duration::from_secs(5);

/// `LETTER_SETTLE_DUE_MS` for the consumers and the ingester: as `templates/consumer.yaml`
/// deploys them ([`shared::dead_letter::SETTLE_DUE`]) unless this run's environment sets it
/// (`0`: every record's letter before its ack, the library's default).
fn settle_due_ms() -> &'static str {
    static DUE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUE.get_or_init(|| {
        std::env::var("LETTER_SETTLE_DUE_MS")
            .unwrap_or_else(|_| shared::dead_letter::SETTLE_DUE.as_millis().to_string())
    })
}

#[derive(Parser)]
struct Args {
    /// Only this part: loopback, pgbench or latency.
    only: Option<String>,
    /// Rounds of the loopback part.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds of each loopback run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// What one run's events hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// New jobs, random ids.
    Valid,
    /// Poison of one shape: one failure group.
    Poison,
    /// One record in ten poison (of that shape), the rest new jobs.
    Mixed,
    /// New jobs redriven to the DLQ without having run: the ingester's `crashed` letters.
    Redriven,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Valid => "valid new jobs",
            Workload::Poison => "all poison, one group",
            Workload::Mixed => "one in ten poison",
            Workload::Redriven => "redriven jobs, one group",
        }
    }

    /// One SQS event of [`BATCH`] records.
    fn event(self) -> Value {
        let odd_one = rand::rng().random_range(0..BATCH);
        sqs_event((0..BATCH).map(|i| match self {
            Workload::Valid => message(Uuid::new_v4()),
            Workload::Poison => poison(),
            Workload::Mixed if i == odd_one => poison(),
            Workload::Mixed => message(Uuid::new_v4()),
            Workload::Redriven => IncomingMessage {
                queue: DLQ.into(),
                ..message(Uuid::new_v4())
            },
        }))
    }

    /// Checks what the run left in the database against the `done` records it acked.
    fn check(self, rows: &Rows, done: u64) {
        let done = done as i64;
        let Rows {
            processed,
            awards,
            letters,
            ref open_groups,
        } = *rows;
        let (want_processed, want_letters) = match self {
            Workload::Valid => (done, 0),
            Workload::Poison | Workload::Redriven => (0, done),
            Workload::Mixed => (done - letters, letters),
        };
        assert_eq!(
            (processed, awards, letters),
            (want_processed, want_processed, want_letters),
            "{}: fences, awards and letters against {done} records acked",
            self.name()
        );
        let groups = usize::from(letters > 0);
        assert_eq!(
            open_groups.len(),
            groups,
            "{}: the open groups {open_groups:?}",
            self.name()
        );
    }
}

/// A body whose envelope has no `tenant_id`: poison, whose job id is still read (so its letter
/// is settled through the job's fence), and whose error is the same for every such body.
fn poison() -> IncomingMessage {
    let body = json!({"job_id": Uuid::new_v4(), "correlation_id": "bench",
        "payload": {"account_id": "a", "points": 1}});
    IncomingMessage {
        body: body.to_string(),
        ..message(Uuid::new_v4())
    }
}

/// Settles what a run left received (the intake's tail: records acked while a settler was at
/// work, as the scheduled run would), before its rows are counted: how many, and how long (the
/// run's rate counts that time: a letter is written when it is settled, not when received).
async fn drain_intake(pool: &PgPool) -> (i64, f64) {
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM core.letter_intake")
        .fetch_one(pool)
        .await
        .expect("counting the intake");
    let started = Instant::now();
    for consumer in shared::dead_letter::consumers_with_received(pool)
        .await
        .expect("reading the intake")
    {
        let settle = shared::dead_letter::settle_behind(
            pool,
            &consumer,
            chrono::Utc::now(),
            Duration::from_secs(2),
            usize::MAX,
        );
        settle.await.expect("settling the intake");
    }
    (left, started.elapsed().as_secs_f64())
}

/// What a run left: fences, awards, letters, and each open group (kind: pattern).
struct Rows {
    processed: i64,
    awards: i64,
    letters: i64,
    open_groups: Vec<String>,
}

async fn rows(pool: &PgPool) -> Rows {
    let (processed, awards, letters, open_groups): (i64, i64, i64, Vec<String>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM core.processed_jobs),
                (SELECT count(*) FROM reference.point_awards),
                (SELECT count(*) FROM core.dead_letters),
                ARRAY(SELECT error_kind || ': ' || pattern FROM core.dead_letter_groups
                      WHERE resolved_at IS NULL ORDER BY id)",
    )
    .fetch_one(pool)
    .await
    .expect("counting the run's rows");
    Rows {
        processed,
        awards,
        letters,
        open_groups,
    }
}

/// The processes a run is driven through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    Consumer(CommitMode),
    Ingester,
}

impl Function {
    fn name(self) -> &'static str {
        match self {
            Function::Consumer(CommitMode::Batch) => "batch mode",
            Function::Consumer(CommitMode::PerJob) => "per job",
            Function::Ingester => "DLQ ingester",
        }
    }

    fn workloads(self) -> &'static [Workload] {
        match self {
            Function::Consumer(_) => &[Workload::Valid, Workload::Poison, Workload::Mixed],
            Function::Ingester => &[Workload::Redriven],
        }
    }

    /// [`PROCESSES`] processes on the database `url`, each started and warmed by one event of
    /// its first workload (its connections opened) before any clock starts.
    async fn start(self, url: &str) -> Vec<Arc<LambdaHost>> {
        let binaries = e2e::stack::Binaries::beside_current_exe();
        let hosts: Vec<Arc<LambdaHost>> = (0..PROCESSES)
            .map(|_| {
                Arc::new(match self {
                    Function::Consumer(mode) => {
                        let reference = migrate::consumers::by_name(e2e::consumer_name().as_str())
                            .expect("the reference consumer's crate");
                        lambda::host(
                            "consumer",
                            binaries.own_binary(reference),
                            url,
                            &[
                                ("DATABASE_POOL_SIZE", CONSUMER_POOL),
                                ("COMMIT_MODE", mode.as_str()),
                                // The settle due as deployed, or the bench's own environment's.
                                ("LETTER_SETTLE_DUE_MS", settle_due_ms()),
                            ],
                        )
                    }
                    Function::Ingester => lambda::host(
                        "dlq-ingester",
                        binaries.ingester.clone(),
                        url,
                        &[
                            ("DATABASE_POOL_SIZE", INGESTER_POOL),
                            ("JOB_QUEUE_NAME", QUEUE),
                            // The consumer's due, as templates/consumer.yaml deploys both.
                            ("LETTER_SETTLE_DUE_MS", settle_due_ms()),
                        ],
                    ),
                })
            })
            .collect();
        let warm = self.workloads()[0].event();
        futures_util::future::join_all(hosts.iter().map(|host| host.invoke(&warm)))
            .await
            .into_iter()
            .for_each(|answer| {
                answer.unwrap_or_else(|e| panic!("the {} answers: {e}", self.name()));
            });
        hosts
    }
}

/// Every host invoked in a loop with events of `workload` for `run`: records acked and not.
async fn drive(hosts: &[Arc<LambdaHost>], workload: Workload, run: Duration) -> (u64, u64, f64) {
    let started = Instant::now();
    let loops: Vec<_> = hosts
        .iter()
        .map(|host| {
            let host = host.clone();
            tokio::spawn(async move {
                let (mut done, mut failed) = (0, 0);
                while started.elapsed() < run {
                    let answer = host.invoke(&workload.event()).await;
                    let answer = answer.unwrap_or_else(|e| panic!("the function answers: {e}"));
                    let failures = answer["batchItemFailures"]
                        .as_array()
                        .map_or(BATCH, Vec::len) as u64;
                    done += BATCH as u64 - failures;
                    failed += failures;
                }
                (done, failed)
            })
        })
        .collect();
    let (mut done, mut failed) = (0, 0);
    for each in futures_util::future::join_all(loops).await {
        let (d, f) = each.expect("a loop");
        done += d;
        failed += f;
    }
    (done, failed, started.elapsed().as_secs_f64())
}

/// Where a part measures: the URL the functions connect to (through the proxy, at 1 ms), the
/// database itself, for the resets and the counts, and the proxy, if any, whose round trips
/// are counted.
struct Target<'a> {
    functions_url: &'a str,
    database: &'a BenchDatabase,
    proxy: Option<&'a LatencyProxy>,
}

/// Records per second of every (function, workload), one value per round.
#[derive(Default)]
struct Rates(Vec<(Function, Workload, Vec<f64>)>);

impl Rates {
    fn push(&mut self, function: Function, workload: Workload, rate: f64) {
        match self
            .0
            .iter_mut()
            .find(|(f, w, _)| (*f, *w) == (function, workload))
        {
            Some((_, _, runs)) => runs.push(rate),
            None => self.0.push((function, workload, vec![rate])),
        }
    }

    fn runs(&self, function: Function, workload: Workload) -> &[f64] {
        self.0
            .iter()
            .find(|(f, w, _)| (*f, *w) == (function, workload))
            .map(|(_, _, runs)| runs.as_slice())
            .unwrap_or_default()
    }

    fn median(&self, function: Function, workload: Workload) -> f64 {
        median(self.runs(function, workload).to_vec())
    }
}

/// `rounds` rounds: each starts every function's processes in random order and runs their
/// workloads on them in random order, each for `run` from empty tables. Records per second,
/// and the round trips per record through the target's proxy (none without one).
async fn measure(
    target: &Target<'_>,
    functions: &[Function],
    rounds: usize,
    run: Duration,
) -> (Rates, Rates) {
    let (mut rates, mut trips) = (Rates::default(), Rates::default());
    for round in 1..=rounds {
        let mut functions = functions.to_vec();
        functions.shuffle(&mut rand::rng());
        for function in functions {
            let hosts = function.start(target.functions_url).await;
            let mut workloads = function.workloads().to_vec();
            workloads.shuffle(&mut rand::rng());
            for workload in workloads {
                psql(&target.database.url, "reset_storm.sql", &[]);
                let before = target.proxy.map(LatencyProxy::round_trips);
                let (done, failed, seconds) = drive(&hosts, workload, run).await;
                let trips_per_record = (target.proxy.map(LatencyProxy::round_trips))
                    .zip(before)
                    .map(|(after, before)| (after - before) as f64 / done.max(1) as f64);
                let (left, drained) = drain_intake(&target.database.pool).await;
                let rows = rows(&target.database.pool).await;
                workload.check(&rows, done);
                // Every record's outcome committed: a record acked as received counts once its
                // letter is settled, so the time its tail took to settle after the run counts.
                let rate = done as f64 / (seconds + drained);
                let mut notes = vec![format!("{done} in {seconds:.1} s")];
                if left > 0 {
                    notes.push(format!(
                        "{left} left received, settled after it in {drained:.2} s; acked at {:.0}/s",
                        done as f64 / seconds
                    ));
                }
                if failed > 0 {
                    notes.push(format!("{failed} failed"));
                }
                if let Some(per_record) = trips_per_record {
                    notes.push(format!("{per_record:.2} round trips/record"));
                    trips.push(function, workload, per_record);
                }
                println!(
                    "  round {round}/{rounds}  {:<13} {:<26} {rate:>7.0} records/s  ({}; open groups: {:?})",
                    function.name(),
                    workload.name(),
                    notes.join(", "),
                    rows.open_groups
                );
                rates.push(function, workload, rate);
            }
        }
    }
    (rates, trips)
}

const MODES: [Function; 2] = [
    Function::Consumer(CommitMode::Batch),
    Function::Consumer(CommitMode::PerJob),
];

/// The table of `rates` (medians, ratios to the valid jobs of each commit mode, every round's
/// value) and of `trips` (round trips per record, if counted), and its figures for the JSON.
fn report(setup: &str, rates: &Rates, trips: &Rates) -> Vec<Value> {
    println!(
        "\n{setup}: records/s, {PROCESSES} processes, batches of {BATCH}, medians  {:>12} {:>12}",
        MODES[0].name(),
        MODES[1].name()
    );
    for workload in MODES[0].workloads() {
        let [b, p] = MODES.map(|mode| rates.median(mode, *workload));
        println!("  {:<62} {b:>12.0} {p:>12.0}", workload.name());
    }
    if !trips.0.is_empty() {
        for workload in MODES[0].workloads() {
            let [b, p] = MODES.map(|mode| trips.median(mode, *workload));
            let label = format!("round trips per record, {}", workload.name());
            println!("  {label:<62} {b:>12.2} {p:>12.2}");
        }
    }
    let mut figures = Vec::new();
    for (workload, goal) in [
        (Workload::Poison, POISON_GOAL),
        (Workload::Mixed, MIXED_GOAL),
    ] {
        let ratios = MODES.map(|mode| {
            let (valid, ours) = (
                rates.median(mode, Workload::Valid),
                rates.median(mode, workload),
            );
            figures.push(json!({
                "setup": setup, "commit_mode": mode.name(),
                "figure": format!("{} vs valid new jobs", workload.name()), "unit": "records/s",
                "baseline": valid, "ours": ours, "ratio": ours / valid, "goal_ratio": goal,
                "baseline_runs": rates.runs(mode, Workload::Valid), "our_runs": rates.runs(mode, workload),
            }));
            if !trips.0.is_empty() {
                let figure = figures.last_mut().expect("just pushed");
                figure["baseline_round_trips_per_record"] = json!(trips.runs(mode, Workload::Valid));
                figure["our_round_trips_per_record"] = json!(trips.runs(mode, workload));
            }
            ours / valid
        });
        println!(
            "  {:<62} {:>12.2} {:>12.2}",
            format!("{} / valid (goal >= {goal})", workload.name()),
            ratios[0],
            ratios[1]
        );
    }
    let ingested = rates.runs(Function::Ingester, Workload::Redriven);
    if !ingested.is_empty() {
        let ours = median(ingested.to_vec());
        let ratios = MODES.map(|mode| {
            let valid = rates.median(mode, Workload::Valid);
            figures.push(json!({
                "setup": setup, "commit_mode": mode.name(),
                "figure": "DLQ ingester, redriven jobs of one group vs the consumer's valid new jobs",
                "unit": "records/s", "baseline": valid, "ours": ours, "ratio": ours / valid,
                "baseline_runs": rates.runs(mode, Workload::Valid), "our_runs": ingested,
            }));
            ours / valid
        });
        println!(
            "  {:<62} {ours:>12.0} letters/s: {:.2} x valid in batch mode, {:.2} x per job",
            "DLQ ingester, redriven jobs of one group", ratios[0], ratios[1]
        );
    }
    println!("  every round:");
    for function in [MODES[0], MODES[1], Function::Ingester] {
        for workload in function.workloads() {
            let runs: Vec<String> = (rates.runs(function, *workload).iter())
                .map(|r| format!("{r:.0}"))
                .collect();
            if !runs.is_empty() {
                let (function, workload) = (function.name(), workload.name());
                println!("    {function:<13} {workload:<26} {}", runs.join(", "));
            }
        }
    }
    figures
}

/// pgbench at [`PGBENCH_CLIENTS`] on the same tables: what the fence + award transaction, a
/// letter of one group, of distinct groups, and the consumer's whole poison transaction (the
/// letter settled through the fence, as the statements per-job mode sends and as one call),
/// each commit per second; and ten letters in one call, as batch mode writes its poison.
fn pgbench_context(url: &str) -> Vec<Value> {
    let sides: [(&str, &str, &[&str]); 6] = [
        ("fence + award (fence_effect.sql)", "fence_effect.sql", &[]),
        ("letter, one group", "letter_one_group.sql", &[]),
        ("letter, distinct groups", "letter_distinct_groups.sql", &[]),
        (
            "letter settled through the fence, one group",
            "letter_one_group.sql",
            &["claim"],
        ),
        (
            "the same in one call (core.record_letters)",
            "letters_in_one_call.sql",
            &["n=1"],
        ),
        (
            "10 letters settled in one call, one group",
            "letters_in_one_call.sql",
            &["n=10"],
        ),
    ];
    let load = Load {
        workers: PGBENCH_CLIENTS,
        run: PGBENCH_RUN,
        messages: 0,
    };
    psql(url, "reset_storm.sql", &[]);
    let mut runs = vec![Vec::new(); sides.len()];
    for _ in 0..PGBENCH_ROUNDS {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        order.shuffle(&mut rand::rng());
        for i in order {
            let (_, file, switches) = sides[i];
            runs[i].push(pgbench_with(url, file, switches, load).per_second);
        }
    }
    psql(url, "reset_storm.sql", &[]);
    let fence = median(runs[0].clone());
    println!(
        "\npgbench, c = {PGBENCH_CLIENTS}, transactions/s, medians of {PGBENCH_ROUNDS} rounds of {} s  {:>9} {:>9}",
        PGBENCH_RUN.as_secs(),
        "tps",
        "/ fence"
    );
    sides
        .iter()
        .zip(&runs)
        .map(|((name, file, switches), runs)| {
            let tps = median(runs.clone());
            let rounds: Vec<String> = runs.iter().map(|r| format!("{r:.0}")).collect();
            println!(
                "  {name:<58} {tps:>9.0} {:>9.2}   ({})",
                tps / fence,
                rounds.join(", ")
            );
            json!({"figure": format!("pgbench c = {PGBENCH_CLIENTS}: {name}"), "script": file,
                   "switches": switches, "unit": "transactions/s", "baseline": fence, "ours": tps,
                   "ratio": tps / fence, "our_runs": runs})
        })
        .collect()
}

/// The consumer's workloads and the ingester's at [`RTT_MS`], commits waiting for a synchronous
/// standby.
async fn at_latency() -> Value {
    println!(
        "\nstarting a primary and its synchronous standby (throwaway clusters), and the latency proxies"
    );
    let rounds = format!(
        "{LATENCY_ROUNDS} rounds of {} s per side, alternating, medians",
        LATENCY_RUN.as_secs()
    );
    let (deployment, primary) = Deployment::seeded(
        &format!("{RTT_MS} ms RTT through the latency proxy"),
        &rounds,
    )
    .await;
    deployment.set_rtt(Duration::from_secs_f64(RTT_MS / 1000.0));
    let url = deployment.clients.url(&primary.url);
    let (trip, commit) = calibrate(&url).await;
    println!(
        "RTT {RTT_MS} ms set: a round trip through the proxy takes {trip:.2} ms, an autocommit insert {commit:.2} ms"
    );
    let target = Target {
        functions_url: &url,
        database: &primary,
        proxy: Some(&deployment.clients),
    };
    let functions = [MODES[0], MODES[1], Function::Ingester];
    let (rates, trips) = measure(&target, &functions, LATENCY_ROUNDS, LATENCY_RUN).await;
    let setup = format!("{RTT_MS} ms RTT, synchronous standby");
    json!({"rtt_ms": RTT_MS, "measured_rtt_ms": trip, "measured_commit_ms": commit,
           "rounds": LATENCY_ROUNDS, "run_seconds": LATENCY_RUN.as_secs(),
           "figures": report(&setup, &rates, &trips)})
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let part = |name: &str| args.only.as_deref().is_none_or(|only| only == name);
    let database = bench::open(
        2,
        &format!(
            "{PROCESSES} processes of each function, batches of {BATCH}, LETTER_SETTLE_DUE_MS={}; {} rounds of {} s per side, alternating, medians",
            settle_due_ms(),
            args.rounds,
            args.seconds
        ),
    )
    .await;
    let mut out = json!({"postgres": database.version, "processes": PROCESSES, "batch": BATCH,
        "consumer_pool": CONSUMER_POOL, "ingester_pool": INGESTER_POOL,
        "letter_settle_due_ms": settle_due_ms()});
    if part("loopback") {
        let target = Target {
            functions_url: &database.url,
            database: &database,
            proxy: None,
        };
        let functions = [MODES[0], MODES[1], Function::Ingester];
        let run = Duration::from_secs(args.seconds);
        let (rates, trips) = measure(&target, &functions, args.rounds, run).await;
        out["loopback"] = json!({"rounds": args.rounds, "run_seconds": args.seconds,
            "figures": report("loopback", &rates, &trips)});
    }
    if part("pgbench") {
        out["pgbench"] = json!({"clients": PGBENCH_CLIENTS, "rounds": PGBENCH_ROUNDS,
            "run_seconds": PGBENCH_RUN.as_secs(), "figures": pgbench_context(&database.url)});
    }
    if part("latency") {
        out["latency"] = at_latency().await;
    }
    bench::write_figures("storm", &out);
}
