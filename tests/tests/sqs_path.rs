//! The whole message path against a real SQS API (moto's server, which the test command starts)
//! and the real Lambda binaries: queue → consumer → fence/work → ack, retry with backoff, or
//! dead letter; and the redrive backstop through the DLQ ingester.

use consumer::count_awards;
use e2e::event_source::PollReport;
use e2e::stack::{Stack, StackSpec};
use serde_json::{Value, json};
use shared::dead_letter::letter_for_message;
use shared::ids::{JobId, TenantId};
use shared_testkit::envelope;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(90);

fn job(payload: Value) -> (JobId, String) {
    let job_id = JobId(Uuid::new_v4());
    let tenant_id = TenantId(Uuid::new_v4());
    (job_id, envelope(job_id, tenant_id, "e2e", payload))
}

/// Runs the stack until `job_id` has a letter: the job queue's polls.
async fn until_lettered(stack: &Stack, pool: &PgPool, job_id: JobId) -> Vec<(Instant, PollReport)> {
    let lettered = move || async move { !e2e::letters(pool, job_id).await.is_empty() };
    stack.run_until(SETTLE, lettered).await
}

/// Runs the stack until `job_id`'s award is in: the job queue's polls.
async fn until_awarded(stack: &Stack, pool: &PgPool, job_id: JobId) -> Vec<(Instant, PollReport)> {
    let awarded = move || async move { count_awards(pool, job_id).await.unwrap() == 1 };
    stack.run_until(SETTLE, awarded).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_message_is_processed_once_and_deleted(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    stack.send(&body).await;
    let polls = until_awarded(&stack, &pool, job_id).await;
    assert_eq!(
        polls.iter().map(|(_, p)| p.received).sum::<usize>(),
        1,
        "delivered once: {polls:?}"
    );
    assert!(e2e::fenced(&pool, job_id).await);
    assert_eq!(stack.consumer.metrics().get("Processed"), Some(&1));
}

/// Each record leaves two samples, in milliseconds: how long the harness spent on it, and how
/// old its message was (from `SentTimestamp`) when the invocation took it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_record_leaves_its_duration_and_its_messages_age_in_milliseconds(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    stack.send(&body).await;
    let waited = Duration::from_millis(1_500);
    tokio::time::sleep(waited).await;
    let before = Instant::now();
    until_awarded(&stack, &pool, job_id).await;
    let ceiling = (before.elapsed() + waited).as_secs_f64() * 1000.0 + 1000.0;
    let (unit, ages) = stack.consumer.samples("MessageAge");
    assert_eq!(
        (unit.as_deref(), ages.len()),
        (Some("Milliseconds"), 1),
        "{ages:?}"
    );
    assert!(
        ages[0] >= waited.as_millis() as f64 && ages[0] < ceiling,
        "the message waited {waited:?} in the queue before its poll: {} ms",
        ages[0]
    );
    let (unit, durations) = stack.consumer.samples("JobDuration");
    assert_eq!(
        (unit.as_deref(), durations.len()),
        (Some("Milliseconds"), 1)
    );
    assert!(
        durations[0] > 0.0 && durations[0] < ceiling,
        "{durations:?}"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_duplicate_send_is_acked_as_a_duplicate(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    stack.send(&body).await;
    stack.send(&body).await;
    stack
        .run_until(SETTLE, || async {
            let m = stack.consumer.metrics();
            m.get("Processed").copied().unwrap_or(0)
                + m.get("DuplicateSkipped").copied().unwrap_or(0)
                == 2
        })
        .await;
    assert_eq!(
        count_awards(&pool, job_id).await.unwrap(),
        1,
        "one effect for two sends"
    );
    let m = stack.consumer.metrics();
    assert_eq!((m["Processed"], m["DuplicateSkipped"]), (1, 1));
    assert!(
        e2e::letters(&pool, job_id).await.is_empty(),
        "a duplicate is not an error"
    );
}

/// With the policy at base 1 s: the message reappears after ≥ 1, 2, 4, 8 s (the backoff's
/// lower bounds, set with ChangeMessageVisibility), is counted as attempts 1..5, and the fifth
/// failure writes the dead letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_transient_failure_reappears_after_the_backoff_then_dead_letters_after_the_last_attempt(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) =
        job(json!({"account_id": "a", "points": 5, "demo_fault": "always_transient"}));
    stack.send(&body).await;
    let polls = until_lettered(&stack, &pool, job_id).await;
    let deliveries: Vec<_> = polls.iter().map(|(at, _)| *at).collect();
    assert_eq!(deliveries.len(), 5, "five attempts: {polls:?}");
    for (n, pair) in deliveries.windows(2).enumerate() {
        let floor = Duration::from_secs(1 << n);
        let gap = pair[1] - pair[0];
        assert!(
            gap >= floor,
            "attempt {} came back after {gap:?}, before the backoff's {floor:?}",
            n + 2
        );
    }
    let letters = e2e::letters(&pool, job_id).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].attempts, letters[0].error_kind.as_str()),
        (5, "exhausted")
    );
    assert!(
        letters[0].last_error.contains("attempt 5"),
        "{}",
        letters[0].last_error
    );
    assert_eq!(letters[0].queue, stack.jobs.name);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    let m = stack.consumer.metrics();
    assert_eq!((m["Retried"], m["DeadLetteredExhausted"]), (4, 1));
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_that_fails_twice_then_succeeds_is_processed_once_on_attempt_3(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) =
        job(json!({"account_id": "a", "points": 5, "demo_fault": {"transient_until_attempt": 3}}));
    stack.send(&body).await;
    let polls = until_awarded(&stack, &pool, job_id).await;
    assert_eq!(polls.len(), 3, "{polls:?}");
    assert!(e2e::letters(&pool, job_id).await.is_empty());
    assert_eq!(stack.consumer.metrics()["Retried"], 2);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_poison_message_is_dead_lettered_with_zero_retries(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let message_id = stack.send("{\"this is\": \"not an envelope\"}").await;
    let polls = stack
        .run_until(SETTLE, || async {
            letter_for_message(&pool, &e2e::consumer_name(), &message_id)
                .await
                .unwrap()
                .is_some()
        })
        .await;
    assert_eq!(polls.len(), 1, "delivered once, never retried: {polls:?}");
    let letter = letter_for_message(&pool, &e2e::consumer_name(), &message_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((letter.attempts, letter.error_kind.as_str()), (1, "poison"));
    assert_eq!(letter.payload, json!({"this is": "not an envelope"}));
}

/// The handler kills its own process on every delivery. Each crash leaves the message to come
/// back after the visibility timeout; the delivery past the attempt budget is dead-lettered as
/// `crashed` without running the work again. Executions are charged from the second delivery
/// on (a first delivery runs with its batch-mates, so its crash cannot be attributed): five
/// charged executions after the uncharged first, and a letter saying five.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_consumer_that_crashes_every_time_ends_as_a_crashed_dead_letter(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (job_id, body) =
        job(json!({"account_id": "a", "points": 5, "demo_fault": "crash_before_commit"}));
    stack.send(&body).await;
    let polls = until_lettered(&stack, &pool, job_id).await;
    let crashes = polls
        .iter()
        .filter(|(_, p)| p.invoke_error.is_some())
        .count();
    assert_eq!(crashes, 6, "{polls:?}");
    assert!(
        stack.consumer.starts() >= 7,
        "a new process after every crash"
    );
    let letters = e2e::letters(&pool, job_id).await;
    assert_eq!(
        (
            letters.len(),
            letters[0].attempts,
            letters[0].error_kind.as_str()
        ),
        (1, 5, "crashed")
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    assert!(!e2e::fenced(&pool, job_id).await);
}

/// When the consumer cannot even record its failure (its database is unreachable), the redrive
/// moves the message to the DLQ after `maxReceiveCount` deliveries and the ingester writes the
/// `crashed` letter. A DLQ message delivered twice still yields one letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_message_redriven_to_the_dlq_becomes_one_crashed_dead_letter(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.consumer_cannot_reach_its_database();
    })
    .await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    stack.send(&body).await;
    let polls = until_lettered(&stack, &pool, job_id).await;
    assert!(
        polls.len() >= 7,
        "delivered maxReceiveCount times before the redrive: {polls:?}"
    );
    let found = e2e::letters(&pool, job_id).await;
    assert_eq!(found.len(), 1);
    let letter = &found[0];
    // The consumer never reached its database: no execution ran, and the letter says so.
    assert_eq!(
        (letter.error_kind.as_str(), letter.attempts),
        ("crashed", 0)
    );
    assert!(
        letter.last_error.contains("after 7 deliveries"),
        "{}",
        letter.last_error
    );
    assert_eq!(
        letter.queue, stack.jobs.name,
        "the letter names the job queue, where a replay goes"
    );
    assert_eq!(
        letter.payload,
        serde_json::from_str::<Value>(&body).unwrap()
    );
    assert_eq!(stack.ingester.metrics()["DeadLetteredCrashed"], 1);

    // SQS delivers at least once: the same DLQ record again must not write a second letter.
    let record = json!({"messageId": letter.message_id, "receiptHandle": "r", "body": body,
        "attributes": {"ApproximateReceiveCount": "2"}, "messageAttributes": {},
        "eventSource": "aws:sqs", "eventSourceARN": stack.dlq.arn});
    let response = stack
        .ingester
        .invoke(&json!({"Records": [record]}))
        .await
        .unwrap();
    assert_eq!(response["batchItemFailures"], json!([]));
    assert_eq!(e2e::letters(&pool, job_id).await.len(), 1);
}

/// A batch whose deadline is already too near is handed back whole, without running anything.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn records_not_started_before_the_deadline_are_handed_back(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.consumer_env
            .push(("DEADLINE_MARGIN_MS".into(), "60000".into())); // more than the 20 s timeout
    })
    .await;
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    stack.send(&body).await;
    let (report, _) = stack.poll().await;
    assert_eq!(
        (report.received, report.deleted, report.left),
        (1, 0, 1),
        "{report:?}"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    assert!(!e2e::fenced(&pool, job_id).await);
}

/// A misconfigured function does not start, and says which variable is wrong.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_misconfigured_consumer_stops_at_start_naming_the_variable(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = e2e::log_dir();
    let (_pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.consumer_env
            .push(("FENCE_TTL_SECONDS".into(), "3600".into()));
        spec.log_dir = Some(logs.clone());
    })
    .await;
    let log = e2e::refused_start_log(&stack, &logs).await;
    assert!(
        log.contains("FENCE_TTL_SECONDS: 3600 s is below the safe floor"),
        "{log}"
    );
}

/// A process crash fails the whole batch. Fresh records run before repeat deliveries, so when a
/// crash-looping job comes back in a batch of fresh jobs, they all commit before it runs (and
/// their redeliveries after the crash are acked as duplicates).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fresh_jobs_commit_before_a_crash_looping_batch_mate_runs(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |_| {}).await;
    let (crasher, body) =
        job(json!({"account_id": "a", "points": 5, "demo_fault": "crash_before_commit"}));
    stack.send(&body).await;
    let (first, _) = stack.poll().await;
    assert!(
        first.invoke_error.is_some(),
        "the first delivery crashes: {first:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await; // the crasher is visible again
    // More fresh jobs than the consumer runs at once (its pool has 4 connections).
    let mut fresh = Vec::new();
    for i in 0..9 {
        let (job_id, body) = job(json!({"account_id": format!("b{i}"), "points": 1}));
        stack.send(&body).await;
        fresh.push(job_id);
    }
    let (shared_batch, _) = stack.poll().await;
    assert_eq!(
        shared_batch.received, 10,
        "the crasher and the fresh jobs in one batch: {shared_batch:?}"
    );
    assert!(
        shared_batch.invoke_error.is_some(),
        "the crasher crashed the batch: {shared_batch:?}"
    );
    for job_id in &fresh {
        assert_eq!(
            count_awards(&pool, *job_id).await.unwrap(),
            1,
            "fresh job {job_id} committed before the crash"
        );
    }

    until_lettered(&stack, &pool, crasher).await;
    for job_id in fresh {
        assert_eq!(
            count_awards(&pool, job_id).await.unwrap(),
            1,
            "fresh job {job_id} processed once"
        );
        assert!(
            e2e::letters(&pool, job_id).await.is_empty(),
            "fresh job {job_id} is no collateral"
        );
    }
    assert_eq!(
        e2e::letters(&pool, crasher).await[0].error_kind.as_str(),
        "crashed"
    );
    assert!(
        stack.consumer.metrics()["DuplicateSkipped"] >= 9,
        "redeliveries after the crash are duplicates"
    );
}

/// The consumer under cargo-lambda's emulator (`cargo lambda watch`), the development loop of
/// the toolchain it is built with: that emulator sends `Lambda-Runtime-Deadline-Ms: 600000`, a
/// duration, which read as an epoch time is 56 years past. The consumer used to hand every
/// record back unstarted; it now treats a deadline already past as unknown and does the work.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_deadline_sent_as_a_duration_as_cargo_lambda_does_is_no_deadline(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let stack_spec = StackSpec::time_scaled(
        e2e::test_binaries!(),
        &e2e::test_database_url(&connect),
        &format!("watch-{}", &Uuid::new_v4().simple().to_string()[..12]),
    );
    let mut spec = stack_spec.consumer_function("consumer-under-cargo-lambda");
    spec.deadline_as_duration = true;
    let stack = Stack::start(stack_spec).await;
    spec.timeout = Duration::from_secs(600);
    let host = e2e::lambda_host::LambdaHost::new(spec);
    let (job_id, body) = job(json!({"account_id": "a", "points": 5}));
    let record = json!({"messageId": "m-watch", "receiptHandle": "r", "body": body,
        "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
        "eventSource": "aws:sqs", "eventSourceARN": stack.jobs.arn});
    let response = host.invoke(&json!({"Records": [record]})).await.unwrap();
    assert_eq!(
        response["batchItemFailures"],
        json!([]),
        "done, not handed back"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}
