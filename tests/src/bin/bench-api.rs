//! `bench-api`: latency of the dead-letter API at 1,000,000 letters, in process (`Api::handle`
//! with a real pool on `DATABASE_URL`, replays to the local SQS API). p50 and p95 of each
//! operation over many calls; list pages first and deep (by cursor), with and without filters.
//! Written to `target/bench/api.json`. A measurement, not a test: it fails only if a call fails.

use dead_letter_api::api::list_query::encode_cursor;
use dead_letter_api::api::{Api, ApiRequest, Caller};
use e2e::bench::{self, BenchDatabase};
use serde_json::json;
use shared::clock::SystemClock;
use shared::dead_letter::Position;
use shared::replay::Replayer;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LETTERS: u64 = 1_000_000;
const CALLS: usize = 200;
const WARMUP: usize = 20;

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

fn post(path: String, body: &str) -> ApiRequest {
    ApiRequest {
        method: "POST".into(),
        path,
        query: Vec::new(),
        body: body.as_bytes().to_vec(),
        caller: caller(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Times `api.handle` on each request; every response must be a 200. Returns the sorted times
/// and the items in the last response (a list page's size; 1 otherwise).
async fn time(api: &Api, requests: Vec<ApiRequest>) -> (Vec<Duration>, usize) {
    let mut took = Vec::with_capacity(requests.len());
    let mut items = 0;
    for request in requests {
        let started = Instant::now();
        let response = api.handle(&request).await;
        took.push(started.elapsed());
        assert_eq!(
            response.status, 200,
            "{} {}: {}",
            request.method, request.path, response.body
        );
        items = response.body["items"].as_array().map_or(1, Vec::len);
    }
    took.sort();
    (took, items)
}

async fn position_at(pool: &PgPool, filter: &str, offset: i64) -> Position {
    let sql = format!(
        "SELECT created_at, id FROM core.dead_letters WHERE {filter}
         ORDER BY created_at DESC, id DESC OFFSET $1 LIMIT 1"
    );
    let (created_at, id) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(offset)
        .fetch_one(pool)
        .await
        .unwrap();
    Position { created_at, id }
}

async fn sample(pool: &PgPool, filter: &str, n: usize) -> Vec<uuid::Uuid> {
    let sql = format!("SELECT id FROM core.dead_letters WHERE {filter} ORDER BY random() LIMIT $1");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(n as i64)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::main]
async fn main() {
    let BenchDatabase { url, pool, version } = bench::open(
        4,
        &format!("{CALLS} calls per figure after {WARMUP} warm-up"),
    )
    .await;
    bench::psql(&url, "seed_dead_letters.sql", &[("n", LETTERS.to_string())]);

    let sqs = aws_sdk_sqs::Client::new(&aws_config::load_from_env().await);
    for q in 0..5 {
        sqs.create_queue()
            .queue_name(format!("bench-queue-{q}"))
            .send()
            .await
            .expect("CreateQueue");
    }
    let clock = Arc::new(SystemClock);
    let wait = Duration::from_secs(2);
    let read = Api::read(pool.clone(), clock.clone(), wait);
    let replay = Api::replay(pool.clone(), clock.clone(), wait, Replayer::new(sqs));
    let discard = Api::discard(pool.clone(), clock, wait);

    let list = "/v1/core/dead-letters";
    let filtered = [
        ("status", "pending_review".to_owned()),
        ("queue", "bench-queue-3".to_owned()),
        ("error_kind", "crashed".to_owned()),
    ];
    let filtered_sql =
        "status = 'pending_review' AND queue = 'bench-queue-3' AND error_kind = 'crashed'";
    let deep = encode_cursor(position_at(&pool, "true", 600_000).await);
    let deep_filtered = encode_cursor(position_at(&pool, filtered_sql, 10_000).await);
    let mut with_cursor = filtered.to_vec();
    with_cursor.push(("cursor", deep_filtered));
    let day = chrono::Utc::now() - chrono::Duration::days(45);
    let range = [
        ("created_from", day.to_rfc3339()),
        (
            "created_before",
            (day + chrono::Duration::days(1)).to_rfc3339(),
        ),
    ];
    let list_cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("list: first page, no filter", vec![]),
        (
            "list: page 600,000 rows deep, no filter",
            vec![("cursor", deep)],
        ),
        ("list: first page, status+queue+kind", filtered.to_vec()),
        ("list: deep page, status+queue+kind", with_cursor),
        (
            "list: first page, consumer",
            vec![("consumer", "consumer-2".into())],
        ),
        (
            "list: first page, kind=poison (5%)",
            vec![("error_kind", "poison".into())],
        ),
        ("list: first page, one day 45 days ago", range.to_vec()),
        (
            "list: all four filters (0.02% of rows)",
            vec![
                ("status", "discarded".into()),
                ("queue", "bench-queue-1".into()),
                ("consumer", "consumer-4".into()),
                ("error_kind", "poison".into()),
            ],
        ),
    ];

    // What a support ticket names, taken from one letter; a big group, whole and pending only.
    let (job, correlation, tenant, message): (uuid::Uuid, String, uuid::Uuid, String) =
        sqlx::query_as(
            "SELECT job_id, correlation_id, tenant_id, message_id FROM core.dead_letters
             ORDER BY random() LIMIT 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
    let group: i64 = sqlx::query_scalar(
        "SELECT id FROM core.dead_letter_groups_counted ORDER BY letter_count DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut list_cases = list_cases;
    list_cases.extend([
        ("list: by job_id", vec![("job_id", job.to_string())]),
        (
            "list: by correlation_id",
            vec![("correlation_id", correlation)],
        ),
        (
            "list: by tenant_id",
            vec![("tenant_id", tenant.to_string())],
        ),
        ("list: by message_id", vec![("message_id", message)]),
        (
            "list: first page of a group (~10,000 letters)",
            vec![("group_id", group.to_string())],
        ),
        (
            "list: its letters pending review",
            vec![
                ("group_id", group.to_string()),
                ("status", "pending_review".into()),
            ],
        ),
    ]);

    let mut figures = Vec::new();
    let mut record = |name: &str, (took, items): (Vec<Duration>, usize)| {
        let (p50, p95) = (percentile(&took, 0.5), percentile(&took, 0.95));
        println!("{name:<48} {items:>5} {p50:>9.2} {p95:>9.2}");
        figures.push(
            json!({"figure": name, "items": items, "p50_ms": p50, "p95_ms": p95, "calls": took.len()}),
        );
    };
    println!(
        "\n{:<48} {:>5} {:>9} {:>9}",
        "operation (1,000,000 letters)", "items", "p50 ms", "p95 ms"
    );
    for (name, query) in list_cases {
        let request = get(list, &query);
        time(&read, vec![request.clone(); WARMUP]).await;
        record(name, time(&read, vec![request; CALLS]).await);
    }
    let groups = get("/v1/core/dead-letter-groups", &[("status", "all".into())]);
    time(&read, vec![groups.clone(); WARMUP]).await;
    record(
        "groups: first page of 100",
        time(&read, vec![groups; CALLS]).await,
    );
    let ids = sample(&pool, "true", CALLS).await;
    let gets = ids
        .iter()
        .map(|id| get(&format!("{list}/{id}"), &[]))
        .collect();
    record("get one letter", time(&read, gets).await);

    let pending = sample(&pool, "status = 'pending_review'", 2 * CALLS).await;
    let (to_replay, to_discard) = pending.split_at(CALLS);
    let replays = to_replay
        .iter()
        .map(|id| post(format!("{list}/{id}/replay"), ""))
        .collect();
    record(
        "replay (incl. SendMessage to the local SQS API)",
        time(&replay, replays).await,
    );
    let discards = to_discard
        .iter()
        .map(|id| post(format!("{list}/{id}/discard"), r#"{"reason": "benchmark"}"#))
        .collect();
    record("discard", time(&discard, discards).await);

    let out = json!({"letters": LETTERS, "postgres": version, "figures": figures, "goal": "list p95 <= 50 ms; spec budget p95 < 1 s"});
    bench::write_figures("api", &out);
}
