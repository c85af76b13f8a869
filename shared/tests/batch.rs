//! Batch mode (issue 17): one commit for an SQS batch's new jobs, with every guarantee per job.
//! Duplicates are found in one statement without a transaction; concurrent batches that share
//! jobs, in opposite orders, neither double nor deadlock; anything that stops a batch's
//! transaction rolls it back whole and its jobs go one by one exactly as in per-job mode; a
//! `COMMIT` whose reply is lost is settled through the fences; work that swallows an SQL error
//! or ends the transaction itself is caught before `COMMIT`. (AC1, AC2 and AC8 run in both
//! modes in `acceptance.rs` and `tests/tests/ac2_crash.rs`; the chaos soak too.)

use consumer::{AwardPoints, count_awards};
use shared::dead_letter::{ErrorKind, letters_for_job};
use shared::fence::count_fences;
use shared::harness::{CommitMode, HarnessSettings, RecordOutcome};
use shared::ids::JobId;
use shared::ledger::ledger;
use shared::metrics::Metric;
use shared_testkit::commit_cutter::{Cut, pools_through};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use tokio::sync::Barrier;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_commits_its_new_jobs_in_one_transaction(pool: PgPool) {
    let harness = harness_in(&pool, award_points(), CommitMode::Batch);
    let jobs: Vec<(JobId, String)> = (0..10).map(|i| job(award(i + 1))).collect();
    let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed; 10]);
    for (job_id, _) in &jobs {
        assert_eq!(count_awards(&pool, *job_id).await.unwrap(), 1);
        assert_eq!(count_fences(&pool, *job_id).await.unwrap(), 1);
    }
    let m = harness.metrics();
    assert_eq!(
        (m.get(Metric::BatchCommitted), m.get(Metric::Processed)),
        (1, 10)
    );
    // The fences of one transaction: one xmin for all ten.
    let xmins: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM core.processed_jobs WHERE consumer = 'award-points'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(xmins, 1, "one commit for the batch");
}

/// A batch of duplicates costs one statement and no transaction: with every insert into the
/// fences blocked by a lock, it still answers, ten duplicates (a fence insert would have met
/// the lock and failed as contended after the harness's 50 ms lock wait).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_of_duplicates_is_answered_by_one_lookup_without_a_transaction(pool: PgPool) {
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        let settings = HarnessSettings {
            commit: mode,
            lock_timeout: std::time::Duration::from_millis(50),
            ..settings()
        };
        let harness = harness_with(&pool, Counting::new(award_points()), settings).0;
        let bodies: Vec<String> = (0..10).map(|_| job(award(1)).1).collect();
        assert_eq!(
            run_batch(&harness, &batch(&bodies)).await,
            vec![RecordOutcome::Processed; 10]
        );
        let calls = harness.consumer().calls();
        let mut blocker = shared::db::begin(&pool).await.unwrap();
        sqlx::query("LOCK TABLE core.processed_jobs IN EXCLUSIVE MODE")
            .execute(&mut *blocker)
            .await
            .unwrap();
        let again = run_batch(&harness, &batch(&bodies)).await;
        blocker.rollback().await.unwrap();
        assert_eq!(again, vec![RecordOutcome::Duplicate; 10], "{mode:?}");
        assert_eq!(harness.consumer().calls(), calls, "the handler never ran");
        assert_eq!(harness.metrics().get(Metric::DuplicateSkipped), 10);
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_duplicate_inside_a_batch_is_skipped(pool: PgPool) {
    let harness = harness_in(&pool, award_points(), CommitMode::Batch);
    let (twice, body) = job(award(4));
    let (other, other_body) = job(award(5));
    let batch = [
        message(&body, 1),
        message(&other_body, 1),
        message(&body, 1),
    ];
    let outcomes = run_batch(&harness, &batch).await;
    assert_eq!(
        outcomes,
        [
            RecordOutcome::Processed,
            RecordOutcome::Processed,
            RecordOutcome::Duplicate
        ]
    );
    assert_eq!(count_awards(&pool, twice).await.unwrap(), 1);
    assert_eq!(count_awards(&pool, other).await.unwrap(), 1);
}

/// Two batches sharing ten jobs, one in the reverse order of the other, at the same moment, ten
/// times: each job applied once, and no batch ever fails (a deadlock would abort one, which
/// would then fall back to one job at a time). Each fence insert is slowed down (a test trigger
/// sleeping 10 ms), so the two claims always overlap: claimed in the order they came, they
/// deadlock every round.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn concurrent_batches_sharing_jobs_in_opposite_orders_neither_double_nor_deadlock(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = own_pool(connect, 4).await;
    sqlx::raw_sql(
        "CREATE FUNCTION core.slow_fence() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
         CREATE TRIGGER slow_fence BEFORE INSERT ON core.processed_jobs
             FOR EACH ROW EXECUTE FUNCTION core.slow_fence();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let harness = Arc::new(harness_in(&pool, award_points(), CommitMode::Batch));
    for round in 0..10 {
        let jobs: Vec<(JobId, String)> = (0..10).map(|_| job(award(2))).collect();
        let forward: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
        let backward: Vec<String> = forward.iter().rev().cloned().collect();
        let start = Arc::new(Barrier::new(2));
        let batches: Vec<_> = [forward, backward]
            .into_iter()
            .map(|bodies| {
                let (harness, start) = (harness.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    run_batch(&harness, &batch(&bodies)).await
                })
            })
            .collect();
        let mut processed = 0;
        for batch in batches {
            let outcomes = batch.await.unwrap();
            assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
            processed += outcomes
                .iter()
                .filter(|o| **o == RecordOutcome::Processed)
                .count();
        }
        assert_eq!(processed, 10, "round {round}: each job processed once");
        for (job_id, _) in &jobs {
            assert_eq!(
                count_awards(&pool, *job_id).await.unwrap(),
                1,
                "round {round}"
            );
        }
    }
    assert_eq!(
        harness.metrics().get(Metric::BatchFellBack),
        0,
        "no batch was aborted (a deadlock would have been)"
    );
}

/// One poison job in a batch costs only itself: the batch rolls back, its jobs go one by one,
/// the poison one becomes its letter on its first attempt, the others commit.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_poison_job_in_a_batch_costs_only_itself(pool: PgPool) {
    let harness = harness_in(&pool, award_points(), CommitMode::Batch);
    let mut jobs: Vec<(JobId, String)> = (0..4).map(|_| job(award(3))).collect();
    jobs.insert(2, job(award(0))); // points must be positive: poison, as the handler says
    let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            assert_eq!(
                outcome.dead_letter_kind(),
                Some(ErrorKind::Poison),
                "{outcome:?}"
            );
        } else {
            assert_eq!(*outcome, RecordOutcome::Processed);
            assert_eq!(count_awards(&pool, jobs[i].0).await.unwrap(), 1);
        }
    }
    let letters = letters_for_job(&pool, jobs[2].0, &reference_name())
        .await
        .unwrap();
    assert_eq!((letters.len(), letters[0].attempts), (1, 1));
    let m = harness.metrics();
    assert_eq!(
        (m.get(Metric::BatchFellBack), m.get(Metric::BatchCommitted)),
        (1, 0)
    );
}

/// A failure of the batch's statement (a trigger refusing one job's row) falls back: the failing
/// job is retried on its own with its own attempt count, the others commit, and nobody is
/// charged for the batch's attempt.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failing_statement_falls_back_and_retries_only_the_job_that_fails(pool: PgPool) {
    refuse_account_boom(&pool).await;
    let harness = harness_in(&pool, award_points(), CommitMode::Batch);
    let good: Vec<(JobId, String)> = (0..3).map(|_| job(award(1))).collect();
    let bad = job(serde_json::json!({"account_id": "boom", "points": 1}));
    let mut bodies: Vec<String> = good.iter().map(|(_, b)| b.clone()).collect();
    bodies.push(bad.1.clone());
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    assert_eq!(&outcomes[..3], vec![RecordOutcome::Processed; 3]);
    assert!(
        matches!(&outcomes[3], RecordOutcome::Retry { attempt: 1, error, .. } if error.contains("ledger refused")),
        "{:?}",
        outcomes[3]
    );
    for (job_id, _) in &good {
        assert_eq!(count_awards(&pool, *job_id).await.unwrap(), 1);
        assert_eq!(
            ledger(&pool, *job_id, &reference_name())
                .await
                .unwrap()
                .executions,
            0,
            "not charged for the batch"
        );
    }
    assert_eq!(
        ledger(&pool, bad.0, &reference_name())
            .await
            .unwrap()
            .executions,
        1
    );
}

/// The batch's `COMMIT` reaches the server, but its reply is lost with the connection: the jobs
/// then go one by one, and each finds its own fence committed, so none is applied twice.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_whose_commit_reply_is_lost_settles_through_the_fences(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, cutter, through) = pools_through(pool_opts, connect).await;
    let harness = harness_in(&through, award_points(), CommitMode::Batch);
    let jobs: Vec<(JobId, String)> = (0..5).map(|_| job(award(1))).collect();
    let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
    cutter.arm(Cut::AfterCommitSent);
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    assert!(cutter.fired());
    assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
    for (job_id, _) in &jobs {
        assert_eq!(
            count_awards(&pool, *job_id).await.unwrap(),
            1,
            "applied once"
        );
    }
    assert_eq!(harness.metrics().get(Metric::BatchFellBack), 1);
}

/// A batch consumer that misbehaves with the harness's transaction after doing its work: it
/// swallows an SQL error (the transaction is then aborted, and its `COMMIT` would roll back
/// without an error), or commits the transaction itself. Per job it behaves.
#[derive(Clone, Copy)]
enum Misbehaves {
    SwallowsSqlError,
    CommitsItself,
}

impl shared::consumer::Consumer for Misbehaves {
    type Payload = consumer::PointsAward;
    fn name(&self) -> &shared::ids::ConsumerName {
        static NAME: std::sync::OnceLock<shared::ids::ConsumerName> = std::sync::OnceLock::new();
        NAME.get_or_init(reference_name)
    }
    async fn handle(
        &self,
        job: &shared::consumer::Job<Self::Payload>,
        tx: &mut sqlx::PgConnection,
    ) -> Result<(), shared::consumer::ProcessError> {
        award_points().handle(job, tx).await
    }
    async fn handle_batch(
        &self,
        jobs: &[shared::consumer::Job<Self::Payload>],
        tx: &mut sqlx::PgConnection,
    ) -> Result<(), shared::consumer::ProcessError> {
        award_points().handle_batch(jobs, tx).await?;
        match self {
            Misbehaves::SwallowsSqlError => {
                let ignored = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
                assert!(ignored.is_err(), "the statement fails");
            }
            Misbehaves::CommitsItself => {
                sqlx::raw_sql("COMMIT").execute(&mut *tx).await.unwrap();
            }
        }
        Ok(())
    }
}

/// Issue 13's hole in batch mode: work that returns `Ok` from an aborted transaction is not
/// acked with nothing committed. The check before `COMMIT` fails, the batch rolls back and its
/// jobs run one by one, each committing its award once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_whose_work_swallows_an_sql_error_is_not_acked_with_nothing_committed(
    pool: PgPool,
) {
    let harness = harness_in(&pool, Misbehaves::SwallowsSqlError, CommitMode::Batch);
    let jobs: Vec<(JobId, String)> = (0..4).map(|i| job(award(i + 1))).collect();
    let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed; 4]);
    for (job_id, _) in &jobs {
        assert_eq!(
            count_awards(&pool, *job_id).await.unwrap(),
            1,
            "committed once"
        );
        assert_eq!(count_fences(&pool, *job_id).await.unwrap(), 1);
    }
    let m = harness.metrics();
    assert_eq!(
        (m.get(Metric::BatchCommitted), m.get(Metric::BatchFellBack)),
        (0, 1)
    );
}

/// Work that commits the harness's transaction itself: what it committed holds (each fence with
/// its award), the harness does not count it as its own commit, and the jobs settle through
/// their fences one by one: acked as duplicates, nothing doubled.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_whose_work_commits_the_transaction_itself_doubles_nothing(pool: PgPool) {
    let harness = harness_in(&pool, Misbehaves::CommitsItself, CommitMode::Batch);
    let jobs: Vec<(JobId, String)> = (0..4).map(|i| job(award(i + 1))).collect();
    let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
    let outcomes = run_batch(&harness, &batch(&bodies)).await;
    assert_eq!(outcomes, vec![RecordOutcome::Duplicate; 4]);
    for (job_id, _) in &jobs {
        assert_eq!(count_awards(&pool, *job_id).await.unwrap(), 1);
        assert_eq!(count_fences(&pool, *job_id).await.unwrap(), 1);
    }
    assert_eq!(harness.metrics().get(Metric::BatchFellBack), 1);
}

/// Issue 22: the batch's failed transaction was dropped, and its `ROLLBACK` went out
/// later from the pool, so the one-by-one fallback could meet the batch's own uncommitted
/// fences and hand a job back as contended (seen 6 times in 520 jobs with a 1 ms lock wait).
/// The batch is now rolled back before its jobs run alone: with a 1 ms lock wait, no job of a
/// batch that fell back is ever contended.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_that_falls_back_is_rolled_back_before_its_jobs_run_one_by_one(pool: PgPool) {
    let settings = HarnessSettings {
        commit: CommitMode::Batch,
        lock_timeout: std::time::Duration::from_millis(1),
        ..settings()
    };
    let harness = harness_with(&pool, award_points(), settings).0;
    for round in 0..150 {
        let mut jobs: Vec<(JobId, String)> = (0..9).map(|_| job(award(2))).collect();
        jobs.insert(round % 10, job(award(0))); // poison: the batch falls back
        let bodies: Vec<String> = jobs.iter().map(|(_, b)| b.clone()).collect();
        // The fallback one job at a time: the only transaction that can hold a fence of the
        // batch then is the batch's own (ten concurrent inserts can also wait on each other for
        // the table's extension lock, longer than 1 ms on a busy machine).
        let outcomes: Vec<RecordOutcome> = harness
            .process_batch(&batch(&bodies), &|| true, 1)
            .await
            .into_iter()
            .map(|o| o.expect("started"))
            .collect();
        for (i, outcome) in outcomes.iter().enumerate() {
            if i == round % 10 {
                assert_eq!(outcome.dead_letter_kind(), Some(ErrorKind::Poison));
            } else {
                assert_eq!(*outcome, RecordOutcome::Processed, "round {round}, job {i}");
            }
        }
    }
    assert_eq!(harness.metrics().get(Metric::FenceContended), 0);
}

/// Issue 22, item 7: the same job twice in one SQS batch (a producer's retry that landed in the
/// same batch) ran twice and was charged two executions for one failure. It now runs once, by
/// its first record; the copy is handed back with the same delay, uncharged, in both modes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_same_job_twice_in_one_sqs_batch_is_charged_one_execution(pool: PgPool) {
    refuse_account_boom(&pool).await;
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        let harness = harness_in(&pool, award_points(), mode);
        let failing = job(serde_json::json!({"account_id": "boom", "points": 1}));
        let good = job(award(1));
        let batch = batch(&[
            failing.1.clone(),
            good.1.clone(),
            failing.1.clone(),
            good.1.clone(),
        ]);
        let outcomes = run_batch(&harness, &batch).await;
        let after = match &outcomes[0] {
            RecordOutcome::Retry {
                attempt: 1, after, ..
            } => *after,
            other => panic!("{mode:?}: {other:?}"),
        };
        assert!(
            matches!(&outcomes[2], RecordOutcome::HandedBack { retry_after, .. } if *retry_after == after),
            "{mode:?}: {:?}",
            outcomes[2]
        );
        assert_eq!(
            (&outcomes[1], &outcomes[3]),
            (&RecordOutcome::Processed, &RecordOutcome::Duplicate),
            "{mode:?}"
        );
        let charged = ledger(&pool, failing.0, &reference_name()).await.unwrap();
        assert_eq!(
            charged.executions, 1,
            "{mode:?}: one failure, one execution"
        );
        assert_eq!(count_awards(&pool, good.0).await.unwrap(), 1);
    }
}
