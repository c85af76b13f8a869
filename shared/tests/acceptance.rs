//! The spec's acceptance criteria owned by the harness, each a named test against real
//! PostgreSQL (a fresh migrated database per test).

use consumer::{AwardPoints, count_awards};
use shared::dead_letter::{ErrorKind, Recorded, letter_for_message, letters_for_job};
use shared::fence::{count_fences, fence_exists};
use shared::harness::{CommitMode, HarnessSettings, RecordOutcome};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

const COPIES: usize = 24;
const ROUNDS: usize = 25;

/// AC1: the same `job_id` processed concurrently produces exactly one effect.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac1_same_job_processed_concurrently_has_exactly_one_effect(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    ac1(connect, CommitMode::PerJob).await;
}

/// AC1 in batch mode: each copy arrives in an SQS batch with a new job of its own, so the copies
/// contend inside batch transactions.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac1_same_job_processed_concurrently_has_exactly_one_effect_in_batch_mode(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    ac1(connect, CommitMode::Batch).await;
}

async fn ac1(connect: PgConnectOptions, mode: CommitMode) {
    // One connection per copy, so every copy runs its own transaction at the same time.
    let pool = own_pool(connect, COPIES as u32).await;
    let harness = Arc::new(harness_in(&pool, award_points(), mode));
    for round in 0..ROUNDS {
        let (job_id, body) = job(award(10));
        let start = Arc::new(Barrier::new(COPIES));
        let copies: Vec<_> = (0..COPIES)
            .map(|_| {
                let (harness, start, msg) = (harness.clone(), start.clone(), message(&body, 1));
                tokio::spawn(async move {
                    start.wait().await;
                    deliver(&harness, &msg).await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for copy in copies {
            outcomes.push(copy.await.unwrap());
        }
        let processed = outcomes
            .iter()
            .filter(|o| **o == RecordOutcome::Processed)
            .count();
        let duplicates = outcomes
            .iter()
            .filter(|o| **o == RecordOutcome::Duplicate)
            .count();
        assert_eq!(
            (processed, duplicates),
            (1, COPIES - 1),
            "round {round}: {outcomes:?}"
        );
        assert_eq!(
            count_awards(&pool, job_id).await.unwrap(),
            1,
            "round {round}: effects"
        );
        assert_eq!(
            count_fences(&pool, job_id).await.unwrap(),
            1,
            "round {round}: fences"
        );
    }
    let metrics = harness.metrics();
    // In batch mode every copy brought a companion job of its own, processed with it.
    let companions = match mode {
        CommitMode::PerJob => 0,
        CommitMode::Batch => ROUNDS * COPIES,
    };
    assert_eq!(
        metrics.get(shared::metrics::Metric::Processed),
        (ROUNDS + companions) as u64
    );
    assert_eq!(
        metrics.get(shared::metrics::Metric::DuplicateSkipped),
        (ROUNDS * (COPIES - 1)) as u64
    );
}

/// AC1, sequential form: a redelivered copy is acked as a duplicate without calling the handler.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac1_a_redelivered_job_is_skipped_as_a_duplicate_without_running(pool: PgPool) {
    let harness = harness(&pool, Counting::new(award_points()));
    let (job_id, body) = job(award(3));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    let again = harness.process(&message(&body, 1)).await;
    assert_eq!(again, RecordOutcome::Duplicate);
    assert!(again.is_ack());
    assert_eq!(harness.consumer().calls(), 1);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

/// AC2, control: without a failure, effect and fence commit together. (The crash and failpoint
/// halves of AC2 are in `tests/tests/ac2_crash.rs`.)
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac2_control_work_and_fence_commit_together(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(award(5));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    assert!(
        fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
}

/// AC3: a transient failure retries with growing intervals, then dead-letters on attempt 5.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac3_transient_failure_retries_with_growing_delays_then_dead_letters_on_attempt_5(
    pool: PgPool,
) {
    let harness = harness(
        &pool,
        Counting::failing(award_points(), Fault::AlwaysTransient),
    );
    let (job_id, body) = job(award(1));
    let msg = message(&body, 1);
    let mut delays = Vec::new();
    for attempt in 1..=4 {
        let delivery = shared::harness::IncomingMessage {
            receive_count: attempt,
            ..msg.clone()
        };
        match harness.process(&delivery).await {
            RecordOutcome::Retry {
                attempt: a, after, ..
            } if a == attempt => delays.push(after),
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
    assert!(
        delays.windows(2).all(|w| w[1] > w[0]),
        "delays grow: {delays:?}"
    );
    assert!(
        delays[0] >= Duration::from_secs(30) && delays[0] < Duration::from_secs(45),
        "{delays:?}"
    );

    let last = shared::harness::IncomingMessage {
        receive_count: 5,
        ..msg.clone()
    };
    let outcome = harness.process(&last).await;
    assert!(
        matches!(
            outcome,
            RecordOutcome::DeadLettered {
                kind: ErrorKind::Exhausted,
                letter: Recorded::New(_),
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(outcome.is_ack());
    let letters = letters_for_job(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(
        (letter.attempts, letter.error_kind.as_str()),
        (5, "exhausted")
    );
    assert!(
        letter.last_error.contains("attempt 5"),
        "{}",
        letter.last_error
    );
    assert_eq!(
        letter.payload,
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        "the full envelope"
    );
    assert_eq!(
        letter.correlation_id.as_deref(),
        Some(format!("corr-{job_id}").as_str())
    );
    assert_eq!(
        (letter.queue.as_str(), letter.status.as_str()),
        (QUEUE, "pending_review")
    );
    assert_eq!(
        count_awards(&pool, job_id).await.unwrap(),
        0,
        "every failed attempt rolled back its work"
    );
    assert!(
        !fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
}

/// AC3, jitter: two jobs failing at the same moment do not come back at the same moment.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac3_jitter_spreads_the_retries_of_different_jobs(pool: PgPool) {
    let harness = harness(
        &pool,
        Counting::failing(award_points(), Fault::AlwaysTransient),
    );
    let mut firsts = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (_, body) = job(award(1));
        match harness.process(&message(&body, 1)).await {
            RecordOutcome::Retry { after, .. } => firsts.insert(after),
            other => panic!("{other:?}"),
        };
    }
    assert!(
        firsts.len() >= 19,
        "20 jobs, {} distinct delays",
        firsts.len()
    );
}

async fn assert_poison_without_retry(pool: &PgPool, body: &str, expect_job: bool, reason: &str) {
    let harness = harness(pool, Counting::new(award_points()));
    let msg = message(body, 1);
    let outcome = harness.process(&msg).await;
    assert!(
        matches!(&outcome, RecordOutcome::DeadLettered { kind: ErrorKind::Poison, error, .. } if error.contains(reason)),
        "{outcome:?}"
    );
    assert!(outcome.is_ack(), "poison is acked: zero retries");
    assert_eq!(harness.consumer().calls(), 0, "the handler is never called");
    let letter = letter_for_message(pool, &reference_name(), &msg.message_id)
        .await
        .unwrap()
        .expect("a letter");
    assert_eq!((letter.attempts, letter.error_kind.as_str()), (1, "poison"));
    assert_eq!(letter.job_id.is_some(), expect_job);
    assert_eq!(
        letter.payload,
        shared::envelope::body_as_json(body),
        "the body is kept in full"
    );
}

/// AC4: a payload that does not match the consumer's schema is dead-lettered at once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac4_schema_invalid_payload_is_dead_lettered_on_the_first_attempt(pool: PgPool) {
    let (_, body) = job(serde_json::json!({"account_id": "a", "points": "ten"}));
    assert_poison_without_retry(&pool, &body, true, "payload does not match").await;
}

/// AC4: a body that is not JSON is dead-lettered at once, kept verbatim.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac4_non_json_body_is_dead_lettered_on_the_first_attempt(pool: PgPool) {
    assert_poison_without_retry(&pool, "<xml>not json</xml>", false, "not JSON").await;
}

/// AC4: an envelope without `job_id` is dead-lettered at once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac4_missing_job_id_is_dead_lettered_on_the_first_attempt(pool: PgPool) {
    let body = serde_json::json!({"tenant_id": uuid::Uuid::new_v4(), "correlation_id": "c", "payload": {}});
    assert_poison_without_retry(&pool, &body.to_string(), false, "job_id").await;
}

/// AC4: a payload the handler finds meaningless is poison too: dead-lettered, not retried.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac4_a_handler_reporting_poison_is_not_retried(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(award(-5));
    let outcome = harness.process(&message(&body, 1)).await;
    assert_eq!(
        outcome.dead_letter_kind(),
        Some(ErrorKind::Poison),
        "{outcome:?}"
    );
    assert!(
        !fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
}

/// AC8 (negative): a successful job writes its fence and its own effect, and nothing else.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac8_a_successful_job_writes_only_its_fence_and_its_effect(pool: PgPool) {
    ac8(pool, CommitMode::PerJob, 1).await;
}

/// AC8 in batch mode: a batch of five new jobs writes their five fences and five effects.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac8_a_successful_job_writes_only_its_fence_and_its_effect_in_batch_mode(pool: PgPool) {
    ac8(pool, CommitMode::Batch, 5).await;
}

async fn ac8(pool: PgPool, mode: CommitMode, jobs: usize) {
    let harness = harness_in(&pool, award_points(), mode);
    let before = table_counts(&pool).await;
    assert!(before.contains_key("core.dead_letters") && before.contains_key("core.processed_jobs"));
    let batch: Vec<_> = (0..jobs).map(|_| message(&job(award(1)).1, 1)).collect();
    let outcomes = harness.process_batch(&batch, &|| true, 10).await;
    assert_eq!(outcomes, vec![Some(RecordOutcome::Processed); jobs]);
    let batches = harness
        .metrics()
        .get(shared::metrics::Metric::BatchCommitted);
    assert_eq!(batches, u64::from(mode == CommitMode::Batch), "{mode:?}");
    let after = table_counts(&pool).await;
    let changed: Vec<_> = after
        .iter()
        .filter(|(table, n)| before.get(*table) != Some(n))
        .map(|(table, n)| (table.as_str(), n - before.get(table).copied().unwrap_or(0)))
        .collect();
    assert_eq!(
        changed,
        [
            ("core.processed_jobs", jobs as i64),
            ("reference.point_awards", jobs as i64)
        ]
    );
}

/// A permanent failure is dead-lettered on its first attempt and nothing of its work remains.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_permanent_failure_is_dead_lettered_at_once(pool: PgPool) {
    let harness = harness(&pool, Counting::failing(award_points(), Fault::Permanent));
    let (job_id, body) = job(award(1));
    let outcome = harness.process(&message(&body, 1)).await;
    assert_eq!(
        outcome.dead_letter_kind(),
        Some(ErrorKind::Permanent),
        "{outcome:?}"
    );
    let letters = letters_for_job(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!((letters.len(), letters[0].attempts), (1, 1));
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
}

/// A message whose letter was written but whose ack was lost comes back: no second letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_redelivered_dead_lettered_message_writes_no_second_letter(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let msg = message("garbage", 1);
    let first = harness.process(&msg).await;
    let again = harness
        .process(&shared::harness::IncomingMessage {
            receive_count: 2,
            ..msg.clone()
        })
        .await;
    match (first, again) {
        (
            RecordOutcome::DeadLettered {
                letter: Recorded::New(a),
                ..
            },
            RecordOutcome::DeadLettered {
                letter: Recorded::AlreadyRecorded(b),
                ..
            },
        ) => assert_eq!(a, b),
        other => panic!("{other:?}"),
    }
}

/// A job whose executions are all charged (each crashed: the ledger holds no error) is
/// dead-lettered as `crashed` on its next delivery, without running the work again. The letter
/// counts executions, not the receives SQS counted.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_delivery_past_the_attempt_budget_is_dead_lettered_as_crashed_without_running(
    pool: PgPool,
) {
    let harness = harness(&pool, Counting::new(award_points()));
    let (job_id, body) = job(award(1));
    charge_executions(&pool, job_id, &reference_name(), 5, None).await;
    let outcome = harness.process(&message(&body, 9)).await;
    assert_eq!(
        outcome.dead_letter_kind(),
        Some(ErrorKind::Crashed),
        "{outcome:?}"
    );
    assert_eq!(harness.consumer().calls(), 0);
    let letters = letters_for_job(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!(letters[0].attempts, 5);
    assert!(
        letters[0].last_error.contains("5 of 5 executions ran"),
        "{}",
        letters[0].last_error
    );
}

/// A job that was processed but whose ack was lost (its batch crashed) keeps coming back; past the
/// budget it is still a duplicate, never a `crashed` letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_processed_job_delivered_past_the_budget_is_still_a_duplicate(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(award(1));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    assert_eq!(
        harness.process(&message(&body, 9)).await,
        RecordOutcome::Duplicate
    );
    assert!(
        letters_for_job(&pool, job_id, &reference_name())
            .await
            .unwrap()
            .is_empty()
    );
}

/// A copy that cannot get the fence within the lock timeout is handed back, not acked; once the
/// holder rolls back, the next delivery does the work.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_copy_blocked_on_a_held_fence_is_handed_back_then_processed(pool: PgPool) {
    let settings = HarnessSettings {
        lock_timeout: Duration::from_millis(200),
        contended_retry_after: Duration::from_secs(2),
        ..settings()
    };
    let (harness, _) = harness_with(&pool, award_points(), settings);
    let (job_id, body) = job(award(1));
    let envelope = shared::envelope::Envelope::<serde_json::Value>::parse(&body).unwrap();

    let holder = hold_fence(&pool, job_id, &reference_name(), envelope.tenant_id, t0()).await;

    let outcome = harness.process(&message(&body, 1)).await;
    assert_eq!(
        outcome,
        RecordOutcome::Contended {
            retry_after: Duration::from_secs(2)
        }
    );
    assert!(!outcome.is_ack());

    holder.rollback().await.unwrap();
    assert_eq!(
        harness.process(&message(&body, 2)).await,
        RecordOutcome::Processed
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

/// The fence expires one TTL after the attempt started, by the injected clock.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_fence_expires_one_ttl_after_the_attempt(pool: PgPool) {
    let settings = HarnessSettings {
        fence_ttl: Duration::from_secs(7 * 86_400),
        ..settings()
    };
    let (harness, clock) = harness_with(&pool, award_points(), settings);
    clock.advance(chrono::Duration::minutes(3));
    let (job_id, body) = job(award(1));
    harness.process(&message(&body, 1)).await;
    let expires = shared::fence::fence_expiry(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!(
        expires,
        Some(t0() + chrono::Duration::minutes(3) + chrono::Duration::days(7))
    );
}

/// With the database unreachable nothing is acked: the message comes back later.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_the_database_unreachable_nothing_is_acked(_: PgPool) {
    let unreachable = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let harness = harness(&unreachable, award_points());
    let (_, body) = job(award(1));
    // A first delivery cannot claim its fence: the job never ran, so it is handed back, charged
    // nothing (issue 34: only the job's own failures are executions).
    let first = harness.process(&message(&body, 1)).await;
    assert!(
        matches!(first, RecordOutcome::HandedBack { .. }),
        "{first:?}"
    );
    // A repeat delivery cannot even read the ledger: it is handed back, charging nothing, after
    // the policy's backoff for its delivery (an outage must not burn the queue's receives).
    let later = harness.process(&message(&body, 5)).await;
    assert!(
        matches!(later, RecordOutcome::HandedBack { retry_after, .. } if retry_after >= Duration::from_secs(8 * 60)),
        "{later:?}"
    );
    assert!(!first.is_ack() && !later.is_ack());
    assert_eq!(
        harness.metrics().get(shared::metrics::Metric::HandedBack),
        2
    );
}

/// The short lock timeout bounds only the wait for the fence: the consumer's own work may wait on
/// its locks as long as it needs (here behind a table lock held longer than the fence timeout).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_fence_lock_timeout_does_not_limit_the_work(pool: PgPool) {
    let settings = HarnessSettings {
        lock_timeout: Duration::from_millis(100),
        ..settings()
    };
    let (harness, _) = harness_with(&pool, award_points(), settings);
    let (job_id, body) = job(award(1));
    let mut blocker = shared::db::begin(&pool).await.unwrap();
    sqlx::query("LOCK TABLE reference.point_awards IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        blocker.commit().await.unwrap();
    });
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    release.await.unwrap();
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}
