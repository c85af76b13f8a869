//! Ordered queues (issue 25) through the real binaries and the local SQS API's FIFO queues: the
//! effects of each message group commit in the order its messages were sent, under transient
//! failures (the rest of the group held back behind the failed message, which its backoff
//! delays), poison (a letter, which blocks nothing) and a consumer that crashes mid-batch, in
//! both commit modes; the DLQ ingester writes a FIFO DLQ's message as a letter that keeps its
//! group; a replay to a FIFO queue carries the letter's group and a deduplication id of its
//! own, so SQS never drops it as a copy of the original send.

use dead_letter_api::api::Scope;
use e2e::api_client::{caller, request, with_body};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::dead_letter::{DeadLetter, ErrorKind, letters_for_job};
use shared::harness::CommitMode;
use shared::ids::{JobId, TenantId};
use shared_testkit::reference::awards_in_order;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(120);

/// A stack on FIFO queues of its own (a job queue and its DLQ), in `mode`, redriving after
/// `max_receive_count` receives.
async fn fifo_stack(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
    max_receive_count: u32,
) -> (PgPool, Stack) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.queue_name = format!("{}.fifo", spec.queue_name);
        spec.max_receive_count = max_receive_count;
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
    })
    .await;
    assert!(stack.jobs.is_fifo() && stack.dlq.is_fifo());
    (pool, stack)
}

/// One job: its id, and its envelope awarding `points` to `account`, with `fault` if any.
fn award(account: &str, points: i64, fault: Option<Value>) -> (JobId, String) {
    let job_id = JobId(Uuid::new_v4());
    let mut payload = json!({"account_id": account, "points": points});
    if let Some(fault) = fault {
        payload["demo_fault"] = fault;
    }
    let envelope = json!({"job_id": job_id, "tenant_id": TenantId(Uuid::new_v4()),
        "correlation_id": "fifo-e2e", "payload": payload});
    (job_id, envelope.to_string())
}

async fn letters(pool: &PgPool, job_id: JobId) -> Vec<DeadLetter> {
    letters_for_job(pool, job_id, &e2e::consumer_name())
        .await
        .unwrap()
}

/// Three groups sent interleaved, one message of each in turn: `a` with a transient failure in
/// the middle (its next messages held back until it succeeds on its third attempt), `b` failing
/// at its head (twice), `c` with a poison message in the middle. Every group's effects commit
/// in the order sent, each once; the poison message is a letter and held nothing back.
async fn order_holds_per_group_under_failures(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack) = fifo_stack(pool_opts, connect, mode, 7).await;
    let transient = |until: u32| Some(json!({"transient_until_attempt": until}));
    let a = [
        award("a", 1, None),
        award("a", 2, transient(3)),
        award("a", 3, None),
        award("a", 4, None),
    ];
    let b = [
        award("b", 1, transient(3)),
        award("b", 2, None),
        award("b", 3, None),
        award("b", 4, None),
    ];
    let c = [
        award("c", 1, None),
        award("c", -2, None), // poison: points must be positive
        award("c", 3, None),
        award("c", 4, None),
    ];
    for i in 0..4 {
        for (group, jobs) in [("a", &a), ("b", &b), ("c", &c)] {
            stack.send_in_group(&jobs[i].1, group).await;
        }
    }
    let poison = c[1].0;
    stack
        .run_until(SETTLE, || async {
            awards_in_order(&pool, "a").await.len() == 4
                && awards_in_order(&pool, "b").await.len() == 4
                && awards_in_order(&pool, "c").await.len() == 3
                && !letters(&pool, poison).await.is_empty()
        })
        .await;
    assert_eq!(awards_in_order(&pool, "a").await, [1, 2, 3, 4]);
    assert_eq!(awards_in_order(&pool, "b").await, [1, 2, 3, 4]);
    assert_eq!(awards_in_order(&pool, "c").await, [1, 3, 4]);
    let letter = &letters(&pool, poison).await[0];
    assert_eq!(
        (letter.error_kind, letter.message_group.as_deref()),
        (ErrorKind::Poison, Some("c"))
    );
    for (job_id, _) in a.iter().chain(&b) {
        assert!(
            letters(&pool, *job_id).await.is_empty(),
            "no letter in a or b"
        );
    }
    let m = stack.consumer.metrics();
    assert!(
        m.get("HandedBack").copied().unwrap_or(0) > 0,
        "later messages of a failed group were held back: {m:?}"
    );
    assert_eq!(
        m.get("Retried").copied(),
        Some(4),
        "a2 twice, b1 twice: {m:?}"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_order_holds_per_group_under_failures_and_poison(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    order_holds_per_group_under_failures(pool_opts, connect, CommitMode::PerJob).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_order_holds_per_group_under_failures_and_poison_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    order_holds_per_group_under_failures(pool_opts, connect, CommitMode::Batch).await;
}

/// A job that kills its consumer's process before every commit: each crash brings its whole
/// batch back. The crash is charged to it (the other group, which never ran it, commits first),
/// it becomes a letter once its attempts are spent, and its group goes on behind it in order.
async fn a_crashing_job_is_charged_alone(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack) = fifo_stack(pool_opts, connect, mode, 7).await;
    let crasher = award("a", 1, Some(json!("crash_before_commit")));
    let a = [crasher.clone(), award("a", 2, None), award("a", 3, None)];
    let b = [
        award("b", 1, None),
        award("b", 2, None),
        award("b", 3, None),
    ];
    for i in 0..3 {
        stack.send_in_group(&a[i].1, "a").await;
        stack.send_in_group(&b[i].1, "b").await;
    }
    stack
        .run_until(SETTLE, || async {
            awards_in_order(&pool, "a").await.len() == 2
                && awards_in_order(&pool, "b").await.len() == 3
                && !letters(&pool, crasher.0).await.is_empty()
        })
        .await;
    assert_eq!(awards_in_order(&pool, "a").await, [2, 3]);
    assert_eq!(awards_in_order(&pool, "b").await, [1, 2, 3]);
    let letter = &letters(&pool, crasher.0).await[0];
    assert_eq!(letter.message_group.as_deref(), Some("a"), "{letter:?}");
    assert!(
        !e2e::fenced(&pool, crasher.0).await,
        "the crashed job never committed"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_crashing_job_is_charged_alone_and_its_group_goes_on_in_order(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_crashing_job_is_charged_alone(pool_opts, connect, CommitMode::PerJob).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_crashing_job_is_charged_alone_and_its_group_goes_on_in_order_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_crashing_job_is_charged_alone(pool_opts, connect, CommitMode::Batch).await;
}

/// The backstop on a FIFO queue: a message the harness never saw finish (its consumer cannot
/// reach its database) is redriven to the FIFO DLQ after 7 receives, and the ingester writes it
/// as a `crashed` letter that keeps its group.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_the_ingester_writes_a_fifo_dlqs_message_as_a_letter_with_its_group(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.queue_name = format!("{}.fifo", spec.queue_name);
        // One record a batch: nothing is held back, so 7 receives redrive it (as the template's
        // FIFO default does for ten records a batch at 70).
        spec.batch_size = 1;
        spec.consumer_cannot_reach_its_database();
    })
    .await;
    let (job_id, body) = award("m", 1, None);
    stack.send_in_group(&body, "member-9").await;
    stack
        .run_until(SETTLE, || async {
            !letters(&pool, job_id).await.is_empty()
        })
        .await;
    let letter = &letters(&pool, job_id).await[0];
    assert_eq!(
        (letter.error_kind, letter.message_group.as_deref()),
        (ErrorKind::Crashed, Some("member-9")),
        "{letter:?}"
    );
    assert_eq!(
        letter.queue, stack.jobs.name,
        "a replay goes to the job queue"
    );
}

/// A replay to a FIFO queue, minutes inside SQS's deduplication interval of the original send
/// (whose deduplication id is its body's digest): sent with the letter's group and the letter's
/// id as its deduplication id, it is delivered (here it fails again, a new letter linked to the
/// first, in the same group), where a replay of the same body without an id of its own would
/// have been dropped by SQS as a copy.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_replay_carries_its_group_and_is_not_dropped_as_a_copy_of_the_original(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = fifo_stack(pool_opts, connect, CommitMode::PerJob, 7).await;
    let (job_id, body) = award("m", 1, Some(json!("permanent")));
    stack.send_in_group(&body, "member-7").await;
    stack
        .run_until(SETTLE, || async {
            !letters(&pool, job_id).await.is_empty()
        })
        .await;
    let first = letters(&pool, job_id).await.remove(0);
    assert_eq!(first.message_group.as_deref(), Some("member-7"));
    let replay = with_body(
        request(
            "POST",
            &format!("/v1/core/dead-letters/{}/replay", first.id),
            Some(caller("ops-1", &[Scope::Replay])),
        ),
        r#"{"reason": "FIFO replay test"}"#,
    );
    let response = stack.api.call(&replay).await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    stack
        .run_until(SETTLE, || async { letters(&pool, job_id).await.len() == 2 })
        .await;
    let again = letters(&pool, job_id).await.remove(1);
    assert_eq!(
        (again.replay_of, again.message_group.as_deref()),
        (Some(first.id), Some("member-7")),
        "the replay was delivered, in the letter's group: {again:?}"
    );
    assert!(
        !e2e::fenced(&pool, job_id).await,
        "a permanent failure never commits"
    );
}

/// Issue 34, item 3: a group [A, B, C] whose first two jobs fail transiently until their
/// attempts run out (a partner outage), C healthy. Every receive of A and then of B receives C
/// too, held back unrun; with the redrive at the attempts + 2, C was redriven to the DLQ after
/// 0 executions (a `crashed` letter for a job that never ran). At the FIFO redrive (the batch
/// size times that) A and B are letters after their 5 executions each, and C commits, in order.
async fn a_record_held_back_behind_failing_jobs_runs(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack) = fifo_stack(pool_opts, connect, mode, 7).await;
    let outage = || Some(json!("always_transient"));
    let (a, b, c) = (
        award("g", 1, outage()),
        award("g", 2, outage()),
        award("g", 3, None),
    );
    for job in [&a, &b, &c] {
        stack.send_in_group(&job.1, "g").await;
    }
    stack
        .run_until(SETTLE, || async {
            awards_in_order(&pool, "g").await.len() == 1 || !letters(&pool, c.0).await.is_empty()
        })
        .await;
    assert!(
        letters(&pool, c.0).await.is_empty(),
        "{:?}",
        letters(&pool, c.0).await
    );
    assert_eq!(awards_in_order(&pool, "g").await, [3], "C ran");
    for failed in [&a, &b] {
        let kinds: Vec<(ErrorKind, i32)> = letters(&pool, failed.0)
            .await
            .iter()
            .map(|l| (l.error_kind, l.attempts))
            .collect();
        assert_eq!(kinds, [(ErrorKind::Exhausted, 5)], "{mode:?}");
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_record_held_back_behind_failing_jobs_runs_and_is_never_redriven(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_record_held_back_behind_failing_jobs_runs(pool_opts, connect, CommitMode::PerJob).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_record_held_back_behind_failing_jobs_runs_and_is_never_redriven_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_record_held_back_behind_failing_jobs_runs(pool_opts, connect, CommitMode::Batch).await;
}
