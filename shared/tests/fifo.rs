//! FIFO batches (issue 25): within a message group, records run in delivery order and a record
//! that is not done holds back every later record of its group in the batch, unprocessed and
//! uncharged; a letter (poison) blocks nothing; other groups go on. In both commit modes: batch
//! mode's commit group sees its jobs in delivery order, and its fallback stops a group at its
//! first failure. (Through the real binaries and the local SQS API: `tests/tests/fifo.rs`.)

use consumer::AwardPoints;
use serde_json::json;
use shared::dead_letter::ErrorKind;
use shared::harness::{CommitMode, IncomingMessage, RecordOutcome};
use shared::ids::JobId;
use shared_testkit::reference::{awards_in_order, reference_name, refuse_account_boom};
use shared_testkit::*;
use sqlx::PgPool;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A first delivery of `body` in the FIFO group `group`.
fn in_group(group: &str, body: &str) -> IncomingMessage {
    IncomingMessage {
        message_group: Some(group.into()),
        ..message_on("jobs.fifo", body, 1)
    }
}

/// An award of `points` to `account`, in `group`.
fn award_in(group: &str, account: &str, points: i64) -> (JobId, IncomingMessage) {
    let (job_id, body) = job(json!({"account_id": account, "points": points}));
    (job_id, in_group(group, &body))
}

async fn a_failure_holds_back_the_rest_of_its_group_only(pool: PgPool, mode: CommitMode) {
    refuse_account_boom(&pool).await;
    let harness = harness_in(&pool, AwardPoints::new(reference_name()), mode);
    let (a1, a2, a3, a4) = (
        award_in("a", "acct-a", 1),
        award_in("a", "boom", 2),
        award_in("a", "acct-a", 3),
        award_in("a", "acct-a", 4),
    );
    let (b1, b2, b3) = (
        award_in("b", "acct-b", 1),
        award_in("b", "acct-b", 2),
        award_in("b", "acct-b", 3),
    );
    let (c1, c2) = (in_group("c", "not an envelope"), award_in("c", "acct-c", 1));
    let batch = [
        a1.1.clone(),
        b1.1.clone(),
        a2.1.clone(),
        c1.clone(),
        b2.1.clone(),
        a3.1.clone(),
        c2.1.clone(),
        b3.1.clone(),
        a4.1.clone(),
    ];
    let outcomes = run_batch(&harness, &batch).await;
    let shown = format!("{outcomes:#?}");
    assert_eq!(outcomes[0], RecordOutcome::Processed, "{shown}");
    assert!(
        matches!(outcomes[2], RecordOutcome::Retry { attempt: 1, .. }),
        "{shown}"
    );
    assert_eq!(
        (&outcomes[5], &outcomes[8]),
        (&RecordOutcome::HeldBack, &RecordOutcome::HeldBack),
        "every later record of the failed one's group is held back: {shown}"
    );
    assert_eq!(
        outcomes[3].dead_letter_kind(),
        Some(ErrorKind::Poison),
        "a poison record is a letter, and blocks nothing behind it: {shown}"
    );
    for i in [1, 4, 6, 7] {
        assert_eq!(outcomes[i], RecordOutcome::Processed, "record {i}: {shown}");
    }
    // Held back: never run, never charged.
    for (job_id, _) in [&a3, &a4] {
        assert_eq!(
            executions(&pool, *job_id, &reference_name()).await,
            0,
            "uncharged"
        );
        assert!(!fence_committed(&pool, *job_id, &reference_name()).await);
    }
    assert_eq!(executions(&pool, a2.0, &reference_name()).await, 1);
    assert_eq!(awards_in_order(&pool, "acct-a").await, vec![1]);
    assert_eq!(awards_in_order(&pool, "acct-b").await, vec![1, 2, 3]);
    assert_eq!(awards_in_order(&pool, "acct-c").await, vec![1]);

    // The group comes back whole (SQS redelivers it in order): once its head succeeds, the
    // rest follow in order; the job that committed before is a duplicate.
    sqlx::raw_sql("DROP TRIGGER refuse_boom ON reference.point_awards")
        .execute(&pool)
        .await
        .unwrap();
    let again: Vec<IncomingMessage> = [&a2, &a3, &a4]
        .iter()
        .map(|(_, m)| IncomingMessage {
            receive_count: 2,
            ..m.clone()
        })
        .collect();
    let outcomes = run_batch(&harness, &again).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed; 3]);
    assert_eq!(awards_in_order(&pool, "acct-a").await, vec![1, 3, 4]);
    assert_eq!(awards_in_order(&pool, "boom").await, vec![2]);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_failure_holds_back_the_rest_of_its_group_and_only_its_group(pool: PgPool) {
    a_failure_holds_back_the_rest_of_its_group_only(pool, CommitMode::PerJob).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_failure_holds_back_the_rest_of_its_group_and_only_its_group_in_batch_mode(
    pool: PgPool,
) {
    a_failure_holds_back_the_rest_of_its_group_only(pool, CommitMode::Batch).await;
}

/// Batch mode: a FIFO batch's new jobs commit together, the work seeing them in delivery
/// order (the effect table's ids follow it), whatever their job ids.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_batch_commits_its_jobs_in_delivery_order(pool: PgPool) {
    let harness = harness_in(&pool, AwardPoints::new(reference_name()), CommitMode::Batch);
    let batch: Vec<IncomingMessage> = (1..=10)
        .map(|points| award_in(&format!("g{}", points % 3), "acct", points).1)
        .collect();
    let outcomes = run_batch(&harness, &batch).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed; 10]);
    assert_eq!(
        awards_in_order(&pool, "acct").await,
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        harness
            .metrics()
            .get(shared::metrics::Metric::BatchCommitted),
        1
    );
}

/// The deadline: a record not started is handed back untouched, and so is the rest of its
/// group behind it (held back), never run after it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_a_record_not_started_holds_back_its_group(pool: PgPool) {
    let harness = harness_in(
        &pool,
        AwardPoints::new(reference_name()),
        CommitMode::PerJob,
    );
    let batch: Vec<IncomingMessage> = (1..=3).map(|p| award_in("a", "acct", p).1).collect();
    let starts = AtomicUsize::new(0);
    let may_start = || starts.fetch_add(1, Ordering::SeqCst) < 1;
    let outcomes = harness.process_batch(&batch, &may_start, 10).await;
    assert_eq!(
        outcomes,
        vec![
            Some(RecordOutcome::Processed),
            None,
            Some(RecordOutcome::HeldBack)
        ]
    );
    assert_eq!(awards_in_order(&pool, "acct").await, vec![1]);
}

/// After a crash every record of the batch comes back: the groups then run one record at a
/// time, the group whose next job ran least first, so a job that crashes again is charged alone
/// and the other groups have committed before it runs (the effect table's ids show the order).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fifo_after_a_crash_the_groups_that_did_not_run_it_go_first(pool: PgPool) {
    let harness = harness_in(
        &pool,
        AwardPoints::new(reference_name()),
        CommitMode::PerJob,
    );
    let (crashed, behind) = (award_in("a", "acct-a", 1), award_in("a", "acct-a", 2));
    let other = award_in("b", "acct-b", 1);
    charge_executions(&pool, crashed.0, &reference_name(), 1, None).await;
    let again = |m: &IncomingMessage| IncomingMessage {
        receive_count: 2,
        ..m.clone()
    };
    let batch = [again(&crashed.1), again(&behind.1), again(&other.1)];
    let outcomes = run_batch(&harness, &batch).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed; 3]);
    let committed: Vec<String> = sqlx::query_scalar(
        "SELECT account_id || ':' || points FROM reference.point_awards ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(committed, ["acct-b:1", "acct-a:1", "acct-a:2"]);
}
