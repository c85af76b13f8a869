//! `bench-operations`: the worst day's way back. A storm of 1,000,000 pending letters in one
//! failure group is discarded by one bulk operation, and 100,000 are replayed (sent to the
//! local SQS API) by another, each worked by the operations worker as the scheduled function
//! runs it (`shared::operations::work`, in process, one worker). Meanwhile the API's list and
//! group reads are timed, against the same reads timed before the operation in the same run.
//! Also the letters' bytes per letter and the indexes of `core.dead_letters`. Figures in
//! `target/bench/operations.json`. A measurement, not a test: it fails only if a call fails.

use dead_letter_api::api::{Api, ApiRequest, Caller};
use e2e::bench::{self, psql};
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::operations::{self, OperationTools};
use shared::replay::Replayer;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Letters discarded (`BENCH_DISCARDS` overrides, for a quick look).
const DISCARDS: u64 = 1_000_000;
/// Letters replayed (`BENCH_REPLAYS` overrides).
const REPLAYS: u64 = 100_000;

fn count(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
const GOAL: Duration = Duration::from_secs(600);

fn caller() -> Option<Caller> {
    Some(Caller {
        subject: Some("bench".into()),
        scopes: ["read", "replay", "discard"]
            .map(|s| format!("core.dead_letters.{s}"))
            .to_vec(),
    })
}

fn get(path: &str, query: &[(&str, String)]) -> ApiRequest {
    ApiRequest {
        method: "GET".into(),
        path: path.into(),
        query: query
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        body: Vec::new(),
        caller: caller(),
    }
}

/// The reads an on-call operator makes while an operation runs: the group, its pending letters,
/// the open groups, the operation.
fn reads(group: i64) -> Vec<ApiRequest> {
    vec![
        get(&format!("/v1/core/dead-letter-groups/{group}"), &[]),
        get("/v1/core/dead-letter-groups", &[]),
        get(
            "/v1/core/dead-letters",
            &[
                ("group_id", group.to_string()),
                ("status", "pending_review".into()),
            ],
        ),
        get("/v1/core/dead-letters", &[]),
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Times `requests` round and round until `stop` (or `rounds` rounds); every answer a 200.
async fn time_reads(
    api: &Api,
    requests: &[ApiRequest],
    stop: &AtomicBool,
    rounds: usize,
) -> Vec<Duration> {
    let mut took = Vec::new();
    for _ in 0..rounds {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        for request in requests {
            let started = Instant::now();
            let answer = api.handle(request).await;
            assert_eq!(answer.status, 200, "{:#}", answer.body);
            took.push(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took.sort();
    took
}

async fn group_of(pool: &PgPool, queue: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM core.dead_letter_groups WHERE queue = $1")
        .bind(queue)
        .fetch_one(pool)
        .await
        .expect("the storm's group")
}

/// The table's size per letter and its indexes.
async fn bytes_per_letter(pool: &PgPool) -> Value {
    let (letters, heap, total, indexes): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM core.dead_letters), pg_relation_size('core.dead_letters'),
                pg_total_relation_size('core.dead_letters'),
                (SELECT count(*) FROM pg_indexes WHERE schemaname = 'core' AND tablename = 'dead_letters')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let per = |b: i64| b as f64 / letters.max(1) as f64;
    println!(
        "core.dead_letters: {letters} letters, {:.0} MB: {:.0} bytes a letter ({:.0} heap, {:.0} indexes and TOAST), {indexes} indexes",
        total as f64 / 1e6,
        per(total),
        per(heap),
        per(total - heap)
    );
    json!({"letters": letters, "total_bytes": total, "bytes_per_letter": per(total),
           "heap_bytes_per_letter": per(heap), "index_bytes_per_letter": per(total - heap),
           "indexes": indexes})
}

/// Starts `action` on `group` through the API, works it to its end with one worker while the
/// reads are timed; the figure.
async fn run(
    apis: (&Api, &Api),
    tools: &OperationTools,
    action: &str,
    group: i64,
    letters: u64,
    baseline: &[Duration],
) -> Value {
    let (start_api, read_api) = apis;
    let body = json!({"reason": "benchmark: the partner is back", "filter": {"group_id": group.to_string()}});
    let answer = start_api
        .handle(&ApiRequest {
            method: "POST".into(),
            path: format!("/v1/core/dead-letter-operations/{action}"),
            body: body.to_string().into_bytes(),
            caller: caller(),
            ..Default::default()
        })
        .await;
    assert_eq!(answer.status, 202, "{:#}", answer.body);
    let id = answer.body["operation"]["id"].as_str().unwrap().to_owned();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let work = async {
        loop {
            let until = tokio::time::Instant::now() + Duration::from_secs(60);
            let round = operations::work(tools, until, 1).await.expect("a round");
            if round.ended > 0 || round.operations == 0 {
                break;
            }
        }
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        took
    };
    let mut requests = reads(group);
    requests.push(get(&format!("/v1/core/dead-letter-operations/{id}"), &[]));
    let (took, during) = tokio::join!(work, time_reads(read_api, &requests, &stop, usize::MAX));
    let op = read_api
        .handle(&get(&format!("/v1/core/dead-letter-operations/{id}"), &[]))
        .await
        .body["operation"]
        .clone();
    assert_eq!(op["status"], "done", "{op:#}");
    let rate = letters as f64 / took.as_secs_f64();
    let (p50, p95) = (percentile(&during, 0.5), percentile(&during, 0.95));
    let (b50, b95) = (percentile(baseline, 0.5), percentile(baseline, 0.95));
    println!(
        "{action:<8} {letters:>9} letters in {:>6.1} s = {rate:>7.0}/s ({:.2} x the 10-minute goal's time) | reads p50 {p50:.1} ms, p95 {p95:.1} ms (before: {b50:.1} / {b95:.1} ms; p95 {:.2} x)",
        took.as_secs_f64(),
        took.as_secs_f64() / GOAL.as_secs_f64(),
        p95 / b95.max(0.001)
    );
    json!({"action": action, "letters": letters, "seconds": took.as_secs_f64(), "per_second": rate,
           "goal_seconds": GOAL.as_secs(), "share_of_goal": took.as_secs_f64() / GOAL.as_secs_f64(),
           "reads_during": {"p50_ms": p50, "p95_ms": p95, "calls": during.len()},
           "reads_before": {"p50_ms": b50, "p95_ms": b95, "calls": baseline.len()},
           "operation": op})
}

#[tokio::main]
async fn main() {
    let db = bench::open(
        16,
        "bulk operations on a storm, one worker in process; reads in process",
    )
    .await;
    let pool = db.pool.clone();
    let sqs = e2e::event_source::sqs_client().await;
    let queue = e2e::event_source::create_queue(&sqs, "bench-replays", &[]).await;
    sqlx::query("SELECT 1").execute(&pool).await.unwrap();
    let (discards, replays_n) = (
        count("BENCH_DISCARDS", DISCARDS),
        count("BENCH_REPLAYS", REPLAYS),
    );
    println!("seeding {discards} letters of one group, and {replays_n} of another (a few minutes)");
    psql(
        &db.url,
        "seed_storm_letters.sql",
        &[("n", discards.to_string()), ("queue", "bench-storm".into())],
    );
    psql(
        &db.url,
        "seed_storm_letters.sql",
        &[("n", replays_n.to_string()), ("queue", queue.name.clone())],
    );
    let before = bytes_per_letter(&pool).await;

    let clock = Arc::new(SystemClock);
    let wait = Duration::from_secs(2);
    let read = Api::read(pool.clone(), clock.clone(), wait);
    let discard = Api::discard(pool.clone(), clock.clone(), wait);
    let replay = Api::replay(
        pool.clone(),
        clock.clone(),
        wait,
        Replayer::new(sqs.clone()),
    );
    let tools = OperationTools {
        pool: pool.clone(),
        clock,
        replayer: Some(Replayer::new(sqs.clone())),
    };
    let storm = group_of(&pool, "bench-storm").await;
    let replays = group_of(&pool, &queue.name).await;
    let never = AtomicBool::new(false);
    let baseline = time_reads(&read, &reads(storm), &never, 50).await;
    println!("\n{:<8} {:>9}", "action", "letters");
    let discarded = run(
        (&discard, &read),
        &tools,
        "discard",
        storm,
        discards,
        &baseline,
    )
    .await;
    let baseline = time_reads(&read, &reads(replays), &never, 50).await;
    let replayed = run(
        (&replay, &read),
        &tools,
        "replay",
        replays,
        replays_n,
        &baseline,
    )
    .await;
    let after = bytes_per_letter(&pool).await;
    bench::write_figures(
        "operations",
        &json!({"postgres": db.version, "discard": discarded, "replay": replayed,
                "table_before": before, "table_after": after,
                "goal": "1,000,000 discarded and 100,000 replayed, each in <= 10 minutes; reads p95 < 1 s meanwhile"}),
    );
}
