//! Issue 13 through the real function binaries, the local SQS API and real PostgreSQL: the
//! holes whose cause is in the wiring (the DLQ ingester, the replay, batches of the consumer).
//! The library-level tests of the same issue are `shared/tests/true_records.rs`.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use consumer::count_awards;
use dead_letter_api::api::Scope;
use e2e::api_client::{caller, request, seed_letter_for};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::dead_letter::ErrorKind;
use shared::ids::{JobId, TenantId};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(120);

fn job(payload: Value) -> (JobId, Value) {
    let job_id = JobId(Uuid::new_v4());
    let body = json!({"job_id": job_id, "tenant_id": TenantId(Uuid::new_v4()),
        "correlation_id": "true-records", "payload": payload});
    (job_id, body)
}

/// One DLQ record for `body`, as the SQS event source delivers it to the ingester.
fn dlq_event(stack: &Stack, message_id: &str, body: &str) -> Value {
    json!({"Records": [{"messageId": message_id, "receiptHandle": "r", "body": body,
        "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
        "eventSource": "aws:sqs", "eventSourceARN": stack.dlq.arn}]})
}

/// The whole story of a letter for a committed job. A job commits; its message still reaches
/// the DLQ (its batch kept failing after the commit). The ingester settles through the fence
/// and writes no letter. Then the case a letter and an effect do meet (a letter an older
/// version wrote for it): the fence, aged past its TTL, is kept by the sweep while that letter
/// is pending, and the replay sends nothing. Before the fix the ingester wrote the letter, the
/// sweep removed the fence, and the replay awarded the points a second time.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_committed_job_redriven_swept_and_replayed_is_still_one_award(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 9}));
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;

    // Redriven after its commit: into the DLQ, through the DLQ event source to the ingester.
    stack
        .sqs
        .send_message()
        .queue_url(&stack.dlq.url)
        .message_body(body.to_string())
        .send()
        .await
        .unwrap();
    stack.run_until(SETTLE, || async { true }).await;
    assert!(
        e2e::letters(&pool, job_id).await.is_empty(),
        "no letter for a committed job"
    );
    assert_eq!(stack.ingester.metrics()["RedrivenAlreadyProcessed"], 1);

    // A letter that does meet the effect, pending review; the fence ages past its TTL.
    let letter = seed_letter_for(&pool, &stack.jobs.name, ErrorKind::Crashed, &body).await;
    sqlx::query("UPDATE core.processed_jobs SET processed_at = now() - interval '9 days', expires_at = now() - interval '2 days' WHERE job_id = $1")
        .bind(job_id.0)
        .execute(&pool)
        .await
        .unwrap();
    let tick = stack.tick().await.unwrap();
    assert_eq!(tick["sweep"]["deleted"], 0, "{tick:#}");
    assert!(e2e::fenced(&pool, job_id).await, "kept for the letter");

    let replay = stack
        .api
        .call(&request(
            "POST",
            &format!("/v1/core/dead-letters/{letter}/replay"),
            Some(caller("ops-3am", &[Scope::Replay])),
        ))
        .await;
    assert_eq!(replay.status, 200, "{:#}", replay.body);
    assert_eq!(replay.body["replay"]["sent"], false, "{:#}", replay.body);
    assert_eq!(replay.body["letter"]["replay_outcome"], "already_processed");
    stack.run_until(SETTLE, || async { true }).await;
    assert_eq!(
        count_awards(&pool, job_id).await.unwrap(),
        1,
        "still one award"
    );

    // Reviewed, the letter no longer holds the fence: the next sweep removes it.
    let tick = stack.tick().await.unwrap();
    assert_eq!(tick["sweep"]["deleted"], 1, "{tick:#}");
}

/// A crash-looping job first in a fresh batch of ten. Receives are not executions, and
/// its batch-mates, which never crashed anything, run before it on every redelivery: each is
/// applied once and none becomes a letter. Before the fix 6 to 8 of them ended as `crashed`
/// letters after the redeliveries that the crasher caused.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_crasher_first_in_a_fresh_batch_of_ten_costs_its_batch_mates_nothing(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (crasher, crash_body) =
        job(json!({"account_id": "c", "points": 1, "demo_fault": "crash_before_commit"}));
    let mut mates = Vec::new();
    let mut entries = vec![crash_body];
    for i in 0..9 {
        let (job_id, body) = job(json!({"account_id": format!("m{i}"), "points": 1}));
        mates.push(job_id);
        entries.push(body);
    }
    let batch = entries
        .iter()
        .enumerate()
        .map(|(i, body)| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body.to_string())
                .build()
                .unwrap()
        })
        .collect::<Vec<_>>();
    stack
        .sqs
        .send_message_batch()
        .queue_url(&stack.jobs.url)
        .set_entries(Some(batch))
        .send()
        .await
        .unwrap();
    let (first, _) = stack.poll().await;
    assert_eq!(first.received, 10, "one fresh batch: {first:?}");
    assert!(
        first.invoke_error.is_some(),
        "the crasher crashed it: {first:?}"
    );
    stack
        .run_until(SETTLE, || async {
            !e2e::letters(&pool, crasher).await.is_empty()
        })
        .await;
    for job_id in &mates {
        assert_eq!(
            count_awards(&pool, *job_id).await.unwrap(),
            1,
            "{job_id} applied once"
        );
        assert!(
            e2e::letters(&pool, *job_id).await.is_empty(),
            "{job_id} is no collateral"
        );
    }
    let letter = &e2e::letters(&pool, crasher).await[0];
    assert_eq!(
        (letter.error_kind.as_str(), letter.attempts),
        ("crashed", 5)
    );
    assert_eq!(count_awards(&pool, crasher).await.unwrap(), 0);
}

/// A DLQ body that is no envelope was labelled `crashed`; it is poison (one attempt),
/// and a body whose envelope is whole is `crashed` with the executions the ledger counted.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_ingester_labels_a_body_that_is_no_envelope_poison(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, _) = job(json!({}));
    let no_payload = json!({"job_id": job_id, "tenant_id": Uuid::new_v4(), "correlation_id": "x"});
    for (message_id, body) in [
        ("m-garbage", "not an envelope at all".to_owned()),
        ("m-half", no_payload.to_string()),
    ] {
        let response = stack
            .ingester
            .invoke(&dlq_event(&stack, message_id, &body))
            .await
            .unwrap();
        assert_eq!(response["batchItemFailures"], json!([]));
    }
    let kinds: Vec<(String, i32)> =
        sqlx::query_as("SELECT error_kind, attempts FROM core.dead_letters ORDER BY message_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(kinds, [("poison".to_owned(), 1), ("poison".to_owned(), 1)]);
    assert_eq!(
        e2e::letters(&pool, job_id).await.len(),
        1,
        "the half envelope keeps its job id"
    );
}

/// A replay sends a body equal to the one received as JSON, every number exact. Before
/// the fix the stored payload had gone through f64 and the replay sent rounded numbers.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_sends_the_body_as_received_number_for_number(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let job_id = JobId(Uuid::new_v4());
    // Points beyond i64 make the job poison; its letter must still keep them exactly.
    let body = format!(
        r#"{{"job_id":"{job_id}","tenant_id":"{}","correlation_id":"exact","payload":{{"account_id":"a","points":123456789012345678901234567890,"rate":0.1000000000000000055511151231257827}}}}"#,
        Uuid::new_v4()
    );
    stack.send(&body).await;
    stack
        .run_until(SETTLE, || async {
            !e2e::letters(&pool, job_id).await.is_empty()
        })
        .await;
    let letter = &e2e::letters(&pool, job_id).await[0];
    let replay = stack
        .api
        .call(&request(
            "POST",
            &format!("/v1/core/dead-letters/{}/replay", letter.id),
            Some(caller("ops-1", &[Scope::Replay])),
        ))
        .await;
    assert_eq!(replay.status, 200, "{:#}", replay.body);
    let received = e2e::received_jobs(&stack).await;
    let sent = received[0].body.as_deref().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(sent).unwrap(),
        serde_json::from_str::<Value>(&body).unwrap()
    );
    for number in [
        "123456789012345678901234567890",
        "0.1000000000000000055511151231257827",
    ] {
        assert!(sent.contains(number), "{number} in {sent}");
    }
}

/// A redrive `maxReceiveCount` that does not exceed the attempts passed the consumer's
/// start-up checks (only the ingester looked). The consumer now stops, naming the variable.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_consumer_whose_redrive_count_does_not_exceed_its_attempts_stops_at_start(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = e2e::log_dir();
    let (_pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.max_receive_count = 5;
        spec.log_dir = Some(logs.clone());
    })
    .await;
    let log = e2e::refused_start_log(&stack, &logs).await;
    assert!(
        log.contains("REDRIVE_MAX_RECEIVE_COUNT: 5 must exceed"),
        "{log}"
    );
}
