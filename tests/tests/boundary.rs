//! Issue 22's hostile bodies, through the real consumer, DLQ ingester and replay binaries,
//! the local SQS API and real PostgreSQL: whatever a producer puts in a message becomes a true
//! record. Each hostile body below failed to be recorded before the fix (the letter insert was
//! refused: an index row too large, a number jsonb cannot hold), so the message came back on
//! every delivery and no row was ever written. Now each one gets exactly one letter, in both
//! commit modes and through the ingester, and its replay sends the body byte for byte as it
//! was received.

use e2e::api_client::{caller, request};
use e2e::stack::{Stack, StackSpec};
use serde_json::json;
use shared::dead_letter::{DeadLetter, letter_for_message};
use shared::harness::CommitMode;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(120);

/// A whole envelope around `payload` with `correlation_id` (raw JSON text, so numbers and
/// strings go through exactly as written).
fn envelope(correlation_id: &str, payload: &str) -> String {
    format!(
        r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":{correlation_id},"payload":{payload}}}"#,
        Uuid::new_v4(),
        Uuid::new_v4()
    )
}

/// Bodies a producer can send that PostgreSQL would refuse somewhere on the way to a letter.
pub fn hostile_bodies() -> Vec<(&'static str, String)> {
    // Random, so that PostgreSQL cannot compress it into an index row.
    let noise = |n: usize| -> String {
        std::iter::repeat_with(|| Uuid::new_v4().simple().to_string())
            .flat_map(|u| u.chars().collect::<Vec<_>>())
            .take(n)
            .collect()
    };
    let long = |n: usize| format!("\"{}\"", noise(n));
    let ok_payload = r#"{"account_id":"a","points":-1}"#;
    vec![
        (
            "a correlation id of 8,000 characters",
            envelope(&long(8_000), ok_payload),
        ),
        (
            "a correlation id of 200 KB starting with a multi-byte character",
            envelope(&format!("\"é{}\"", noise(200_000)), ok_payload),
        ),
        (
            "a number beyond numeric's range",
            envelope(r#""c-big""#, r#"{"account_id":"a","points":1e200000}"#),
        ),
        (
            "a number below numeric's smallest scale",
            envelope(
                r#""c-small""#,
                r#"{"account_id":"a","points":1,"rate":1e-200000}"#,
            ),
        ),
        (
            "an exponent beyond any integer",
            envelope(
                r#""c-exp""#,
                r#"{"account_id":"a","points":1E+99999999999999999999999}"#,
            ),
        ),
        (
            "an integer of 140,000 digits",
            envelope(
                r#""c-digits""#,
                &format!(r#"{{"account_id":"a","points":{}}}"#, "9".repeat(140_000)),
            ),
        ),
        (
            "an unknown key of 8,000 characters",
            envelope(
                r#""c-key""#,
                &format!(r#"{{"account_id":"a","points":1,{}:1}}"#, long(8_000)),
            ),
        ),
        (
            "a JSON string as the whole body",
            r#""just a string""#.to_owned(),
        ),
        (
            "an envelope with its spacing and key order of its own",
            format!(
                "{{ \"payload\" : {{\"points\":1.50E+1 , \"account_id\":\"\\u00e9\"}},\n \"correlation_id\":\"c\", \"tenant_id\":\"{}\", \"job_id\":\"{}\" }}",
                Uuid::new_v4(),
                Uuid::new_v4()
            ),
        ),
    ]
}

async fn setup(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) -> (PgPool, Stack) {
    e2e::stack::start_for_test(
        e2e::test_binaries!(),
        pool_opts,
        connect,
        |spec: &mut StackSpec| {
            spec.consumer_env
                .push(("COMMIT_MODE".into(), mode.as_str().into()));
        },
    )
    .await
}

async fn letter(pool: &PgPool, message_id: &str) -> Option<DeadLetter> {
    letter_for_message(pool, &e2e::consumer_name(), message_id)
        .await
        .expect("reading the letter")
}

/// `letter`'s replay, as an operator with the replay scope asks the API for it.
async fn replay(stack: &Stack, letter: &DeadLetter) -> dead_letter_api::api::ApiResponse {
    stack
        .api
        .call(&request(
            "POST",
            &format!("/v1/core/dead-letters/{}/replay", letter.id),
            Some(caller("ops-1", &[dead_letter_api::api::Scope::Replay])),
        ))
        .await
}

/// The body `letter` keeps: what its replay sends to the job queue, received there; for a
/// letter without a job id (which no replay could deduplicate), the body it stores.
async fn replayed_body(stack: &Stack, letter: &DeadLetter) -> String {
    if letter.job_id.is_none() {
        return letter.body.clone().expect("the body as received");
    }
    let replay = replay(stack, letter).await;
    assert_eq!(replay.status, 200, "{:#}", replay.body);
    let received = e2e::received_jobs(stack).await;
    assert_eq!(received.len(), 1, "the replay's one message");
    let message = &received[0];
    stack
        .sqs
        .delete_message()
        .queue_url(&stack.jobs.url)
        .receipt_handle(message.receipt_handle().unwrap())
        .send()
        .await
        .expect("DeleteMessage");
    message.body().unwrap().to_owned()
}

async fn every_hostile_body_gets_one_letter_that_replays_as_received(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack) = setup(pool_opts, connect, mode).await;
    let mut sent = Vec::new();
    for (what, body) in hostile_bodies() {
        sent.push((what, stack.send(&body).await, body));
    }
    stack
        .run_until(SETTLE, || async {
            let mut all = true;
            for (_, message_id, _) in &sent {
                all &= letter(&pool, message_id).await.is_some();
            }
            all
        })
        .await;
    for (what, message_id, body) in &sent {
        let letter = letter(&pool, message_id).await.unwrap();
        if let Some(correlation_id) = &letter.correlation_id {
            assert!(
                correlation_id.len() <= 256,
                "{what}: kept whole in the payload, cut here"
            );
        }
        assert_eq!(&replayed_body(&stack, &letter).await, body, "{what}");
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn every_hostile_body_gets_one_letter_that_replays_as_received_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    every_hostile_body_gets_one_letter_that_replays_as_received(
        pool_opts,
        connect,
        CommitMode::PerJob,
    )
    .await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn every_hostile_body_gets_one_letter_that_replays_as_received_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    every_hostile_body_gets_one_letter_that_replays_as_received(
        pool_opts,
        connect,
        CommitMode::Batch,
    )
    .await;
}

/// The same bodies redriven to the DLQ: the ingester writes each one's letter (before the fix it
/// reported them failed, and SQS deleted them after the DLQ's retention without a row).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_ingester_records_every_hostile_body(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect, CommitMode::PerJob).await;
    for (i, (what, body)) in hostile_bodies().into_iter().enumerate() {
        let message_id = format!("dlq-{i}");
        let event = json!({"Records": [{"messageId": message_id, "receiptHandle": "r", "body": body,
            "attributes": {"ApproximateReceiveCount": "7", "SentTimestamp": chrono::Utc::now().timestamp_millis().to_string()},
            "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": stack.dlq.arn}]});
        let response = stack.ingester.invoke(&event).await.unwrap();
        assert_eq!(response["batchItemFailures"], json!([]), "{what}");
        let letter = letter(&pool, &message_id)
            .await
            .unwrap_or_else(|| panic!("{what}: no letter"));
        assert_eq!(&replayed_body(&stack, &letter).await, &body, "{what}");
    }
}

/// Issue 22: a committed job's copy reached the ingester after its fence was swept (an
/// ingester failing for a week; the DLQ kept the copy 14 days, the fence lived 7): the fence
/// claim found nothing, the letter said `crashed`, the replay answered `fence_exists: false`
/// and the job was applied a second time. A copy older than its fence can be trusted to live
/// (by its own `SentTimestamp`, which a standard queue's redrive keeps) is now `unsettled`,
/// and no replay sends it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_copy_older_than_its_fence_can_settle_is_never_replayed(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect, CommitMode::PerJob).await;
    let job_id = shared::ids::JobId(Uuid::new_v4());
    let body = json!({"job_id": job_id, "tenant_id": Uuid::new_v4(), "correlation_id": "late",
        "payload": {"account_id": "a", "points": 4}})
    .to_string();
    stack.send(&body).await;
    stack
        .run_until(SETTLE, || async {
            consumer::count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    // Its fence expires and the sweeper removes it, as it would 14 days on.
    sqlx::query(
        "UPDATE core.processed_jobs
         SET processed_at = now() - interval '15 days', expires_at = now() - interval '1 hour'
         WHERE job_id = $1",
    )
    .bind(job_id.0)
    .execute(&pool)
    .await
    .unwrap();
    stack.tick().await.expect("the scheduled run");
    assert!(!e2e::fenced(&pool, job_id).await);
    // A copy of it, sent 15 days ago, reaches the ingester now.
    let sent = chrono::Utc::now() - chrono::Duration::days(15);
    let event = json!({"Records": [{"messageId": "late-copy", "receiptHandle": "r", "body": body,
        "attributes": {"ApproximateReceiveCount": "7", "SentTimestamp": sent.timestamp_millis().to_string()},
        "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": stack.dlq.arn}]});
    let response = stack.ingester.invoke(&event).await.unwrap();
    assert_eq!(response["batchItemFailures"], json!([]));
    let letter = letter(&pool, "late-copy").await.expect("a letter");
    assert_eq!(letter.error_kind, shared::dead_letter::ErrorKind::Unsettled);
    let replay = replay(&stack, &letter).await;
    assert_eq!(replay.status, 409, "{:#}", replay.body);
    assert_eq!(replay.body["error"]["code"], "not_replayable");
    stack.run_until(SETTLE, || async { true }).await;
    assert_eq!(
        consumer::count_awards(&pool, job_id).await.unwrap(),
        1,
        "one award"
    );
}
