//! Attacks on the OpenTelemetry tracing path (issue 37) and on the letters that keep their trace
//! context, by a reviewer who did not write them. Each test is one attack; a test that fails is a
//! hole (see the report that came with this file), one that passes is an attack that held.
//!
//! Most run the real binaries on a traced local stack (as `tests/traces.rs` does) and invoke the
//! consumer or the ingester directly with hand-made SQS records, so a record can carry exactly
//! what a hostile producer (or SQS) would put in it. The replay attacks run the API's replay
//! function and the bulk worker in process, against the local SQS API, and read what was sent.

use e2e::event_source::{Queue, sqs_client};
use e2e::operations_kit::{Apis, operator, queue, tools, work_all};
use e2e::otlp_receiver::{OtlpReceiver, Received};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::harness::CommitMode;
use shared::ids::{JobId, TenantId};
use shared_testkit::envelope;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(50);
/// OTLP's span kinds.
const CLIENT: i32 = 3;
/// What SQS takes in one message: its body and each attribute's name, type and value.
const SQS_MAX_MESSAGE_BYTES: usize = 256 * 1024;

// ---------------------------------------------------------------------------------------------
// Kit
// ---------------------------------------------------------------------------------------------

/// A stack whose functions export their spans to `endpoint` (an OTLP base URL), in `mode`.
async fn traced_stack_to(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    endpoint: &str,
    mode: CommitMode,
    tweak: impl FnOnce(&mut e2e::stack::StackSpec),
) -> (PgPool, Stack) {
    let url = endpoint.to_owned();
    e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.function_env = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), url.clone()),
            ("TRACING".into(), "Active".into()),
        ];
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
        tweak(spec);
    })
    .await
}

/// A traced stack and the receiver its spans go to.
async fn traced_stack(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
    tweak: impl FnOnce(&mut e2e::stack::StackSpec),
) -> (PgPool, Stack, OtlpReceiver) {
    let receiver = OtlpReceiver::start().await;
    let (pool, stack) = traced_stack_to(pool_opts, connect, &receiver.url, mode, tweak).await;
    (pool, stack, receiver)
}

/// A fresh W3C traceparent of a producer's span: (header, (trace id, span id)).
fn producer_trace() -> (String, (String, String)) {
    let trace = Uuid::new_v4().simple().to_string();
    let span = Uuid::new_v4().simple().to_string()[..16].to_owned();
    (format!("00-{trace}-{span}-01"), (trace, span))
}

/// A `messageAttributes` entry as Lambda's SQS event source writes it.
fn string_attribute(value: &str) -> Value {
    json!({"stringValue": value, "stringListValues": [], "binaryListValues": [], "dataType": "String"})
}

/// An SQS record as Lambda's event source delivers it, for `arn`'s queue. Its receipt handle
/// is made up: a visibility change on it fails, as on a handle SQS no longer knows.
fn record(
    arn: &str,
    message_id: &str,
    body: &str,
    receive_count: u32,
    system: Value,
    attributes: Value,
) -> Value {
    let mut system_attributes = json!({
        "ApproximateReceiveCount": receive_count.to_string(),
        "SentTimestamp": chrono::Utc::now().timestamp_millis().to_string(),
        "ApproximateFirstReceiveTimestamp": chrono::Utc::now().timestamp_millis().to_string(),
        "SenderId": "AIDAEXAMPLE",
    });
    for (k, v) in system.as_object().into_iter().flatten() {
        system_attributes[k] = v.clone();
    }
    json!({
        "messageId": message_id, "receiptHandle": format!("rh-{}", Uuid::new_v4()), "body": body,
        "attributes": system_attributes, "messageAttributes": attributes, "md5OfBody": "",
        "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": "us-east-1",
    })
}

/// A record carrying `traceparent` (a W3C trace context of its producer).
fn traced_record(arn: &str, message_id: &str, body: &str, traceparent: &str) -> Value {
    record(
        arn,
        message_id,
        body,
        1,
        json!({}),
        json!({"traceparent": string_attribute(traceparent)}),
    )
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The spans received once `wanted` holds of them, or after `wait` (for the assertions to say
/// why); then another half second, for anything exported late (a second span of a delivery).
async fn spans_when(
    receiver: &OtlpReceiver,
    wait: Duration,
    wanted: impl Fn(&[Received]) -> bool,
) -> Vec<Received> {
    let until = tokio::time::Instant::now() + wait;
    loop {
        let spans = receiver.spans();
        if wanted(&spans) || tokio::time::Instant::now() > until {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return receiver.spans();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `job` spans of the delivery `message_id` (by the messaging attribute or the record
/// span's own `message_id` field), of any function.
fn delivery_spans<'a>(spans: &'a [Received], message_id: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| {
            s.name == "job"
                && (s.attr("messaging.message.id") == Some(message_id)
                    || s.attr("message_id") == Some(message_id))
        })
        .collect()
}

/// A one-line view of a span, for assertion messages.
fn brief(s: &Received) -> String {
    format!(
        "{}:{} id={} parent={} outcome={:?} links={:?}",
        s.service,
        s.name,
        s.span_id,
        s.parent_span_id,
        s.attr("outcome"),
        s.links
    )
}

/// Waits until the consumer's process asks for its next invocation after `asked` asks; returns
/// how long that took (the flush after the response).
async fn time_to_next(stack: &Stack, asked: u32) -> Duration {
    let started = Instant::now();
    let until = started + Duration::from_secs(15);
    while stack.consumer.nexts() <= asked.max(1) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    started.elapsed()
}

/// A message attribute: (name, type, value).
type Attribute = (String, String, String);
/// A message as received: its body and its attributes.
type Message = (String, Vec<Attribute>);

/// Every message on `queue`, received and deleted.
async fn drain(sqs: &aws_sdk_sqs::Client, queue: &Queue) -> Vec<Message> {
    let mut out = Vec::new();
    let mut empty = 0;
    while empty < 3 {
        let got = sqs
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .wait_time_seconds(0)
            .message_attribute_names("All")
            .send()
            .await
            .expect("ReceiveMessage");
        let messages = got.messages.unwrap_or_default();
        if messages.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        for m in messages {
            let attributes = m
                .message_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.data_type, v.string_value.unwrap_or_default()))
                .collect();
            out.push((m.body.clone().unwrap_or_default(), attributes));
            sqs.delete_message()
                .queue_url(&queue.url)
                .receipt_handle(m.receipt_handle.unwrap_or_default())
                .send()
                .await
                .expect("DeleteMessage");
        }
    }
    out
}

/// The bytes SQS counts for a message: its body and each attribute's name, type and value.
fn sqs_size(body: &str, attributes: &[Attribute]) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(k, t, v)| k.len() + t.len() + v.len())
            .sum::<usize>()
}

fn attribute<'a>(attributes: &'a [Attribute], name: &str) -> Option<&'a str> {
    attributes
        .iter()
        .find(|(k, _, _)| k == name)
        .map(|(_, _, v)| v.as_str())
}

/// A pending letter of an exhausted job on `queue`, whose body is `body` (an envelope), with
/// `trace` as the trace context it kept: its id.
async fn seed_letter(
    pool: &PgPool,
    queue: &str,
    job: JobId,
    body: &str,
    trace: Option<&str>,
) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, created_at, trace_parent)
         VALUES ($1, '00000000-0000-0000-0000-000000000001', 'award-points', $2,
                 'm-' || gen_random_uuid(), $3::jsonb, $3, 5, 'exhausted', 'ledger timed out',
                 now(), $4)
         RETURNING id",
    )
    .bind(job.0)
    .bind(queue)
    .bind(body)
    .bind(trace)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An envelope of `job` whose JSON is exactly `len` bytes (padded in a payload field).
fn envelope_of_len(job: JobId, len: usize) -> String {
    let tenant = TenantId(Uuid::parse_str("00000000-0000-0000-0000-000000000001").unwrap());
    let base = envelope(
        job,
        tenant,
        "c-big",
        json!({"account_id": "a", "points": 1, "note": ""}),
    );
    let body = envelope(
        job,
        tenant,
        "c-big",
        json!({"account_id": "a", "points": 1, "note": "x".repeat(len - base.len())}),
    );
    assert_eq!(body.len(), len);
    body
}

/// Three letters on a queue of their own, one per case a replay's trace meets: none kept, one
/// kept, and one kept whose body fits SQS with the `replay_of` attribute but not with the trace
/// too: the queue, and each letter with the trace it kept.
async fn three_letters(
    pool: &PgPool,
    sqs: &aws_sdk_sqs::Client,
) -> (Queue, Vec<(Uuid, Option<String>)>) {
    let q = queue(sqs).await;
    let (traced, _) = producer_trace();
    let (near_trace, _) = producer_trace();
    let small = |job| {
        envelope(
            job,
            TenantId(Uuid::new_v4()),
            "c-replay",
            json!({"account_id": "a", "points": 3}),
        )
    };
    let (a, b, c) = (
        JobId(Uuid::new_v4()),
        JobId(Uuid::new_v4()),
        JobId(Uuid::new_v4()),
    );
    // Fits with replay_of (9 + 6 + 36 = 51 bytes), not with the trace as well (+ 72).
    let near = envelope_of_len(c, SQS_MAX_MESSAGE_BYTES - 60);
    let letters = vec![
        (seed_letter(pool, &q.name, a, &small(a), None).await, None),
        (
            seed_letter(pool, &q.name, b, &small(b), Some(&traced)).await,
            Some(traced),
        ),
        (
            seed_letter(pool, &q.name, c, &near, Some(&near_trace)).await,
            Some(near_trace),
        ),
    ];
    (q, letters)
}

/// What each replay sent says: its letter's id in `replay_of`, the trace only where it fits,
/// and SQS's size limit kept.
fn check_replays(sent: &[Message], letters: &[(Uuid, Option<String>)], route: &str) {
    assert_eq!(sent.len(), letters.len(), "{route}: one message per replay");
    let mut problems = Vec::new();
    for (body, attributes) in sent {
        let size = sqs_size(body, attributes);
        if size > SQS_MAX_MESSAGE_BYTES {
            problems.push(format!(
                "a replay of {size} bytes (body {}, attributes {attributes:?}) is past SQS's limit",
                body.len()
            ));
        }
        let Some(of) = attribute(attributes, "replay_of") else {
            problems.push(format!(
                "a replay (body {} bytes) went without its replay_of attribute: attributes {attributes:?}",
                body.len()
            ));
            continue;
        };
        let Some((_, trace)) = letters.iter().find(|(id, _)| id.to_string() == of) else {
            problems.push(format!("replay_of {of} names no letter"));
            continue;
        };
        let near_limit = body.len() > SQS_MAX_MESSAGE_BYTES - 100;
        let expected = if near_limit { None } else { trace.as_deref() };
        if attribute(attributes, "traceparent") != expected {
            problems.push(format!(
                "the replay of {of} carried traceparent {:?}, expected {expected:?}",
                attribute(attributes, "traceparent")
            ));
        }
    }
    assert!(problems.is_empty(), "{route}:\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 3. Replays: the trace a letter kept, and SQS's size limit
// ---------------------------------------------------------------------------------------------

/// Attack: replay, one letter at a time through the API's replay route, a letter without a
/// trace, one with a trace, and one whose body is within 123 bytes of SQS's limit with a trace.
/// Each replay must carry `replay_of` (so a replay that fails again is linked to its letter),
/// the trace where it fits, and never exceed SQS's limit.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_one_letter_replay_carries_replay_of_beside_its_trace(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let (q, letters) = three_letters(&pool, &sqs).await;
    for (letter, _) in &letters {
        let answer = apis
            .call(e2e::api_client::request(
                "POST",
                &format!("/v1/core/dead-letters/{letter}/replay"),
                Some(operator()),
            ))
            .await;
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        assert_eq!(answer.body["replay"]["sent"], true, "{:#}", answer.body);
    }
    let sent = drain(&sqs, &q).await;
    check_replays(&sent, &letters, "POST /v1/core/dead-letters/{id}/replay");
}

/// Attack: the same three letters replayed by a bulk replay operation (`SendMessageBatch`).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_bulk_replay_carries_replay_of_beside_its_trace(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let (q, letters) = three_letters(&pool, &sqs).await;
    let id = apis.start("replay", json!({"queue": q.name})).await;
    work_all(&tools(&pool, &sqs)).await;
    let done = apis.operation(id).await;
    assert_eq!(done["status"], "done", "{done:#}");
    assert_eq!(done["progress"]["sent"], 3, "{done:#}");
    let sent = drain(&sqs, &q).await;
    check_replays(&sent, &letters, "bulk replay operation");
}

/// Attack: a letter with a trace whose replay cannot be sent (its queue is gone) is withdrawn;
/// the letter written back to review must keep the trace (the migration's trigger).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_withdrawn_replay_writes_back_a_letter_that_keeps_the_trace(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let job = JobId(Uuid::new_v4());
    let (trace, _) = producer_trace();
    let body = envelope(
        job,
        TenantId(Uuid::new_v4()),
        "c-w",
        json!({"account_id": "a", "points": 1}),
    );
    let letter = seed_letter(&pool, "a-queue-since-deleted", job, &body, Some(&trace)).await;
    let queued = apis
        .call(e2e::api_client::request(
            "POST",
            &format!("/v1/core/dead-letters/{letter}/replay"),
            Some(operator()),
        ))
        .await;
    assert_eq!(queued.status, 202, "{:#}", queued.body);
    let withdrawn = apis
        .post(
            &format!("/v1/core/dead-letters/{letter}/withdraw"),
            operator(),
            &json!({"reason": "queue deleted"}).to_string(),
        )
        .await;
    assert_eq!(withdrawn.status, 200, "{:#}", withdrawn.body);
    let pending = withdrawn.body["pending_letter"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept: Option<String> =
        sqlx::query_scalar("SELECT trace_parent FROM core.dead_letters WHERE id = $1::uuid")
            .bind(&pending)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(kept.as_deref(), Some(trace.as_str()));
}

// ---------------------------------------------------------------------------------------------
// 1. Identity: one span per delivery, each with its outcome
// ---------------------------------------------------------------------------------------------

/// Attack: a batch holding a job, another job, a copy of the first (same body, its own message
/// and producer trace) and poison; then a later batch with another copy of the first job (a
/// duplicate of a processed job) and a different payload under the first job's id (a conflict
/// letter). Every delivery must be exactly one `job` span with its outcome, linked to its own
/// producer's trace.
async fn each_delivery_is_one_job_span_with_an_outcome(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, mode, |_| {}).await;
    let arn = stack.jobs.arn.clone();
    let tenant = TenantId(Uuid::new_v4());
    let (a, b) = (JobId(Uuid::new_v4()), JobId(Uuid::new_v4()));
    let body_a = envelope(a, tenant, "c-a", json!({"account_id": "acct", "points": 1}));
    let body_b = envelope(b, tenant, "c-b", json!({"account_id": "acct", "points": 2}));
    let poison = envelope(
        JobId(Uuid::new_v4()),
        tenant,
        "c-p",
        json!({"account_id": "acct", "points": "two"}),
    );
    let other_a = envelope(
        a,
        tenant,
        "c-a",
        json!({"account_id": "acct", "points": 99}),
    );
    // (message id, body, expected outcome)
    let first: Vec<(String, &str, &str)> = vec![
        ("m-a1".into(), &body_a, "processed"),
        ("m-b".into(), &body_b, "processed"),
        ("m-a2-copy".into(), &body_a, "duplicate"),
        ("m-poison".into(), &poison, "dead_lettered"),
    ];
    let second: Vec<(String, &str, &str)> = vec![
        ("m-a3-duplicate".into(), &body_a, "duplicate"),
        ("m-a-conflict".into(), &other_a, "dead_lettered"),
    ];
    let mut producers = Vec::new();
    for batch in [&first, &second] {
        let records: Vec<Value> = batch
            .iter()
            .map(|(id, body, _)| {
                let (header, producer) = producer_trace();
                producers.push((id.clone(), producer));
                traced_record(&arn, id, body, &header)
            })
            .collect();
        let answer = stack
            .consumer
            .invoke(&json!({"Records": records}))
            .await
            .expect("invoked");
        assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        2
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        2,
        "each job once"
    );
    // The letters keep their message's trace: the poison one (batch mode writes it beside its
    // batch's others) and the conflict one.
    for id in ["m-poison", "m-a-conflict"] {
        let kept: Option<String> =
            sqlx::query_scalar("SELECT trace_parent FROM core.dead_letters WHERE message_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let (_, (trace, span)) = producers.iter().find(|(m, _)| m == id).unwrap();
        assert_eq!(kept, Some(format!("00-{trace}-{span}-01")), "{id}");
    }
    let all: Vec<&(String, &str, &str)> = first.iter().chain(&second).collect();
    let spans = spans_when(&receiver, Duration::from_secs(8), |spans| {
        all.iter()
            .all(|(id, _, _)| delivery_spans(spans, id).len() == 1)
    })
    .await;
    let mut problems = Vec::new();
    for (id, _, outcome) in &all {
        let found = delivery_spans(&spans, id);
        let producer = &producers.iter().find(|(m, _)| m == id).unwrap().1;
        match found.as_slice() {
            [one] => {
                if one.attr("outcome") != Some(outcome) {
                    problems.push(format!(
                        "{id}: outcome {:?}, expected {outcome}",
                        one.attr("outcome")
                    ));
                }
                if !one.links.contains(producer) {
                    problems.push(format!("{id}: not linked to its producer {producer:?}"));
                }
            }
            spans => problems.push(format!(
                "{id} (expected {outcome}): {} job spans, expected 1: {:?}",
                spans.len(),
                spans.iter().map(|s| brief(s)).collect::<Vec<_>>()
            )),
        }
    }
    for s in spans.iter().filter(|s| s.name == "job") {
        if s.attr("outcome").is_none() {
            problems.push(format!("a job span without an outcome: {}", brief(s)));
        }
    }
    assert!(problems.is_empty(), "{mode:?}:\n{}", problems.join("\n"));
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_delivery_is_one_job_span_with_an_outcome_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_delivery_is_one_job_span_with_an_outcome(pool_opts, connect, CommitMode::PerJob).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_delivery_is_one_job_span_with_an_outcome_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_delivery_is_one_job_span_with_an_outcome(pool_opts, connect, CommitMode::Batch).await
}

/// Attack: a job that fails transiently, whose visibility change then fails (its receipt handle
/// is one SQS no longer knows: the message came back to another receive meanwhile). The
/// delivery must still be one `job` span, with its outcome `retry`.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failed_visibility_change_is_not_a_second_job_span(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_pool, stack, receiver) =
        traced_stack(pool_opts, connect, CommitMode::PerJob, |_| {}).await;
    let job = JobId(Uuid::new_v4());
    let body = envelope(
        job,
        TenantId(Uuid::new_v4()),
        "c-vis",
        json!({"account_id": "acct", "points": 1, "demo_fault": "always_transient"}),
    );
    let (header, _) = producer_trace();
    let id = "m-visibility";
    let answer = stack
        .consumer
        .invoke(&json!({"Records": [traced_record(&stack.jobs.arn, id, &body, &header)]}))
        .await
        .expect("invoked");
    assert_eq!(
        answer["batchItemFailures"][0]["itemIdentifier"], id,
        "{answer}"
    );
    let spans = spans_when(&receiver, Duration::from_secs(8), |spans| {
        !delivery_spans(spans, id).is_empty()
    })
    .await;
    let found = delivery_spans(&spans, id);
    assert_eq!(found.len(), 1, "one delivery, one job span: {:#?}", found);
    assert_eq!(found[0].attr("outcome"), Some("retry"), "{:#?}", found[0]);
}

/// Attack: a record handed back unstarted (the deadline is too near to start it). Its `job`
/// span is exported; it must say what became of the record (an outcome), as every other does.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_record_handed_back_unstarted_has_an_outcome_on_its_span(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // A 4 s function timeout with the stack's 4 s deadline margin: no record may start.
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, CommitMode::PerJob, |spec| {
        spec.consumer_timeout = Duration::from_secs(4);
    })
    .await;
    let body = envelope(
        JobId(Uuid::new_v4()),
        TenantId(Uuid::new_v4()),
        "c-late",
        json!({"account_id": "acct", "points": 1}),
    );
    let (header, _) = producer_trace();
    let id = "m-unstarted";
    let answer = stack
        .consumer
        .invoke(&json!({"Records": [traced_record(&stack.jobs.arn, id, &body, &header)]}))
        .await
        .expect("invoked");
    assert_eq!(
        answer["batchItemFailures"][0]["itemIdentifier"], id,
        "{answer}"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        0
    );
    let spans = spans_when(&receiver, Duration::from_secs(8), |spans| {
        !delivery_spans(spans, id).is_empty()
    })
    .await;
    let found = delivery_spans(&spans, id);
    assert!(!found.is_empty(), "the unstarted record's span: {spans:#?}");
    for span in found {
        assert!(
            span.attr("outcome").is_some(),
            "a job span without an outcome: {span:#?}"
        );
    }
}

/// Attack: the DLQ ingester writes a backstop letter. Its `job` span (it gives each record one,
/// with the messaging attributes) must say its outcome, as the consumer's do.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_ingesters_job_span_says_its_outcome(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) =
        traced_stack(pool_opts, connect, CommitMode::PerJob, |_| {}).await;
    let body = envelope(
        JobId(Uuid::new_v4()),
        TenantId(Uuid::new_v4()),
        "c-dlq",
        json!({"account_id": "acct", "points": 1}),
    );
    let (header, producer) = producer_trace();
    let id = "m-redriven";
    let mut dlq_record = record(
        &stack.dlq.arn,
        id,
        &body,
        7,
        json!({}),
        json!({"traceparent": string_attribute(&header)}),
    );
    dlq_record["attributes"]["SentTimestamp"] =
        json!((chrono::Utc::now().timestamp_millis() - 60_000).to_string());
    let answer = stack
        .ingester
        .invoke(&json!({"Records": [dlq_record]}))
        .await
        .expect("invoked");
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        1
    );
    let kept: Option<String> = sqlx::query_scalar("SELECT trace_parent FROM core.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        kept.as_deref(),
        Some(header.as_str()),
        "the letter keeps its trace"
    );
    let spans = spans_when(&receiver, Duration::from_secs(8), |spans| {
        !delivery_spans(spans, id).is_empty()
    })
    .await;
    let found = delivery_spans(&spans, id);
    assert_eq!(found.len(), 1, "{spans:#?}");
    assert!(found[0].links.contains(&producer), "{:#?}", found[0]);
    assert!(
        found[0].attr("outcome").is_some(),
        "the ingester's job span says nothing of what became of the record: {:#?}",
        found[0]
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Hostile trace headers
// ---------------------------------------------------------------------------------------------

/// The hostile headers, each on a poison message (lettered) and a valid one (processed).
fn hostile_cases() -> Vec<(&'static str, Value, Value)> {
    let valid_trace = "0af7651916cd43dd8448eb211c80319c";
    let valid_span = "b7ad6b7169203331";
    let s = |v: &str| json!({"traceparent": string_attribute(v)});
    vec![
        (
            "long",
            json!({}),
            s(&format!(
                "00-{valid_trace}-{valid_span}-01{}",
                "-ab".repeat(20_000)
            )),
        ),
        (
            "version ff",
            json!({}),
            s(&format!("ff-{valid_trace}-{valid_span}-01")),
        ),
        (
            "non-ASCII",
            json!({}),
            s(&format!("00-{}é-{valid_span}-01", &valid_trace[..30])),
        ),
        (
            "fullwidth digits",
            json!({}),
            s(&format!("00-{valid_trace}-{}１-01", &valid_span[..15])),
        ),
        (
            "zero trace",
            json!({}),
            s(&format!("00-{}-{valid_span}-01", "0".repeat(32))),
        ),
        (
            "NUL",
            json!({}),
            s(&format!("00-{valid_trace}-{valid_span}-0\u{0}")),
        ),
        (
            "binary",
            json!({}),
            json!({"traceparent": {"binaryValue": "AAEC", "stringListValues": [], "binaryListValues": [], "dataType": "Binary"}}),
        ),
        (
            "number",
            json!({}),
            json!({"traceparent": {"stringValue": "42", "stringListValues": [], "binaryListValues": [], "dataType": "Number"}}),
        ),
        (
            "xray malformed root",
            json!({"AWSTraceHeader": "Root=1-zzzzzzzz-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"}),
            json!({}),
        ),
        (
            "xray non-ASCII",
            json!({"AWSTraceHeader": "Root=1-5759e988-bd862e3fe1be46a99427279é;Parent=53995c3f42cd8ad8;Sampled=1"}),
            json!({}),
        ),
        (
            "xray long",
            json!({"AWSTraceHeader": format!("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1;{}", "x".repeat(10_000))}),
            json!({}),
        ),
        (
            "xray no parent",
            json!({"AWSTraceHeader": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"}),
            json!({}),
        ),
        (
            "xray zero parent",
            json!({"AWSTraceHeader": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000;Sampled=1"}),
            json!({}),
        ),
    ]
}

/// Runs `cases` (name, system attributes, message attributes) each on a poison message and a
/// valid job, in one batch per case; returns the problems found: a letter not written (or with
/// a trace), a job not processed, a crash, a link.
async fn run_header_cases(
    pool: &PgPool,
    stack: &Stack,
    receiver: &OtlpReceiver,
    cases: &[(&'static str, Value, Value)],
) -> Vec<String> {
    let tenant = TenantId(Uuid::new_v4());
    let mut problems = Vec::new();
    let mut ids: Vec<(&'static str, String)> = Vec::new();
    for (n, (name, system, attributes)) in cases.iter().enumerate() {
        let valid = envelope(
            JobId(Uuid::new_v4()),
            tenant,
            "c-hostile",
            json!({"account_id": "acct", "points": n + 1}),
        );
        let poison = envelope(
            JobId(Uuid::new_v4()),
            tenant,
            "c-hostile",
            json!({"account_id": "acct", "points": "many"}),
        );
        let (v, p) = (format!("m-valid-{n}"), format!("m-poison-{n}"));
        let records = json!({"Records": [
            record(&stack.jobs.arn, &v, &valid, 1, system.clone(), attributes.clone()),
            record(&stack.jobs.arn, &p, &poison, 1, system.clone(), attributes.clone()),
        ]});
        match stack.consumer.invoke(&records).await {
            Ok(answer) if answer["batchItemFailures"] == json!([]) => {}
            other => problems.push(format!("{name}: the invocation answered {other:?}")),
        }
        ids.push((name, v));
        ids.push((name, p));
    }
    if stack.consumer.starts() != 1 {
        problems.push(format!(
            "the consumer restarted: {} starts",
            stack.consumer.starts()
        ));
    }
    let spans = spans_when(receiver, Duration::from_secs(8), |spans| {
        ids.iter()
            .all(|(_, id)| !delivery_spans(spans, id).is_empty())
    })
    .await;
    for (name, id) in &ids {
        if id.starts_with("m-poison") {
            let kept: Vec<Option<String>> = sqlx::query_scalar(
                "SELECT trace_parent FROM core.dead_letters WHERE message_id = $1",
            )
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
            match kept.as_slice() {
                [None] => {}
                [Some(t)] => problems.push(format!("{name}: the letter kept a trace {t:?}")),
                other => problems.push(format!("{name}: {} letters for {id}", other.len())),
            }
        }
        let found = delivery_spans(&spans, id);
        match found.as_slice() {
            [one] if !one.links.is_empty() => {
                problems.push(format!("{name}: {id} linked {:?}", one.links))
            }
            [_] => {}
            other => problems.push(format!("{name}: {} job spans for {id}", other.len())),
        }
    }
    let processed = count(pool, "SELECT count(*) FROM core.processed_jobs").await;
    if processed != cases.len() as i64 {
        problems.push(format!("{processed} jobs processed of {}", cases.len()));
    }
    problems
}

/// Attack: trace headers a hostile or broken producer writes (very long, version ff, non-ASCII,
/// zero ids, a NUL, a Binary or Number `traceparent`, malformed X-Ray headers in SQS's
/// `AWSTraceHeader`). None may make a letter unwritable, crash the consumer, or be linked; each
/// job is processed or lettered as it would be untraced.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn hostile_trace_headers_are_never_linked_kept_or_fatal(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, CommitMode::Batch, |_| {}).await;
    let problems = run_header_cases(&pool, &stack, &receiver, &hostile_cases()).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Attack: a `traceparent` that W3C Trace Context says is not one (uppercase hex: the spec's
/// ids are `HEXDIGLC`, lowercase only; whitespace around it, tabs included), which a vendor
/// must ignore. It must not be linked, nor kept on the letter as if the producer had sent it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_traceparent_w3c_refuses_is_not_linked_or_kept(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) =
        traced_stack(pool_opts, connect, CommitMode::PerJob, |_| {}).await;
    let s = |v: &str| json!({"traceparent": string_attribute(v)});
    let cases = vec![
        (
            "uppercase",
            json!({}),
            s("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"),
        ),
        (
            "whitespace",
            json!({}),
            s(" \t00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n "),
        ),
    ];
    let problems = run_header_cases(&pool, &stack, &receiver, &cases).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Attack, through the real queue: `AWSTraceHeader` set by the sender as a system attribute
/// (moto takes any string there), malformed, on a poison message. The letter is written without
/// a trace; the job behind it is processed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_malformed_aws_trace_header_sent_through_sqs_is_harmless(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use aws_sdk_sqs::types::{MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
    let (pool, stack, _receiver) =
        traced_stack(pool_opts, connect, CommitMode::PerJob, |_| {}).await;
    let tenant = TenantId(Uuid::new_v4());
    for (n, header) in [
        "Root=1-5759e988-bd862e3fe1be46a99427279Z;Parent=53995c3f42cd8ad8;Sampled=1",
        "Root=;Parent=;Sampled=",
        "ÿÿÿ;;;===;Root=1-é",
    ]
    .into_iter()
    .enumerate()
    {
        for body in [
            envelope(
                JobId(Uuid::new_v4()),
                tenant,
                "c-x",
                json!({"account_id": "acct", "points": n + 1}),
            ),
            envelope(
                JobId(Uuid::new_v4()),
                tenant,
                "c-x",
                json!({"account_id": "acct", "points": "n"}),
            ),
        ] {
            let system = MessageSystemAttributeValue::builder()
                .data_type("String")
                .string_value(header)
                .build()
                .unwrap();
            stack
                .sqs
                .send_message()
                .queue_url(&stack.jobs.url)
                .message_body(body)
                .message_system_attributes(
                    MessageSystemAttributeNameForSends::AwsTraceHeader,
                    system,
                )
                .send()
                .await
                .expect("SendMessage with AWSTraceHeader");
        }
    }
    stack
        .run_until(SETTLE, || async {
            count(&pool, "SELECT count(*) FROM core.processed_jobs").await == 3
                && count(&pool, "SELECT count(*) FROM core.dead_letters").await == 3
        })
        .await;
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters WHERE trace_parent IS NOT NULL"
        )
        .await,
        0
    );
    assert_eq!(stack.consumer.starts(), 1);
}

// ---------------------------------------------------------------------------------------------
// 4. The collector down, slow, or failing slowly
// ---------------------------------------------------------------------------------------------

/// A collector that takes connections and answers each request as `answer` says for its
/// number (0-based): `Some((delay, status))` answers `status` after `delay`, `None` never
/// answers (holds the connection for a minute). Each answer closes its connection.
async fn odd_collector(
    answer: impl Fn(usize) -> Option<(Duration, u16)> + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (counted, answer) = (counted.clone(), answer.clone());
            tokio::spawn(async move {
                // Read the whole request (headers, then Content-Length bytes of body).
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let Ok(n) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        break;
                    }
                }
                let n = counted.fetch_add(1, Ordering::SeqCst);
                match answer(n) {
                    Some((delay, status)) => {
                        tokio::time::sleep(delay).await;
                        let reply = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        );
                        let _ = stream.write_all(reply.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    (url, requests)
}

/// A base URL where nothing listens.
fn dead_collector() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// Runs `jobs` invocations of one new job each and a poison one against a stack exporting to
/// `endpoint`; checks every job is processed once and the poison lettered once; returns how
/// long each invocation's flush held the process after its response.
async fn invocations_against(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    endpoint: &str,
    jobs: usize,
) -> Vec<Duration> {
    let (pool, stack) =
        traced_stack_to(pool_opts, connect, endpoint, CommitMode::PerJob, |_| {}).await;
    let tenant = TenantId(Uuid::new_v4());
    let mut held = Vec::new();
    for n in 0..=jobs {
        let points = if n == jobs {
            json!("lots")
        } else {
            json!(n + 1)
        };
        let body = envelope(
            JobId(Uuid::new_v4()),
            tenant,
            "c-collector",
            json!({"account_id": "acct", "points": points}),
        );
        let (header, _) = producer_trace();
        let asked = stack.consumer.nexts();
        let answer = stack
            .consumer
            .invoke(&json!({"Records": [traced_record(&stack.jobs.arn, &format!("m-{n}"), &body, &header)]}))
            .await
            .expect("invoked");
        assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
        held.push(time_to_next(&stack, asked).await);
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        jobs as i64
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        jobs as i64,
        "no double effect"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        1,
        "no lost letter"
    );
    assert_eq!(stack.consumer.starts(), 1);
    held
}

/// The export's timeout (`EXPORT_TIMEOUT` in `shared/src/telemetry/otel.rs`): "How long an
/// export may take before it is dropped: an invocation waits for it."
const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// What the measurement allows on top (a process's own scheduling, a cold start's first span).
const SLACK: Duration = Duration::from_millis(500);

/// Attack: the collector is down (nothing listens). Jobs go on, each once; each invocation is
/// held after its response for at most the export timeout.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_the_collector_down_jobs_go_on_and_an_invocation_waits_at_most_the_export_timeout(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let held = invocations_against(pool_opts, connect, &dead_collector(), 3).await;
    eprintln!("collector down: each invocation held after its response for {held:?}");
    assert!(
        held.iter().all(|h| *h <= EXPORT_TIMEOUT + SLACK),
        "held {held:?}"
    );
}

/// Attack: the collector takes the request and answers after 5 s. Jobs go on, each once; each
/// invocation is held for the export timeout, not the collector's 5 s.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_a_slow_collector_an_invocation_waits_at_most_the_export_timeout(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (url, requests) = odd_collector(|_| Some((Duration::from_secs(5), 200))).await;
    let held = invocations_against(pool_opts, connect, &url, 2).await;
    eprintln!(
        "collector answering after 5 s: held {held:?}, {} export requests",
        requests.load(Ordering::SeqCst)
    );
    assert!(
        held.iter().all(|h| *h <= EXPORT_TIMEOUT + SLACK),
        "held {held:?}"
    );
}

/// Attack: a collector under load, which answers 503 (retry later, as OTLP/HTTP allows) after
/// 1.5 s, and then does not answer the retry. The export timeout is meant to bound what an
/// invocation waits for its spans; the exporter's own retries must not stretch it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_collector_failing_slowly_holds_an_invocation_no_longer_than_the_export_timeout(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (url, requests) =
        odd_collector(|n| (n % 2 == 0).then_some((Duration::from_millis(1_500), 503))).await;
    let held = invocations_against(pool_opts, connect, &url, 2).await;
    eprintln!(
        "collector answering 503 after 1.5 s, then silent: held {held:?}, {} export requests",
        requests.load(Ordering::SeqCst)
    );
    assert!(
        held.iter().all(|h| *h <= EXPORT_TIMEOUT + SLACK),
        "an invocation was held {held:?} after its response, the export timeout being {EXPORT_TIMEOUT:?} ({} export requests for {} invocations)",
        requests.load(Ordering::SeqCst),
        held.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 5. FIFO in batch mode, traced
// ---------------------------------------------------------------------------------------------

/// Attack: a FIFO queue in batch mode with tracing on: three message groups, one with poison in
/// the middle. Order holds per group; each job is one `processed`
/// span (commit groups among them); no `job` span is without an outcome.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_batch_mode_traced_keeps_order_and_one_processed_span_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use shared_testkit::reference::awards_in_order;
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, CommitMode::Batch, |spec| {
        spec.queue_name = format!("{}.fifo", spec.queue_name);
        spec.max_receive_count = 7;
    })
    .await;
    assert!(stack.jobs.is_fifo());
    let tenant = TenantId(Uuid::new_v4());
    let job = |account: &str, points: Value, fault: Option<Value>| {
        let id = JobId(Uuid::new_v4());
        let mut payload = json!({"account_id": account, "points": points});
        if let Some(fault) = fault {
            payload["demo_fault"] = fault;
        }
        (id, envelope(id, tenant, "c-fifo", payload))
    };
    // No transient failure: one in a commit group rolls the whole group back (its jobs then go
    // one by one, as without batch mode), and the group would show nothing.
    let groups = [
        (
            "a",
            vec![
                job("fa", json!(1), None),
                job("fa", json!(2), None),
                job("fa", json!(3), None),
            ],
        ),
        (
            "b",
            vec![
                job("fb", json!(1), None),
                job("fb", json!(2), None),
                job("fb", json!(3), None),
            ],
        ),
        (
            "c",
            vec![
                job("fc", json!(1), None),
                job("fc", json!("x"), None),
                job("fc", json!(3), None),
            ],
        ),
    ];
    for i in 0..3 {
        for (group, jobs) in &groups {
            let (header, _) = producer_trace();
            stack
                .sqs
                .send_message()
                .queue_url(&stack.jobs.url)
                .message_body(&jobs[i].1)
                .message_group_id(*group)
                .message_attributes(
                    "traceparent",
                    aws_sdk_sqs::types::MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(header)
                        .build()
                        .unwrap(),
                )
                .send()
                .await
                .expect("SendMessage");
        }
    }
    stack
        .run_until(SETTLE, || async {
            awards_in_order(&pool, "fa").await.len() == 3
                && awards_in_order(&pool, "fb").await.len() == 3
                && awards_in_order(&pool, "fc").await.len() == 2
                && count(&pool, "SELECT count(*) FROM core.dead_letters").await == 1
        })
        .await;
    assert_eq!(awards_in_order(&pool, "fa").await, [1, 2, 3]);
    assert_eq!(awards_in_order(&pool, "fb").await, [1, 2, 3]);
    assert_eq!(awards_in_order(&pool, "fc").await, [1, 3]);
    let valid: Vec<JobId> = groups
        .iter()
        .flat_map(|(_, jobs)| jobs.iter())
        .filter(|(_, body)| !body.contains("\"x\""))
        .map(|(id, _)| *id)
        .collect();
    let processed_spans = |spans: &[Received], job: JobId| {
        spans
            .iter()
            .filter(|s| {
                s.name == "job"
                    && s.attr("job_id") == Some(&*job.to_string())
                    && s.attr("outcome") == Some("processed")
            })
            .count()
    };
    let spans = spans_when(&receiver, Duration::from_secs(8), |spans| {
        valid.iter().all(|j| processed_spans(spans, *j) == 1)
    })
    .await;
    let mut problems = Vec::new();
    for j in &valid {
        let n = processed_spans(&spans, *j);
        if n != 1 {
            problems.push(format!("job {j}: {n} processed spans"));
        }
    }
    for s in spans
        .iter()
        .filter(|s| s.name == "job" && s.service == "consumer")
    {
        if s.attr("outcome").is_none() {
            problems.push(format!("a job span without an outcome: {}", brief(s)));
        }
    }
    let grouped = spans
        .iter()
        .filter(|s| s.name == "job" && s.attr("outcome") == Some("processed"))
        .filter(|s| {
            spans
                .iter()
                .any(|p| p.span_id == s.parent_span_id && p.name == "commit group")
        })
        .count();
    if grouped < 2 {
        problems.push(format!("{grouped} jobs committed in a commit group"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 6. Statement spans: never a literal
// ---------------------------------------------------------------------------------------------

/// Attack: statements whose string literals are written the ways PostgreSQL allows besides
/// plain quotes, or sit after a comment holding an apostrophe: a consumer's own SQL (built with
/// `format!`, a `-- the operator's note`), or the platform's (`shared/src/paging/escalations.rs`
/// has `-- The steps' rows …`). Run in process through the very layers a traced function
/// installs (`otel::layers`), in a record's `job` span. No statement span may carry a literal.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn statement_spans_never_carry_a_string_literal(pool: PgPool) {
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;
    let receiver = OtlpReceiver::start().await;
    let tracer = shared::telemetry::otel::tracer(&format!("{}/v1/traces", receiver.url))
        .expect("the only tracer of this test process");
    // The global default, as `telemetry::install` makes it in a function: `StatementSpans`
    // looks its parent's context up through the default dispatcher from inside the event's own
    // dispatch, which only the global one answers (a scoped one answers `none` there).
    let subscriber = tracing_subscriber::registry().with(shared::telemetry::otel::layers(tracer));
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    let statements = [
        "SELECT 'plain-literal-0' AS zero, 1 AS one, 2 AS two",
        "SELECT 1 AS one -- the operator's note\n , 'literal-after-a-comment-1' AS a, 2 AS two",
        "SELECT /* it's here */ 'literal-after-a-block-comment-2' AS b, 1 AS one, 2 AS two",
        "SELECT $$dollar-quoted-literal-3$$ AS c, 1 AS one, 2 AS two",
        "SELECT $tag$tagged-dollar-literal-4$tag$ AS d, 1 AS one, 2 AS two",
        "SELECT E'escaped-literal-5\\'s' AS e, 1 AS one, 2 AS two",
    ];
    let run = {
        let pool = pool.clone();
        async move {
            let span = tracing::error_span!(target: shared::telemetry::RECORD_SPAN_TARGET, "job");
            async {
                for sql in statements {
                    sqlx::query(sql).execute(&pool).await.expect(sql);
                }
            }
            .instrument(span)
            .await;
        }
    };
    run.await;
    tokio::task::spawn_blocking(shared::telemetry::otel::flush)
        .await
        .unwrap();
    let spans = spans_when(&receiver, Duration::from_secs(5), |spans| {
        spans.iter().filter(|s| s.kind == CLIENT).count() >= statements.len()
    })
    .await;
    let texts: Vec<String> = spans
        .iter()
        .filter(|s| s.kind == CLIENT)
        .filter_map(|s| s.attr("db.query.text").map(str::to_owned))
        .collect();
    assert!(texts.len() >= statements.len(), "{spans:#?}");
    let leaks: Vec<&String> = texts.iter().filter(|t| t.contains("literal-")).collect();
    assert!(
        leaks.is_empty(),
        "statement spans carrying a literal:\n{}",
        leaks
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
