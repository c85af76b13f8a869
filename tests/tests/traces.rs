//! Optional X-Ray tracing, through the real binaries (issue 26): with `TRACING=Active` each job
//! is a subsegment of its invocation's function segment and each database statement it ran (the
//! harness's fence and letter, the consumer's own effect) a subsegment of its job, sent to the
//! daemon address Lambda gives; off by default, nothing is sent. The daemon here is a UDP socket
//! of the test's own, reading the documents as X-Ray's daemon does.

use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::harness::CommitMode;
use shared::ids::{JobId, TenantId};
use shared_testkit::envelope;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use tokio::net::UdpSocket;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(60);
/// A value only the payload carries: no statement's segment may show it.
const ACCOUNT: &str = "acct-never-in-a-segment";

/// A stack whose functions send their segments (if `tracing` is set) to a daemon of its own.
async fn traced_stack(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    tracing: Option<&str>,
    mode: CommitMode,
) -> (PgPool, Stack, UdpSocket) {
    let daemon = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let address = daemon.local_addr().unwrap().to_string();
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.function_env = vec![("AWS_XRAY_DAEMON_ADDRESS".into(), address.clone())];
        if let Some(tracing) = tracing {
            spec.function_env.push(("TRACING".into(), tracing.into()));
        }
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
    })
    .await;
    (pool, stack, daemon)
}

/// Sends a valid job and a poison one and runs the stack until the first is fenced and the
/// second is a letter.
async fn send_two_jobs(pool: &PgPool, stack: &Stack) -> (JobId, JobId) {
    let tenant = TenantId(Uuid::new_v4());
    let (valid, poison) = (JobId(Uuid::new_v4()), JobId(Uuid::new_v4()));
    stack
        .send(&envelope(
            valid,
            tenant,
            "c-traced",
            json!({"account_id": ACCOUNT, "points": 5}),
        ))
        .await;
    stack
        .send(&envelope(
            poison,
            tenant,
            "c-poison",
            json!({"account_id": ACCOUNT, "points": "five"}),
        ))
        .await;
    stack
        .run_until(SETTLE, || async {
            let count = |sql: &'static str| async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            };
            count("SELECT count(*) FROM core.processed_jobs").await == 1
                && count("SELECT count(*) FROM core.dead_letters").await == 1
        })
        .await;
    (valid, poison)
}

/// Every document the daemon received until none came for a second: each is X-Ray's header
/// line and one segment.
async fn received(daemon: &UdpSocket) -> Vec<Value> {
    let mut documents = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), daemon.recv(&mut buf)).await
    {
        let text = std::str::from_utf8(&buf[..n]).expect("a document is UTF-8");
        let (header, segment) = text.split_once('\n').expect("a header line");
        assert_eq!(
            serde_json::from_str::<Value>(header).unwrap(),
            json!({"format": "json", "version": 1})
        );
        documents.push(serde_json::from_str(segment).expect("a segment is JSON"));
    }
    documents
}

/// (root, parent) of each trace header the consumer was invoked with.
fn traces(stack: &Stack) -> Vec<(String, String)> {
    stack
        .consumer
        .trace_headers()
        .iter()
        .map(|h| {
            let get = |key: &str| {
                h.split(';')
                    .find_map(|p| p.strip_prefix(key))
                    .unwrap()
                    .to_owned()
            };
            (get("Root="), get("Parent="))
        })
        .collect()
}

async fn each_job_and_its_statements_are_subsegments_of_its_invocation(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack, daemon) = traced_stack(pool_opts, connect, Some("Active"), mode).await;
    let (valid, poison) = send_two_jobs(&pool, &stack).await;
    let documents = received(&daemon).await;
    let invocations = traces(&stack);
    let job = |job_id: JobId| {
        documents
            .iter()
            .find(|d| d["annotations"]["job_id"] == job_id.to_string())
            .unwrap_or_else(|| panic!("no subsegment for job {job_id}: {documents:#?}"))
    };
    for (job_id, statement) in [
        (valid, "reference.point_awards"),
        (valid, "core.open_job"),
        (poison, "core.dead_letters"),
    ] {
        let segment = job(job_id);
        assert_eq!(segment["type"], "subsegment");
        assert_eq!(segment["name"], stack.consumer_name.as_str());
        assert_eq!(
            segment["annotations"]["consumer"],
            stack.consumer_name.as_str()
        );
        assert!(
            segment["annotations"]["message_id"].is_string(),
            "{segment}"
        );
        let trace = (
            segment["trace_id"].as_str().unwrap().to_owned(),
            segment["parent_id"].as_str().unwrap().to_owned(),
        );
        assert!(
            invocations.contains(&trace),
            "a job hangs from its invocation's function segment: {trace:?} in {invocations:?}"
        );
        let (start, end) = (
            segment["start_time"].as_f64().unwrap(),
            segment["end_time"].as_f64().unwrap(),
        );
        let statements: Vec<&Value> = documents
            .iter()
            .filter(|d| d["parent_id"] == segment["id"])
            .collect();
        let found = statements
            .iter()
            .find(|s| {
                s["sql"]["sanitized_query"]
                    .as_str()
                    .is_some_and(|q| q.contains(statement))
            })
            .unwrap_or_else(|| {
                panic!("no statement on {statement} under job {job_id}: {statements:#?}")
            });
        assert_eq!(found["namespace"], "remote");
        assert_eq!(found["trace_id"], segment["trace_id"]);
        assert_eq!(found["sql"]["database_type"], "PostgreSQL");
        let (s, e) = (
            found["start_time"].as_f64().unwrap(),
            found["end_time"].as_f64().unwrap(),
        );
        // Within the job, give or take the clock's rounding.
        assert!(
            start - 0.01 <= s && s <= e && e <= end + 0.01,
            "{found} within {segment}"
        );
    }
    let all = serde_json::to_string(&documents).unwrap();
    assert!(
        !all.contains(ACCOUNT),
        "a statement's bound values never reach a segment"
    );
    for statement in documents.iter().filter(|d| d["sql"].is_object()) {
        let sql = statement["sql"]["sanitized_query"].as_str().unwrap();
        assert!(
            !sql.contains(&valid.to_string()) && !sql.contains(&poison.to_string()),
            "the values written into a statement never reach its segment: {sql}"
        );
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_tracing_active_each_job_and_each_of_its_statements_is_a_subsegment_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_job_and_its_statements_are_subsegments_of_its_invocation(
        pool_opts,
        connect,
        CommitMode::PerJob,
    )
    .await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_tracing_active_each_job_and_each_of_its_statements_is_a_subsegment_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_job_and_its_statements_are_subsegments_of_its_invocation(
        pool_opts,
        connect,
        CommitMode::Batch,
    )
    .await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn tracing_is_off_by_default_and_nothing_is_sent(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, daemon) = traced_stack(pool_opts, connect, None, CommitMode::PerJob).await;
    send_two_jobs(&pool, &stack).await;
    assert!(
        !stack.consumer.trace_headers().is_empty(),
        "the invocations were sampled"
    );
    assert_eq!(received(&daemon).await, Vec::<Value>::new());
}
