//! The letters' intake (issue 36, migration 0030): batch mode's poison is received in one narrow
//! statement and settled into letters behind it, one settler at a time per consumer. Real
//! PostgreSQL, the library harness in `CommitMode::Batch`, real concurrency: the settle lock held
//! by another transaction, writers side by side, a row settled twice, a job committing between
//! its poison copy's receipt and its settle, and the scheduled run taking a storm's tail.

use consumer::AwardPoints;
use e2e::groups::counts_match_letters;
use e2e::intake_kit::{hold_settle_lock, scheduled_run, settle_all};
use serde_json::json;
use shared::dead_letter::{Recorded, Settled};
use shared::harness::{CommitMode, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

fn consumer() -> ConsumerName {
    e2e::consumer_name()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A poison record of a new job (its points are not a number): the job's id and the message.
fn poison() -> (JobId, shared::harness::IncomingMessage) {
    let job = JobId(Uuid::new_v4());
    let body = envelope(
        job,
        TenantId(Uuid::new_v4()),
        "c",
        json!({"account_id": "a", "points": "x"}),
    );
    (job, message_on("jobs", &body, 1))
}

/// The same job, valid.
fn valid_copy(job: JobId, tenant: TenantId) -> shared::harness::IncomingMessage {
    let body = envelope(job, tenant, "c", json!({"account_id": "a", "points": 5}));
    message_on("jobs", &body, 1)
}

/// Every message has exactly one letter, nothing is left received, every group's counts exact.
async fn one_letter_each(pool: &PgPool, messages: &[shared::harness::IncomingMessage]) {
    for m in messages {
        let letters = count(
            pool,
            &format!(
                "SELECT count(*) FROM core.dead_letters WHERE message_id = '{}'",
                m.message_id
            ),
        )
        .await;
        assert_eq!(letters, 1, "message {} has {letters} letters", m.message_id);
    }
    assert_eq!(
        count(pool, "SELECT count(*) FROM core.letter_intake").await,
        0,
        "a received row was left behind"
    );
    counts_match_letters(pool).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_of_poison_is_settled_by_its_own_invocation_when_no_settler_is_at_work(
    pool: PgPool,
) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let batch: Vec<_> = (0..10).map(|_| poison().1).collect();
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    for outcome in &outcomes {
        assert!(
            matches!(
                outcome,
                RecordOutcome::DeadLettered {
                    letter: Recorded::New(_),
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
    one_letter_each(&pool, &batch).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letter_groups").await,
        1,
        "one failure, one group"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_writer_that_finds_a_settler_at_work_acks_and_leaves_its_rows_to_it(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..10).map(|_| poison().1).collect();
    let outcomes = tokio::time::timeout(
        Duration::from_secs(10),
        shared_testkit::run_batch(&harness, &batch),
    )
    .await
    .expect("a writer waited for the settler at work");
    for outcome in &outcomes {
        assert!(outcome.is_ack(), "{outcome:?}");
        assert!(
            matches!(
                outcome,
                RecordOutcome::DeadLettered {
                    letter: Recorded::Received(_),
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        10,
        "the records are kept, as received"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        0
    );
    held.rollback().await.unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 10);
    one_letter_each(&pool, &batch).await;
}

/// Nine valid new jobs and one poison record, a settler at work so the row stays received.
async fn one_in_ten_beside_a_settler(
    pool: &PgPool,
) -> (
    Vec<shared::harness::IncomingMessage>,
    Vec<RecordOutcome>,
    sqlx::Transaction<'static, sqlx::Postgres>,
) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(pool).await;
    let mut batch: Vec<_> = (0..9)
        .map(|_| valid_copy(JobId(Uuid::new_v4()), TenantId(Uuid::new_v4())))
        .collect();
    batch.insert(4, poison().1);
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    (batch, outcomes, held)
}

/// Issue 36's one poison record in ten: its row in the intake is received in the commit group's
/// own transaction, one commit for the batch (the row and the group's fences have one `xmin`),
/// and is settled to its letter behind it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batchs_poison_is_received_in_its_commit_groups_own_transaction(pool: PgPool) {
    let (batch, outcomes, held) = one_in_ten_beside_a_settler(&pool).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 4 {
            assert!(
                matches!(
                    outcome,
                    RecordOutcome::DeadLettered {
                        letter: Recorded::Received(_),
                        ..
                    }
                ),
                "{outcome:?}"
            );
        } else {
            assert!(matches!(outcome, RecordOutcome::Processed), "{outcome:?}");
        }
    }
    let transactions = count(
        &pool,
        "SELECT count(DISTINCT x) FROM (SELECT xmin::text AS x FROM core.processed_jobs
                                       UNION ALL SELECT xmin::text FROM core.letter_intake) t",
    )
    .await;
    assert_eq!(
        transactions, 1,
        "the poison's row and the group's fences were committed apart"
    );
    held.rollback().await.unwrap();
    assert_eq!(settle_all(&pool).await.new_letters, 1);
    one_letter_each(&pool, &batch[4..5]).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        9
    );
}

/// Without a settler at work, the invocation settles its poison's row itself, behind the group's
/// commit: the record is answered with its new letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batchs_poison_received_with_its_group_is_settled_by_its_own_invocation(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let mut batch: Vec<_> = (0..8)
        .map(|_| valid_copy(JobId(Uuid::new_v4()), TenantId(Uuid::new_v4())))
        .collect();
    batch.insert(0, poison().1);
    batch.push(poison().1);
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    for i in [0, 9] {
        assert!(
            matches!(
                outcomes[i],
                RecordOutcome::DeadLettered {
                    letter: Recorded::New(_),
                    ..
                }
            ),
            "{:?}",
            outcomes[i]
        );
    }
    one_letter_each(&pool, &[batch[0].clone(), batch[9].clone()]).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        8
    );
}

/// The intake's row refused inside the commit group (a constraint this test adds, standing in
/// for any value PostgreSQL could still refuse): the group rolls back whole, its jobs go one by
/// one and commit once each, and the poison record still gets its letter (received alone, or
/// written with the as-received fallback). Nothing lost, nothing twice.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_poison_row_refused_inside_the_commit_group_costs_the_batch_nothing(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let mut batch: Vec<_> = (0..9)
        .map(|_| valid_copy(JobId(Uuid::new_v4()), TenantId(Uuid::new_v4())))
        .collect();
    let (_, refused) = poison();
    batch.insert(3, refused.clone());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE core.letter_intake ADD CONSTRAINT refuse_one CHECK (message_id <> '{}')",
        refused.message_id
    )))
    .execute(&pool)
    .await
    .unwrap();
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
    assert!(
        matches!(outcomes[3], RecordOutcome::DeadLettered { .. }),
        "{:?}",
        outcomes[3]
    );
    one_letter_each(&pool, std::slice::from_ref(&refused)).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        9
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        9
    );
}

/// A commit group whose work fails rolls back with its poison's rows: the jobs go one by one
/// (the failing one to its own outcome), and the poison is received on its own, one letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_group_that_fails_leaves_its_poison_to_be_received_on_its_own(pool: PgPool) {
    let faulty = e2e::faulty_award::AwardPointsWithFaults::new(consumer());
    let harness = e2e::harness_in(pool.clone(), faulty, CommitMode::Batch);
    let job = |fault: Option<&str>| {
        let mut payload = json!({"account_id": "a", "points": 5});
        if let Some(fault) = fault {
            payload["demo_fault"] = json!(fault);
        }
        let body = envelope(
            JobId(Uuid::new_v4()),
            TenantId(Uuid::new_v4()),
            "c",
            payload,
        );
        message_on("jobs", &body, 1)
    };
    let mut batch: Vec<_> = (0..8).map(|_| job(None)).collect();
    batch.push(job(Some("permanent")));
    let (_, lone) = poison();
    batch.insert(2, lone.clone());
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
    one_letter_each(&pool, &[lone, batch[9].clone()]).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        8
    );
}

/// A stream of poison with a settle due (`LETTER_SETTLE_DUE_MS`, here `SETTLE_DUE`, as
/// measured): a writer that finds a letter of its consumer written less than the due ago leaves
/// its rows for the next round (answered as received), and the first writer that finds none
/// written for as long settles them with its own: a storm's rounds take what was received over
/// the due, not one batch's rows each. Time is the harness's clock.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_writer_in_a_stream_leaves_its_rows_to_the_round_that_finds_them_due(pool: PgPool) {
    use shared::dead_letter::SETTLE_DUE;
    let clock = std::sync::Arc::new(shared::clock::ManualClock::new(chrono::Utc::now()));
    let settings = shared::harness::HarnessSettings {
        lock_timeout: e2e::LOCK_TIMEOUT,
        commit: CommitMode::Batch,
        settle_due: SETTLE_DUE,
        ..shared_testkit::settings()
    };
    let harness =
        shared_testkit::harness_on(&pool, AwardPoints::new(consumer()), settings, clock.clone());
    let letters = |outcomes: &[RecordOutcome]| {
        outcomes
            .iter()
            .map(|o| match o {
                RecordOutcome::DeadLettered {
                    letter: Recorded::New(_),
                    ..
                } => "new",
                RecordOutcome::DeadLettered {
                    letter: Recorded::Received(_),
                    ..
                } => "received",
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>()
    };
    let batches: Vec<Vec<_>> = (0..4)
        .map(|_| (0..10).map(|_| poison().1).collect())
        .collect();
    // Alone: settled before it acks.
    let first = shared_testkit::run_batch(&harness, &batches[0]).await;
    assert_eq!(letters(&first), ["new"; 10]);
    // A letter was just written: left for the next round, and so is the next batch's.
    clock.advance(chrono::Duration::milliseconds(10));
    for batch in &batches[1..3] {
        let outcomes = shared_testkit::run_batch(&harness, batch).await;
        assert_eq!(letters(&outcomes), ["received"; 10]);
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        20
    );
    // Due: this writer's round takes the rows left and its own.
    clock.advance(chrono::Duration::from_std(SETTLE_DUE).unwrap());
    let last = shared_testkit::run_batch(&harness, &batches[3]).await;
    assert_eq!(letters(&last), ["new"; 10]);
    one_letter_each(&pool, &batches.concat()).await;
}

/// A stream's last rows, left for a round that did not come: the scheduled function's bulk
/// operations invocation (every minute) settles them, the function as deployed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_operations_invocation_settles_the_rows_a_stream_left(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..10).map(|_| poison().1).collect();
    shared_testkit::run_batch(&harness, &batch).await;
    held.rollback().await.unwrap();
    let host =
        e2e::lambda_host::scheduled_function(env!("CARGO_BIN_EXE_local-scheduled"), &pool, 2);
    let answer = host
        .invoke(&json!({"work": "operations"}))
        .await
        .expect("the operations invocation");
    assert_eq!(answer["settled"], 10, "{answer}");
    one_letter_each(&pool, &batch).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_message_received_twice_before_its_settle_gets_one_letter(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..5).map(|_| poison().1).collect();
    // Delivered twice while the settler is at work (an ack lost), and once more inside a batch.
    shared_testkit::run_batch(&harness, &batch).await;
    let mut again = batch.clone();
    again.push(batch[0].clone());
    shared_testkit::run_batch(&harness, &again).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        11
    );
    held.rollback().await.unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 5);
    one_letter_each(&pool, &batch).await;
    // And once more after its letter: the one it has answers it.
    let outcomes = shared_testkit::run_batch(&harness, &batch).await;
    for outcome in &outcomes {
        assert!(
            matches!(
                outcome,
                RecordOutcome::DeadLettered {
                    letter: Recorded::AlreadyRecorded(_),
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
    one_letter_each(&pool, &batch).await;
}

/// A poison copy of a job received while a settler is at work, then a valid copy of the job
/// commits, then the row is settled: through the job's fence, as a letter written at once would
/// have been, so a copy of the same job (its payload's digest) gets no letter, and one of another
/// payload under the id gets a `conflict` letter. Never a pending letter of the job that ran.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_that_commits_before_its_poison_copies_are_settled_settles_them_through_its_fence(
    pool: PgPool,
) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let job = JobId(Uuid::new_v4());
    let tenant = TenantId(Uuid::new_v4());
    // The same job, its correlation id not a string (poison of the job's own digest); another
    // payload under the id.
    let same = json!({"job_id": job, "tenant_id": tenant, "correlation_id": 5,
        "payload": {"account_id": "a", "points": 5}})
    .to_string();
    let other = envelope(job, tenant, "c", json!({"account_id": "a", "points": "x"}));
    let held = hold_settle_lock(&pool).await;
    let same = message_on("jobs", &same, 1);
    let other = message_on("jobs", &other, 1);
    let others: Vec<_> = (0..3).map(|_| poison().1).collect();
    for m in [&same, &other] {
        let mut batch = others.clone();
        batch.push(m.clone());
        let outcomes = shared_testkit::run_batch(&harness, &batch).await;
        assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
    }
    let valid = valid_copy(job, tenant);
    let outcome = shared_testkit::run_batch(&harness, std::slice::from_ref(&valid)).await;
    assert!(
        matches!(outcome[0], RecordOutcome::Processed),
        "{outcome:?}"
    );
    held.rollback().await.unwrap();
    settle_all(&pool).await;
    let kinds = |m: &shared::harness::IncomingMessage| {
        format!(
            "SELECT count(*) FROM core.dead_letters WHERE message_id = '{}' AND error_kind = 'conflict'",
            m.message_id
        )
    };
    let letters = |m: &shared::harness::IncomingMessage| {
        format!(
            "SELECT count(*) FROM core.dead_letters WHERE message_id = '{}'",
            m.message_id
        )
    };
    assert_eq!(
        count(&pool, &letters(&same)).await,
        0,
        "a letter of a copy of the job that ran"
    );
    assert_eq!(count(&pool, &letters(&other)).await, 1);
    assert_eq!(
        count(&pool, &kinds(&other)).await,
        1,
        "another job under the id: a conflict"
    );
    one_letter_each(&pool, &others).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn writers_side_by_side_leave_every_record_one_letter(pool: PgPool) {
    let writers = 8;
    let batches = 12;
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let harness = e2e::harness_in(pool, AwardPoints::new(consumer()), CommitMode::Batch);
            let mut sent = Vec::new();
            for b in 0..batches {
                // All poison, or one in ten.
                let mut batch: Vec<_> = (0..10).map(|_| poison().1).collect();
                if b % 2 == 1 {
                    for m in batch.iter_mut().skip(1) {
                        let (job, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
                        *m = valid_copy(job, tenant);
                    }
                }
                let outcomes = shared_testkit::run_batch(&harness, &batch).await;
                assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
                sent.extend(batch.into_iter().filter(|m| m.body.contains("\"x\"")));
            }
            sent
        }));
    }
    let mut poison = Vec::new();
    for t in tasks {
        poison.extend(t.await.unwrap());
    }
    // What the writers' own rounds left (a round that found a settler at work) goes now.
    settle_all(&pool).await;
    one_letter_each(&pool, &poison).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letter_groups").await,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_scheduled_run_settles_what_the_writers_left(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..25).map(|_| poison().1).collect();
    for chunk in batch.chunks(10) {
        shared_testkit::run_batch(&harness, chunk).await;
    }
    held.rollback().await.unwrap();
    let report = scheduled_run(&pool).run(None).await;
    assert_eq!(report.settled, Ok(25), "{report:?}");
    assert_eq!(report.to_json()["settled"]["letters"], 25);
    one_letter_each(&pool, &batch).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_row_whose_letter_was_written_but_not_deleted_is_settled_again_to_the_same_letter(
    pool: PgPool,
) {
    // A settler that died between its letters and its delete: the rows' letters exist, the rows
    // too. Made so by copying settled rows back.
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..6).map(|_| poison().1).collect();
    shared_testkit::run_batch(&harness, &batch).await;
    sqlx::query("CREATE TABLE kept AS SELECT * FROM core.letter_intake")
        .execute(&pool)
        .await
        .unwrap();
    held.rollback().await.unwrap();
    assert_eq!(settle_all(&pool).await.new_letters, 6);
    let letters_before: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM core.dead_letters ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    sqlx::query("INSERT INTO core.letter_intake OVERRIDING SYSTEM VALUE SELECT * FROM kept")
        .execute(&pool)
        .await
        .unwrap();
    let again = settle_all(&pool).await;
    assert_eq!(again.new_letters, 0);
    assert!(
        again
            .settled
            .values()
            .all(|s| matches!(s, Settled::Recorded(Recorded::AlreadyRecorded(_)))),
        "{again:?}"
    );
    let letters_after: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM core.dead_letters ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(letters_before, letters_after);
    one_letter_each(&pool, &batch).await;
}

/// A round settled in one statement (0038) writes a conflict letter's error as the one-by-one
/// path does: the row's own error cut to a number of bytes at a character boundary
/// (`core.cut_to_bytes`, as `shared::ids::truncate` cuts), whatever widths its characters have.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_settle_statement_cuts_an_error_at_a_character_boundary_as_the_harness_does(
    pool: PgPool,
) {
    fn truncate(s: &str, max: usize) -> &str {
        let mut end = max.min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        &s[..end]
    }
    let texts = [
        "plain ascii error".repeat(300),
        "é".repeat(5000),
        "€a".repeat(2000),
        "😀é€a".repeat(1000),
        String::new(),
    ];
    for text in &texts {
        for n in [0, 1, 2, 3, 4, 5, 7, 4095, 4096, 4097, 8192, 20_000] {
            let cut: String = sqlx::query_scalar("SELECT core.cut_to_bytes($1, $2)")
                .bind(text)
                .bind(n as i32)
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(
                cut,
                truncate(text, n),
                "{n} bytes of {:?}…",
                &text[..text.len().min(12)]
            );
        }
    }
}

/// What waits in the intake reaches a person: the scheduled run measures the records not yet
/// settled (while a settler holds the lock), how long the oldest has waited, and the records set
/// aside (their letter refused even as received), as metrics the template alarms on
/// (`LettersSetAsideAlarm`, `OldestReceivedLetterAlarm`).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_scheduled_run_measures_what_waits_in_the_intake_and_what_was_set_aside(pool: PgPool) {
    let harness = e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    );
    let held = hold_settle_lock(&pool).await;
    let batch: Vec<_> = (0..4).map(|_| poison().1).collect();
    shared_testkit::run_batch(&harness, &batch).await;
    sqlx::query(
        "UPDATE core.letter_intake SET refused = 'a value PostgreSQL refused',
                received_at = received_at - interval '2 hours'
          WHERE seq = (SELECT min(seq) FROM core.letter_intake)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE core.letter_intake SET received_at = received_at - interval '90 minutes' WHERE refused IS NULL AND seq = (SELECT max(seq) FROM core.letter_intake)")
        .execute(&pool)
        .await
        .unwrap();
    let report = scheduled_run(&pool).run(None).await;
    held.rollback().await.unwrap();
    let waiting = report.to_json()["waiting"].clone();
    assert_eq!(waiting["received_unsettled"], 3, "{waiting}");
    assert_eq!(waiting["received_set_aside"], 1, "{waiting}");
    let emf = report.emf("JobHarness", chrono::Utc::now());
    assert_eq!(emf["LettersReceived"], 3);
    assert_eq!(emf["LettersSetAside"], 1);
    let oldest = emf["OldestReceivedLetterSeconds"].as_f64().unwrap();
    assert!(
        (5_400.0..5_500.0).contains(&oldest),
        "{oldest}: the oldest not set aside"
    );
    // Settled, the records leave; the one set aside stays, and is still counted.
    let report = scheduled_run(&pool).run(None).await;
    assert_eq!(report.settled, Ok(3), "{report:?}");
    let emf = report.emf("JobHarness", chrono::Utc::now());
    assert_eq!(emf["LettersReceived"], 0);
    assert_eq!(emf["OldestReceivedLetterSeconds"], 0);
    assert_eq!(emf["LettersSetAside"], 1);
}
