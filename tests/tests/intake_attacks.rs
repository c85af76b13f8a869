//! An outside attack on the letters' intake (issue 36, migration 0030: `receive_letters`,
//! `settle_round`, `settle_behind`, batch poison through `poison_together` in both commit modes,
//! the DLQ ingester's batches, the scheduled run's settle). Real PostgreSQL, the library harness
//! and the DLQ ingester, real concurrency (tokio tasks on several pools), a settler's backend
//! terminated while it holds the settle lock, a refusal injected into the intake's INSERT.
//!
//! Every test checks the two promises in SQL: no job's effect applied twice; every failure ends
//! as exactly one letter per message (or, while it waits, a received row that is later settled
//! into exactly one), none pending for a job that committed as the same job, every group's counts
//! equal to its letters.

use aws_lambda_events::event::sqs::SqsMessage;
use consumer::{AwardPoints, count_awards};
use e2e::groups::counts_match_letters;
use e2e::intake_kit::{
    copy_inside_its_transaction, harness_waiting, hold_settle_lock, run, scheduled_run, settle_all,
    until_a_session_waits_on_a_lock,
};
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::dead_letter::{Recorded, ReplayOutcome, Settled, Verdict, lock_letter, settle_behind};
use shared::dlq_ingester::DlqIngester;
use shared::envelope::JobDigest;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(5);
const MODES: [CommitMode; 2] = [CommitMode::Batch, CommitMode::PerJob];

// ---------------------------------------------------------------------------------------------
// Reading back.

fn consumer() -> ConsumerName {
    e2e::consumer_name()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The letters of the message `message_id` (as stored): (id, kind, status, replay_of).
async fn letters_of_message(
    pool: &PgPool,
    message_id: &str,
) -> Vec<(Uuid, String, String, Option<Uuid>)> {
    sqlx::query_as(
        "SELECT id, error_kind, status, replay_of FROM core.dead_letters
          WHERE consumer = $1 AND message_id = $2 ORDER BY created_at, id",
    )
    .bind(consumer().as_str())
    .bind(message_id)
    .fetch_all(pool)
    .await
    .expect("reading a message's letters")
}

async fn letters_of_job(pool: &PgPool, job: JobId) -> Vec<(Uuid, String, String)> {
    sqlx::query_as(
        "SELECT id, error_kind, status FROM core.dead_letters
          WHERE consumer = $1 AND job_id = $2 ORDER BY created_at, id",
    )
    .bind(consumer().as_str())
    .bind(job.0)
    .fetch_all(pool)
    .await
    .expect("reading a job's letters")
}

async fn intake_rows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM core.letter_intake").await
}

async fn awards(pool: &PgPool, job: JobId) -> i64 {
    count_awards(pool, job).await.expect("counting awards")
}

/// The promises over the whole database (as the earlier attacks check them), and the intake
/// empty.
async fn promises_hold(pool: &PgPool) {
    e2e::promises::both_hold(pool).await;
    assert_eq!(
        intake_rows(pool).await,
        0,
        "a received row was never settled"
    );
}

// ---------------------------------------------------------------------------------------------
// Bodies and messages.

fn new_job() -> (JobId, TenantId) {
    (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()))
}

fn award(account: &str, points: i64) -> Value {
    json!({"account_id": account, "points": points})
}

/// A poison record of a new job (its points are not a number).
fn poison() -> IncomingMessage {
    let (job, tenant) = new_job();
    poison_of(job, tenant, "x")
}

/// Poison under `job` (another job than its valid one: the points are `points`, a string).
fn poison_of(job: JobId, tenant: TenantId, points: &str) -> IncomingMessage {
    let body = envelope(
        job,
        tenant,
        "c",
        json!({"account_id": "a", "points": points}),
    );
    message_on("jobs", &body, 1)
}

fn valid(job: JobId, tenant: TenantId) -> IncomingMessage {
    message_on("jobs", &envelope(job, tenant, "c", award("a", 5)), 1)
}

/// The same job as [`valid`], spelled as poison (keys reordered, whitespace, escapes, the id
/// upper-cased, no correlation id).
fn poison_spelling_a(job: JobId, tenant: TenantId) -> String {
    let upper = job.0.to_string().to_uppercase();
    format!(
        "{{ \"payload\" : {{ \"points\" : 5 , \"account_id\" : \"\\u0061\" }} ,\n\t\"tenant_id\" : \"{{{tenant}}}\" , \"job\\u005fid\" : \"{upper}\" }}",
        tenant = tenant.0
    )
}

/// The same job again, as other poison: a correlation id that is no string, the points 5.0E0.
fn poison_spelling_b(job: JobId, tenant: TenantId) -> String {
    format!(
        r#"{{"job_id":"{}","correlation_id":7,"tenant_id":"{}","payload":{{"account_id":"a","points":5.0E0}}}}"#,
        job.0.simple(),
        tenant.0
    )
}

/// The same job as [`valid`], valid, spelled otherwise (key order, whitespace).
fn valid_spelled_otherwise(job: JobId, tenant: TenantId) -> String {
    format!(
        "{{\n  \"payload\": {{\"points\": 5, \"account_id\": \"a\"}},\n  \"correlation_id\": \"other\",\n  \"tenant_id\": \"{}\",\n  \"job_id\": \"{}\"\n}}",
        tenant.0, job.0
    )
}

fn digest_of(body: &str) -> JobDigest {
    let value: Value = serde_json::from_str(body).expect("JSON");
    JobDigest::of(&value, &[])
}

// ---------------------------------------------------------------------------------------------
// Harnesses, settlers, locks.

fn harness(pool: &PgPool, mode: CommitMode) -> Harness<AwardPoints> {
    e2e::harness_in(pool.clone(), AwardPoints::new(consumer()), mode)
}

// ---------------------------------------------------------------------------------------------
// The DLQ ingester.

fn ingester(pool: &PgPool, job_fields: &[&str]) -> DlqIngester {
    DlqIngester {
        pool: pool.clone(),
        consumer: consumer(),
        job_queue: "jobs".into(),
        max_receive_count: 7,
        max_attempts: 5,
        settle_wait: WAIT,
        fence_ttl: shared_testkit::FENCE_TTL,
        queue_retention: Duration::from_secs(3_600),
        job_fields: job_fields.iter().map(|f| f.to_string()).collect(),
        settle_due: Duration::ZERO,
        clock: Arc::new(SystemClock),
        metrics: Default::default(),
        alerter: None,
    }
}

/// A record of the DLQ as Lambda delivers it, sent now, in `group` if any.
fn dlq_record(message_id: &str, body: &str, group: Option<&str>) -> SqsMessage {
    let mut attributes = json!({
        "ApproximateReceiveCount": "1",
        "SentTimestamp": chrono::Utc::now().timestamp_millis().to_string(),
    });
    if let Some(group) = group {
        attributes["MessageGroupId"] = json!(group);
    }
    serde_json::from_value(json!({
        "messageId": message_id,
        "body": body,
        "attributes": attributes,
        "messageAttributes": {},
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs-dlq",
        "eventSource": "aws:sqs",
    }))
    .expect("an SQS record")
}

fn failed_ids(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

// =============================================================================================
// Identity.

/// One job spelled as poison twice (same digest) is received while a settler is at work, in a
/// batch beside other poison; then the job arrives valid, in two spellings in one batch, and
/// commits; then the rows are settled. The job is applied once, its poison spellings get no
/// letter (they are its copies), the rest one letter each. Both commit modes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_job_spelled_as_poison_while_received_then_committing_valid_is_applied_once_without_a_letter(
    pool: PgPool,
) {
    for mode in MODES {
        let h = harness(&pool, mode);
        let (j, t) = new_job();
        assert_eq!(
            digest_of(&poison_spelling_a(j, t)),
            digest_of(&envelope(j, t, "c", award("a", 5)))
        );
        let spelled_a = message_on("jobs", &poison_spelling_a(j, t), 1);
        let spelled_b = message_on("jobs", &poison_spelling_b(j, t), 1);
        let others: Vec<_> = (0..3).map(|_| poison()).collect();
        let held = hold_settle_lock(&pool).await;
        let mut first = others.clone();
        first.push(spelled_a.clone());
        first.push(spelled_b.clone());
        let outcomes = run(&h, &first).await;
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                RecordOutcome::DeadLettered {
                    letter: Recorded::Received(_),
                    ..
                }
            )),
            "{mode:?}: {outcomes:?}"
        );
        // The job, valid, in two spellings in one batch (a copy takes the first's outcome).
        let valid_a = valid(j, t);
        let valid_b = message_on("jobs", &valid_spelled_otherwise(j, t), 1);
        let outcomes = run(&h, &[valid_a, valid_b]).await;
        assert!(
            outcomes.contains(&RecordOutcome::Processed),
            "{mode:?}: {outcomes:?}"
        );
        held.rollback().await.unwrap();
        settle_all(&pool).await;
        assert_eq!(awards(&pool, j).await, 1, "{mode:?}: applied once");
        assert!(
            letters_of_job(&pool, j).await.is_empty(),
            "{mode:?}: the poison spellings of a job that committed were settled into letters: {:?}",
            letters_of_job(&pool, j).await
        );
        for m in &others {
            assert_eq!(letters_of_message(&pool, &m.message_id).await.len(), 1);
        }
        // And once more after its commit, received beside poison: its duplicates.
        let late = message_on("jobs", &poison_spelling_b(j, t), 1);
        let outcomes = run(&h, &[late, poison()]).await;
        assert_eq!(outcomes[0], RecordOutcome::Duplicate, "{mode:?}");
        promises_hold(&pool).await;
    }
}

/// Another job under a job's id (another payload, poison) received while a settler works, then
/// the valid job commits before the settle: a `conflict` letter, pending. The same settled first
/// (a `poison` letter), then the valid job commits: its letter stays pending (the commit is not
/// its job's). Both commit modes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn another_job_under_the_id_keeps_one_pending_letter_whether_the_valid_job_commits_before_or_after_its_settle(
    pool: PgPool,
) {
    for mode in MODES {
        let h = harness(&pool, mode);
        // Before the settle.
        let (j, t) = new_job();
        let other = poison_of(j, t, "other");
        let held = hold_settle_lock(&pool).await;
        run(&h, &[other.clone(), poison()]).await;
        assert_eq!(run(&h, &[valid(j, t)]).await[0], RecordOutcome::Processed);
        held.rollback().await.unwrap();
        settle_all(&pool).await;
        let letters = letters_of_message(&pool, &other.message_id).await;
        assert_eq!(letters.len(), 1, "{mode:?}: {letters:?}");
        assert_eq!(
            (letters[0].1.as_str(), letters[0].2.as_str()),
            ("conflict", "pending_review"),
            "{mode:?}"
        );
        assert_eq!(awards(&pool, j).await, 1);
        // After the settle.
        let (k, tk) = new_job();
        let other = poison_of(k, tk, "other");
        run(&h, &[other.clone(), poison()]).await;
        let letters = letters_of_message(&pool, &other.message_id).await;
        assert_eq!(letters.len(), 1, "{mode:?}: settled by its own writer");
        assert_eq!(run(&h, &[valid(k, tk)]).await[0], RecordOutcome::Processed);
        let letters = letters_of_message(&pool, &other.message_id).await;
        assert_eq!(letters.len(), 1);
        assert_eq!(
            letters[0].2, "pending_review",
            "{mode:?}: another job's commit closed a letter of a job that never ran"
        );
        assert_eq!(awards(&pool, k).await, 1);
        promises_hold(&pool).await;
    }
}

/// One SQS message twice in one batch, one job id in three poison records (two payloads, one of
/// them twice under two message ids), and the same message redelivered as a first delivery while
/// its row is still received: one letter per message, each record acked, both modes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn repeats_inside_one_batch_and_across_batches_keep_one_letter_per_message(pool: PgPool) {
    for mode in MODES {
        let h = harness(&pool, mode);
        let twice = poison();
        let (j, t) = new_job();
        let p1 = poison_of(j, t, "x");
        let p2 = poison_of(j, t, "y");
        let p3 = IncomingMessage {
            message_id: Uuid::new_v4().to_string(),
            ..p1.clone()
        };
        let batch = vec![
            twice.clone(),
            p1.clone(),
            twice.clone(),
            p2.clone(),
            p3.clone(),
        ];
        let outcomes = run(&h, &batch).await;
        for (i, o) in outcomes.iter().enumerate() {
            assert!(
                matches!(o, RecordOutcome::DeadLettered { .. }),
                "{mode:?} record {i}: {o:?}"
            );
        }
        for m in [&twice, &p1, &p2, &p3] {
            let letters = letters_of_message(&pool, &m.message_id).await;
            assert_eq!(letters.len(), 1, "{mode:?}: {letters:?}");
        }
        // The same messages again while a settler works, twice over (two lost acks), then
        // settled: nothing more.
        let held = hold_settle_lock(&pool).await;
        run(&h, &batch).await;
        run(&h, &batch).await;
        held.rollback().await.unwrap();
        let again = settle_all(&pool).await;
        assert_eq!(again.new_letters, 0, "{mode:?}: {again:?}");
        promises_hold(&pool).await;
    }
}

// =============================================================================================
// Chains.

/// A poison letter settled from the intake, replayed (reviewed as replayed and queued, as the
/// API does), the replay poison again and received while a settler works, then settled: a new
/// letter linked to the first. Then the replay's message redriven to the DLQ while its letter is
/// discarded with its row still received: the discarded letter stays its one letter. Group
/// counts exact throughout.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_replayed_into_poison_again_and_discarded_while_its_copy_is_received_keeps_one_letter_each(
    pool: PgPool,
) {
    let h = harness(&pool, CommitMode::Batch);
    let (j, t) = new_job();
    let first = poison_of(j, t, "x");
    run(&h, &[first.clone(), poison()]).await;
    let letters = letters_of_message(&pool, &first.message_id).await;
    assert_eq!(letters.len(), 1);
    let letter = DeadLetterId(letters[0].0);
    shared_testkit::queue_replay(&pool, letter, None).await;
    counts_match_letters(&pool).await;

    let replay = IncomingMessage {
        message_id: Uuid::new_v4().to_string(),
        replay_of: Some(letter),
        ..first.clone()
    };
    let held = hold_settle_lock(&pool).await;
    let outcomes = run(&h, &[replay.clone(), poison(), poison()]).await;
    assert!(matches!(
        outcomes[0],
        RecordOutcome::DeadLettered {
            letter: Recorded::Received(_),
            ..
        }
    ));
    held.rollback().await.unwrap();
    settle_all(&pool).await;
    let replayed = letters_of_message(&pool, &replay.message_id).await;
    assert_eq!(replayed.len(), 1, "{replayed:?}");
    assert_eq!(
        replayed[0].3,
        Some(letter.0),
        "the replay's letter links to its letter"
    );
    assert_eq!(replayed[0].2, "pending_review");
    promises_hold(&pool).await;

    // The replay's message redriven to the DLQ beside another record, received while a settler
    // works; its letter discarded meanwhile.
    let held = hold_settle_lock(&pool).await;
    let response = ingester(&pool, &[])
        .ingest(vec![
            dlq_record(&replay.message_id, &replay.body, None),
            dlq_record(&Uuid::new_v4().to_string(), "not json", None),
        ])
        .await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(intake_rows(&pool).await, 2);
    let mut locked = lock_letter(&pool, DeadLetterId(replayed[0].0), WAIT)
        .await
        .unwrap()
        .unwrap();
    let verdict = Verdict::Discarded {
        reason: "the account was closed".into(),
    };
    locked
        .mark(&verdict, "ops-1", chrono::Utc::now())
        .await
        .unwrap();
    locked.commit().await.unwrap();
    held.rollback().await.unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 1, "{settled:?}");
    let after = letters_of_message(&pool, &replay.message_id).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].2, "discarded", "the discarded letter was reopened");
    // The replayed letter is still replayed (as queued).
    let first_letters = letters_of_message(&pool, &first.message_id).await;
    assert_eq!(first_letters[0].2, "replayed");
    let _ = ReplayOutcome::Queued;
    promises_hold(&pool).await;
}

// =============================================================================================
// Concurrency and kills.

/// A settler's transaction killed (pg_terminate_backend) while it holds the settle lock, its
/// claim waiting on a job held by a copy inside its transaction: nothing is lost (every row
/// stays received), nothing doubled; the next settler writes exactly one letter each.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_settler_killed_mid_round_loses_and_doubles_nothing(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch);
    let (j, t) = new_job();
    let copy =
        copy_inside_its_transaction(&pool, j, t, &digest_of(&envelope(j, t, "c", award("a", 5))))
            .await;
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..9).map(|_| poison()).collect();
    batch.push(poison_of(j, t, "x"));
    run(&h, &batch).await;
    held.rollback().await.unwrap();
    assert_eq!(intake_rows(&pool).await, 10);

    // A settler of its own pool, its claim on J waiting for the copy.
    let settler_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let settler = tokio::spawn(async move {
        settle_behind(
            &settler_pool,
            &consumer(),
            chrono::Utc::now(),
            Duration::from_secs(40),
            10,
        )
        .await
    });
    until_a_session_waits_on_a_lock(&pool).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM (
             SELECT DISTINCT l.pid FROM pg_locks l
              WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         ) s) k",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "the settler holding the settle lock");
    let ended = tokio::time::timeout(Duration::from_secs(30), settler)
        .await
        .expect("the killed settler returns")
        .unwrap();
    // Whatever it answered, nothing was written and nothing left.
    let _ = ended;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        0
    );
    assert_eq!(intake_rows(&pool).await, 10, "a received row was lost");
    // The copy rolls back: J never ran, so its poison copy is a letter too.
    copy.rollback().await.unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 10, "{settled:?}");
    for m in &batch {
        assert_eq!(letters_of_message(&pool, &m.message_id).await.len(), 1);
    }
    assert_eq!(awards(&pool, j).await, 0);
    promises_hold(&pool).await;
}

/// Eight writers (both commit modes) send poison, valid jobs, poison spellings of those jobs
/// and other jobs under their ids, while the scheduled run and a manual settler loop beside
/// them: every job applied once, one letter per poison message (none pending for a job that
/// committed as the same job), the intake emptied, every group's counts exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn writers_the_scheduled_run_and_a_manual_settler_at_once_keep_both_promises(pool: PgPool) {
    let jobs: Arc<Vec<(JobId, TenantId)>> = Arc::new((0..40).map(|_| new_job()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut settlers = Vec::new();
    {
        let (pool, stop) = (pool.clone(), stop.clone());
        settlers.push(tokio::spawn(async move {
            let run = scheduled_run(&pool);
            while !stop.load(Ordering::SeqCst) {
                let report = run.run(None).await;
                assert!(report.settled.is_ok(), "{report:?}");
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }));
    }
    {
        let (pool, stop) = (pool.clone(), stop.clone());
        settlers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                settle_behind(&pool, &consumer(), chrono::Utc::now(), WAIT, 3)
                    .await
                    .expect("a manual settle");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..8usize {
        let (pool, jobs) = (pool.clone(), jobs.clone());
        writers.push(tokio::spawn(async move {
            let mode = MODES[w % 2];
            let h = harness(&pool, mode);
            let mut pure = Vec::new();
            let mut others = Vec::new();
            let mut spelled = Vec::new();
            for b in 0..10usize {
                let mut batch = Vec::new();
                for r in 0..10usize {
                    let (j, t) = jobs[(w * 7 + b * 3 + r) % jobs.len()];
                    let m = match (r + b + w) % 5 {
                        0 => valid(j, t),
                        1 => {
                            let m = message_on("jobs", &poison_spelling_a(j, t), 1);
                            spelled.push((j, m.message_id.clone()));
                            m
                        }
                        2 => {
                            let m = poison_of(j, t, "other");
                            others.push(m.message_id.clone());
                            m
                        }
                        _ => {
                            let m = poison();
                            pure.push(m.message_id.clone());
                            m
                        }
                    };
                    batch.push(m);
                }
                let outcomes = shared_testkit::run_batch(&h, &batch).await;
                for (m, o) in batch.iter().zip(&outcomes) {
                    assert!(
                        o.is_ack() || matches!(o, RecordOutcome::Contended { .. }),
                        "{mode:?} {}: {o:?}",
                        m.body
                    );
                }
            }
            (pure, others, spelled)
        }));
    }
    let mut pure = Vec::new();
    let mut others = Vec::new();
    let mut spelled = Vec::new();
    for w in writers {
        let (p, o, s) = w.await.unwrap();
        pure.extend(p);
        others.extend(o);
        spelled.extend(s);
    }
    stop.store(true, Ordering::SeqCst);
    for s in settlers {
        s.await.unwrap();
    }
    settle_all(&pool).await;
    for m in &pure {
        assert_eq!(
            letters_of_message(&pool, m).await.len(),
            1,
            "a poison message without exactly one letter"
        );
    }
    for m in &others {
        let letters = letters_of_message(&pool, m).await;
        assert_eq!(letters.len(), 1, "another job under an id: {letters:?}");
        assert_eq!(letters[0].2, "pending_review", "{letters:?}");
    }
    for (j, m) in &spelled {
        let letters = letters_of_message(&pool, m).await;
        assert!(letters.len() <= 1);
        if awards(&pool, *j).await == 1 {
            assert!(
                letters.iter().all(|l| l.2 != "pending_review"),
                "a pending letter of a copy of a job that committed: {letters:?}"
            );
        }
    }
    for (j, _) in jobs.iter() {
        assert!(awards(&pool, *j).await <= 1);
    }
    promises_hold(&pool).await;
}

/// Volume: 5,000 poison records from eight concurrent writers (batch mode, batches of ten),
/// then everything settled: exactly 5,000 letters, one group counting 5,000, the intake empty.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn five_thousand_poison_records_from_eight_writers_settle_into_five_thousand_letters(
    pool: PgPool,
) {
    let mut writers = Vec::new();
    for _ in 0..8 {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            let h = harness(&pool, CommitMode::Batch);
            let mut sent = Vec::new();
            let mut left = 625usize;
            while left > 0 {
                let n = left.min(10);
                let batch: Vec<_> = (0..n).map(|_| poison()).collect();
                run(&h, &batch).await;
                sent.extend(batch.into_iter().map(|m| m.message_id));
                left -= n;
            }
            sent
        }));
    }
    let mut sent = HashSet::new();
    for w in writers {
        sent.extend(w.await.unwrap());
    }
    assert_eq!(sent.len(), 5_000);
    let report = scheduled_run(&pool).run(None).await;
    assert!(report.settled.is_ok(), "{report:?}");
    settle_all(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        5_000
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT message_id) FROM core.dead_letters"
        )
        .await,
        5_000
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letter_groups").await,
        1
    );
    assert_eq!(
        count(
            &pool,
            "SELECT letter_count FROM core.dead_letter_groups_counted"
        )
        .await,
        5_000
    );
    promises_hold(&pool).await;
}

/// A job whose fence is held by a copy inside its transaction, and several poison copies of it
/// (other payloads) in a batch beside other poison: the settle round's claims wait within one
/// wait in all (0029's correction 5), so the batch returns within a few waits, not one wait per
/// copy. The round's fallback, one row at a time, waits the whole wait for each copy again.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn poison_copies_of_a_held_job_keep_a_batch_within_a_few_lock_waits(pool: PgPool) {
    let wait = Duration::from_secs(1);
    let h = harness_waiting(&pool, CommitMode::Batch, wait);
    let (j, t) = new_job();
    let copy =
        copy_inside_its_transaction(&pool, j, t, &digest_of(&envelope(j, t, "c", award("a", 5))))
            .await;
    let mut batch: Vec<_> = (0..8).map(|_| poison_of(j, t, "x")).collect();
    batch.push(poison());
    batch.push(poison());
    let started = Instant::now();
    let outcomes = shared_testkit::run_batch(&h, &batch).await;
    let took = started.elapsed();
    copy.rollback().await.unwrap();
    assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
    assert!(
        took < wait * 4,
        "a batch whose poison copies' job was held took {took:?}, {} lock waits of {wait:?}",
        took.as_secs_f64() / wait.as_secs_f64()
    );
    settle_all(&pool).await;
    for m in &batch {
        assert_eq!(letters_of_message(&pool, &m.message_id).await.len(), 1);
    }
    promises_hold(&pool).await;
}

// =============================================================================================
// The boundary.

/// What PostgreSQL could refuse, through the intake: a body at SQS's size, a NUL escape, a raw
/// NUL byte, a lone surrogate escape, message ids of 5,000 characters (and one with a NUL), a
/// queue name of 1,000, a correlation id of 20,000, an error of 8,000 (an unknown key). Both
/// modes; then the same bodies through the DLQ ingester, in FIFO message groups of every shape.
/// Each record one letter, nothing handed back or left received.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn boundary_values_through_the_intake_each_get_one_letter(pool: PgPool) {
    let bodies = |job: JobId| -> Vec<String> {
        let raw = |correlation: &str, payload: &str| {
            format!(
                r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":{correlation},"payload":{payload}}}"#,
                job.0,
                Uuid::new_v4()
            )
        };
        vec![
            raw(
                r#""c""#,
                &format!(
                    r#"{{"account_id":"a","points":"x","note":"{}"}}"#,
                    "n".repeat(250_000)
                ),
            ),
            raw(r#""c""#, r#"{"account_id":"a\u0000b","points":1}"#),
            format!("{{\"job_id\":\"{}\",\"x\":\"a\0b\"}}", job.0),
            raw(r#""c""#, r#"{"account_id":"\ud800","points":1}"#),
            raw(
                &format!("\"{}\"", "c".repeat(20_000)),
                r#"{"account_id":"a","points":"x"}"#,
            ),
            raw(
                r#""c""#,
                &format!(
                    r#"{{"account_id":"a","points":1,"{}":1}}"#,
                    "k".repeat(8_000)
                ),
            ),
            raw(r#""c""#, r#"{"account_id":"a","points":1e999999}"#),
            "\u{feff}{}".into(),
        ]
    };
    for mode in MODES {
        let h = harness(&pool, mode);
        let mut batch: Vec<IncomingMessage> = bodies(JobId(Uuid::new_v4()))
            .iter()
            .map(|b| message_on("jobs", b, 1))
            .collect();
        batch[0].message_id = format!("{}{}", "m".repeat(5_000), Uuid::new_v4());
        batch[1].message_id = format!("nul\0{}", Uuid::new_v4());
        batch[2].queue = "q".repeat(1_000);
        let before = count(&pool, "SELECT count(*) FROM core.dead_letters").await;
        let outcomes = run(&h, &batch).await;
        for (i, o) in outcomes.iter().enumerate() {
            assert!(
                matches!(o, RecordOutcome::DeadLettered { .. }),
                "{mode:?} {i}: {o:?}"
            );
        }
        settle_all(&pool).await;
        assert_eq!(
            count(&pool, "SELECT count(*) FROM core.dead_letters").await - before,
            batch.len() as i64,
            "{mode:?}: one letter per record"
        );
        // Redelivered as first deliveries: nothing more.
        run(&h, &batch).await;
        settle_all(&pool).await;
        assert_eq!(
            count(&pool, "SELECT count(*) FROM core.dead_letters").await - before,
            batch.len() as i64,
            "{mode:?}: a redelivery wrote another letter"
        );
        promises_hold(&pool).await;
    }
    // The DLQ ingester, FIFO groups of every shape.
    let groups = [
        "g".repeat(128),
        "g".repeat(129),
        "a group with spaces".to_owned(),
        "grüppe".to_owned(),
        String::new(),
        "g\0g".to_owned(),
        "ok-group".to_owned(),
        "x".repeat(5_000),
    ];
    let records: Vec<SqsMessage> = bodies(JobId(Uuid::new_v4()))
        .iter()
        .zip(&groups)
        .enumerate()
        .map(|(i, (b, g))| {
            let id = if i == 0 {
                format!("{}{}", "d".repeat(3_000), Uuid::new_v4())
            } else {
                Uuid::new_v4().to_string()
            };
            dlq_record(&id, b, Some(g))
        })
        .collect();
    let before = count(&pool, "SELECT count(*) FROM core.dead_letters").await;
    let response = ingester(&pool, &[]).ingest(records.clone()).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "{:?}",
        failed_ids(&response)
    );
    settle_all(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await - before,
        records.len() as i64
    );
    let response = ingester(&pool, &[]).ingest(records.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    settle_all(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await - before,
        records.len() as i64,
        "a DLQ redelivery wrote another letter"
    );
    promises_hold(&pool).await;
}

/// The intake's INSERT refused by PostgreSQL (injected: a trigger that raises for one body):
/// the batch's poison falls back to a letter each, written alone; nothing is lost, nothing left
/// received. The harness in both modes, and the DLQ ingester.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_intake_insert_postgresql_refuses_loses_no_record(pool: PgPool) {
    sqlx::raw_sql(
        "CREATE FUNCTION public.refuse_intake() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.body LIKE '%refuse-intake%' THEN
                 RAISE EXCEPTION 'refused' USING ERRCODE = '22023';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_intake BEFORE INSERT ON core.letter_intake
             FOR EACH ROW EXECUTE FUNCTION public.refuse_intake();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let refused = |job: JobId| {
        envelope(
            job,
            TenantId(Uuid::new_v4()),
            "refuse-intake",
            json!({"account_id": "a", "points": "x"}),
        )
    };
    for mode in MODES {
        let h = harness(&pool, mode);
        let (j, t) = new_job();
        let mut batch: Vec<_> = (0..5).map(|_| poison()).collect();
        batch.push(message_on("jobs", &refused(JobId(Uuid::new_v4())), 1));
        batch.push(valid(j, t));
        let outcomes = run(&h, &batch).await;
        assert_eq!(outcomes[6], RecordOutcome::Processed, "{mode:?}");
        for m in &batch[..6] {
            assert_eq!(
                letters_of_message(&pool, &m.message_id).await.len(),
                1,
                "{mode:?}: a record lost when its intake was refused"
            );
        }
        promises_hold(&pool).await;
    }
    let records = vec![
        dlq_record(&Uuid::new_v4().to_string(), "not json", None),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &refused(JobId(Uuid::new_v4())),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(
                JobId(Uuid::new_v4()),
                TenantId(Uuid::new_v4()),
                "c",
                award("a", 1),
            ),
            None,
        ),
    ];
    let response = ingester(&pool, &[]).ingest(records.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    for r in &records {
        let id = r.message_id.as_deref().unwrap();
        assert_eq!(letters_of_message(&pool, id).await.len(), 1);
    }
    promises_hold(&pool).await;
}

// =============================================================================================
// The DLQ ingester.

/// A DLQ batch of redriven messages: poison, a crash of a job that never ran, a crash after
/// two executions, an exhausted job, copies of a committed job (in two spellings), another job
/// under a committed id, and one message delivered twice. Exactly one letter each, none for the
/// committed job's copies, a conflict for the other job; nothing reported failed. Then the same
/// batch while a settler works, then settled: nothing more.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_dlq_batch_of_every_kind_gets_one_letter_each_and_none_for_committed_jobs(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch);
    let (done, td) = new_job();
    assert_eq!(
        run(&h, &[valid(done, td)]).await[0],
        RecordOutcome::Processed
    );
    let (ran, tr) = new_job();
    e2e::charge_executions(&pool, ran, 2, None).await;
    let (spent, ts) = new_job();
    e2e::charge_executions(&pool, spent, 5, Some("provider said no")).await;
    let (never, tn) = new_job();
    let twice = Uuid::new_v4().to_string();
    let records = vec![
        dlq_record(&Uuid::new_v4().to_string(), "[not an envelope", None),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(never, tn, "c", award("a", 1)),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(ran, tr, "c", award("a", 1)),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(spent, ts, "c", award("a", 1)),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(done, td, "c", award("a", 5)),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &valid_spelled_otherwise(done, td),
            None,
        ),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(done, td, "c", award("zz", 9)),
            None,
        ),
        dlq_record(&twice, &envelope(never, tn, "c", award("b", 2)), None),
        dlq_record(&twice, &envelope(never, tn, "c", award("b", 2)), None),
    ];
    let response = ingester(&pool, &[]).ingest(records.clone()).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "{:?}",
        failed_ids(&response)
    );
    settle_all(&pool).await;
    let kind_of = |i: usize| {
        let pool = pool.clone();
        let id = records[i].message_id.clone().unwrap();
        async move { letters_of_message(&pool, &id).await }
    };
    assert_eq!(kind_of(0).await[0].1, "poison");
    assert_eq!(kind_of(1).await[0].1, "crashed");
    assert_eq!(kind_of(2).await[0].1, "crashed");
    assert_eq!(kind_of(3).await[0].1, "exhausted");
    assert!(kind_of(4).await.is_empty(), "a letter of a committed job");
    assert!(kind_of(5).await.is_empty(), "a letter of a committed job");
    assert_eq!(kind_of(7).await.len(), 1);
    assert_eq!(awards(&pool, done).await, 1);

    let held = hold_settle_lock(&pool).await;
    let response = ingester(&pool, &[]).ingest(records.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    held.rollback().await.unwrap();
    let again = settle_all(&pool).await;
    assert_eq!(again.new_letters, 0, "{again:?}");
    // Another job under the committed id, redriven without an execution (it never ran): its
    // conflict letter (0 attempts) is refused by dead_letters_attempts_check, yet its record
    // was acked.
    assert_eq!(
        kind_of(6).await.len(),
        1,
        "acked without a letter; {} row(s) stay received",
        intake_rows(&pool).await
    );
    promises_hold(&pool).await;
}

/// The DLQ ingester with a settle due (`LETTER_SETTLE_DUE_MS`, as the consumer's): in a stream of
/// redriven jobs, a batch that finds a letter of its consumer written less than the due ago is
/// acked with its rows received, and the first batch that finds them due settles them with its
/// own. Every row becomes the letter its job's ledger says (read once per batch): `exhausted`
/// after five recorded failures, `crashed` otherwise, none for a job that committed meanwhile.
/// Time is the ingester's clock.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_ingester_with_a_settle_due_leaves_a_streams_rows_to_the_batch_that_finds_them_due(
    pool: PgPool,
) {
    use shared::dead_letter::SETTLE_DUE;
    let clock = Arc::new(shared::clock::ManualClock::new(chrono::Utc::now()));
    let ingester = DlqIngester {
        settle_due: SETTLE_DUE,
        clock: clock.clone(),
        ..ingester(&pool, &[])
    };
    // Three batches of four: a job spent on recorded failures, one that crashed twice, one that
    // never ran, poison.
    let mut expected = Vec::new();
    let mut batches = Vec::new();
    for _ in 0..3 {
        let (spent, ts) = new_job();
        e2e::charge_executions(&pool, spent, 5, Some("provider said no")).await;
        let (ran, tr) = new_job();
        e2e::charge_executions(&pool, ran, 2, None).await;
        let (never, tn) = new_job();
        let batch = vec![
            (envelope(spent, ts, "c", award("a", 1)), "exhausted"),
            (envelope(ran, tr, "c", award("a", 1)), "crashed"),
            (envelope(never, tn, "c", award("a", 1)), "crashed"),
            ("[not an envelope".to_owned(), "poison"),
        ];
        let records: Vec<SqsMessage> = (batch.iter())
            .map(|(body, _)| dlq_record(&Uuid::new_v4().to_string(), body, None))
            .collect();
        expected.extend(
            records
                .iter()
                .zip(&batch)
                .map(|(r, (_, kind))| (r.message_id.clone().unwrap(), *kind)),
        );
        batches.push(records);
    }
    let ingest = |records: Vec<SqsMessage>| {
        let ingester = &ingester;
        async move {
            let response = ingester.ingest(records).await;
            assert!(
                response.batch_item_failures.is_empty(),
                "{:?}",
                failed_ids(&response)
            );
        }
    };
    // Alone: settled before it acks.
    ingest(batches[0].clone()).await;
    assert_eq!(intake_rows(&pool).await, 0);
    // A letter was just written: left for the batch that finds it due.
    clock.advance(chrono::Duration::milliseconds(10));
    ingest(batches[1].clone()).await;
    assert_eq!(intake_rows(&pool).await, 4, "acked with its rows received");
    for record in &batches[1] {
        let id = record.message_id.clone().unwrap();
        assert!(letters_of_message(&pool, &id).await.is_empty());
    }
    // Due: this batch's round takes the rows left and its own.
    clock.advance(chrono::Duration::from_std(SETTLE_DUE).unwrap());
    ingest(batches[2].clone()).await;
    assert_eq!(intake_rows(&pool).await, 0);
    for (id, kind) in &expected {
        let letters = letters_of_message(&pool, id).await;
        assert_eq!(letters.len(), 1, "{id}: {letters:?}");
        assert_eq!(letters[0].1, *kind, "{id}");
    }
    promises_hold(&pool).await;
}

/// A crashed copy whose job never ran (no execution charged: its letter says 0 attempts) under
/// the id of another job that committed: its letter becomes a `conflict`. Beside another record
/// in a DLQ batch it goes through the intake: the record must not be acked unless its letter is
/// (or will be) written; and every received row must settle.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_crashed_copy_that_never_ran_under_another_jobs_committed_id_is_never_acked_without_its_letter(
    pool: PgPool,
) {
    let h = harness(&pool, CommitMode::Batch);
    let (j, t) = new_job();
    assert_eq!(run(&h, &[valid(j, t)]).await[0], RecordOutcome::Processed);
    let crashed = dlq_record(
        &Uuid::new_v4().to_string(),
        &envelope(j, t, "c", award("other", 7)),
        None,
    );
    let beside = dlq_record(&Uuid::new_v4().to_string(), "not json", None);
    let response = ingester(&pool, &[])
        .ingest(vec![crashed.clone(), beside.clone()])
        .await;
    let failed = failed_ids(&response);
    // Later settlers (a writer, the scheduled run) take what is left.
    let _ = settle_all(&pool).await;
    let report = scheduled_run(&pool).run(None).await;
    let id = crashed.message_id.clone().unwrap();
    let letters = letters_of_message(&pool, &id).await;
    assert!(
        failed.contains(&id) || letters.len() == 1,
        "the record was acked (not reported failed: {failed:?}) and has no letter; \
         {} row(s) stay received; scheduled: {:?}",
        intake_rows(&pool).await,
        report.settled
    );
    assert_eq!(
        intake_rows(&pool).await,
        0,
        "a received row that can never be settled"
    );
    promises_hold(&pool).await;
}

/// The same crashed copy (no execution, another job committed under its id) alone in its DLQ
/// batch (the one-letter path, no intake): its conflict letter is written.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_crashed_copy_that_never_ran_under_another_jobs_committed_id_gets_its_conflict_letter_alone(
    pool: PgPool,
) {
    let h = harness(&pool, CommitMode::Batch);
    let (j, t) = new_job();
    assert_eq!(run(&h, &[valid(j, t)]).await[0], RecordOutcome::Processed);
    let crashed = dlq_record(
        &Uuid::new_v4().to_string(),
        &envelope(j, t, "c", award("other", 7)),
        None,
    );
    let response = ingester(&pool, &[]).ingest(vec![crashed.clone()]).await;
    let id = crashed.message_id.clone().unwrap();
    let letters = letters_of_message(&pool, &id).await;
    assert_eq!(
        letters.len(),
        1,
        "no conflict letter for a job that never ran (failed: {:?}): every redelivery of it fails the same way",
        failed_ids(&response)
    );
    assert_eq!(letters[0].1, "conflict");
    promises_hold(&pool).await;
}

/// A consumer naming its job fields: a DLQ batch whose first record has no digest (not JSON)
/// and whose second is a job. The job's letter keeps the fields its digest covers, as it does
/// when written alone: else the API digests an operator's edit over the whole payload, unlike
/// the harness, and the letter's own body no longer digests to its `job_digest`.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_settled_beside_one_without_a_digest_keeps_its_digest_fields(pool: PgPool) {
    let fields = ["account_id"];
    let (alone_job, ta) = new_job();
    let alone = dlq_record(
        &Uuid::new_v4().to_string(),
        &envelope(alone_job, ta, "c", award("a", 1)),
        None,
    );
    let response = ingester(&pool, &fields).ingest(vec![alone]).await;
    assert!(response.batch_item_failures.is_empty());
    let (j, t) = new_job();
    let records = vec![
        dlq_record(&Uuid::new_v4().to_string(), "not json", None),
        dlq_record(
            &Uuid::new_v4().to_string(),
            &envelope(j, t, "c", award("a", 1)),
            None,
        ),
    ];
    let response = ingester(&pool, &fields).ingest(records).await;
    assert!(response.batch_item_failures.is_empty());
    settle_all(&pool).await;
    let of = |job: JobId| {
        let pool = pool.clone();
        async move {
            shared::dead_letter::letters_for_job(&pool, job, &consumer())
                .await
                .unwrap()
                .remove(0)
        }
    };
    let alone = of(alone_job).await;
    assert_eq!(
        alone.digest_fields.as_deref(),
        Some(&["account_id".to_owned()][..]),
        "written alone"
    );
    let together = of(j).await;
    assert_eq!(
        together.digest_fields, alone.digest_fields,
        "the letter settled from the intake lost its digest fields"
    );
    assert_eq!(
        together
            .digest_of_body(together.body.as_deref().unwrap_or_default())
            .map(|d| d.0.to_vec()),
        together.job_digest.clone(),
        "the letter's own body does not digest to its job_digest"
    );
    promises_hold(&pool).await;
}

// =============================================================================================
// Per-job mode.

/// Per-job mode, mixed batches while a settler works and while none does: the valid jobs each
/// applied once (concurrently), the poison one letter each, a poison copy beside its own valid
/// job (same digest) none pending, another job under a valid job's id one letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn per_job_mode_with_mixed_batches_keeps_both_promises(pool: PgPool) {
    let h = harness(&pool, CommitMode::PerJob);
    for busy in [false, true] {
        let held = if busy {
            Some(hold_settle_lock(&pool).await)
        } else {
            None
        };
        let (a, ta) = new_job();
        let (b, tb) = new_job();
        let pure: Vec<_> = (0..4).map(|_| poison()).collect();
        let spelled = message_on("jobs", &poison_spelling_b(a, ta), 1);
        let other = poison_of(b, tb, "other");
        let mut batch = pure.clone();
        batch.extend([
            spelled.clone(),
            valid(a, ta),
            other.clone(),
            valid(b, tb),
            valid(a, ta),
        ]);
        let outcomes = run(&h, &batch).await;
        if let Some(held) = held {
            held.rollback().await.unwrap();
        }
        settle_all(&pool).await;
        assert_eq!(awards(&pool, a).await, 1, "busy {busy}: {outcomes:?}");
        assert_eq!(awards(&pool, b).await, 1, "busy {busy}");
        for m in &pure {
            assert_eq!(letters_of_message(&pool, &m.message_id).await.len(), 1);
        }
        let of_other = letters_of_message(&pool, &other.message_id).await;
        assert_eq!(of_other.len(), 1, "busy {busy}: {of_other:?}");
        assert_eq!(of_other[0].2, "pending_review");
        let of_spelled = letters_of_message(&pool, &spelled.message_id).await;
        assert!(
            of_spelled.iter().all(|l| l.2 != "pending_review"),
            "busy {busy}: {of_spelled:?}"
        );
        promises_hold(&pool).await;
    }
}

/// Settled outcomes: a writer that settled its own rows answers each with its letter (new),
/// never as received; a row it found already settled by another is not lost from its answer.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_writer_that_settles_its_own_rows_answers_each_with_its_letter(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch);
    let batch: Vec<_> = (0..6).map(|_| poison()).collect();
    let outcomes = run(&h, &batch).await;
    for (m, o) in batch.iter().zip(&outcomes) {
        let letters = letters_of_message(&pool, &m.message_id).await;
        match o {
            RecordOutcome::DeadLettered {
                letter: Recorded::New(id),
                ..
            } => assert_eq!(letters[0].0, id.0),
            other => panic!("{other:?}"),
        }
    }
    let _ = Settled::AlreadyProcessed;
    promises_hold(&pool).await;
}

// =============================================================================================
// Memory.

/// This process's resident memory, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// A storm of poison at SQS's body size (250 KB) left received, then one settle round: a
/// consumer (and the scheduled function) runs in 256 MB (template.yaml `MemorySize: 256`), so a
/// round must not take hundreds of megabytes, or every settler that takes the lock dies of it
/// (and with it the valid jobs of its batch), and the rows are never settled. Measured as this
/// process's resident memory, sampled while the rounds run (before the fix: 840 MB in one).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_settle_round_of_big_poison_bodies_fits_a_256_mb_function(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch);
    let held = hold_settle_lock(&pool).await;
    let note = "n".repeat(250_000);
    for _ in 0..50 {
        let batch: Vec<_> = (0..10)
            .map(|_| {
                let (j, t) = new_job();
                let body = envelope(
                    j,
                    t,
                    "c",
                    json!({"account_id": "a", "points": "x", "note": note}),
                );
                message_on("jobs", &body, 1)
            })
            .collect();
        run(&h, &batch).await;
    }
    held.rollback().await.unwrap();
    assert_eq!(intake_rows(&pool).await, 500);
    let baseline = resident();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(resident(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Rounds are bounded by their bodies' bytes (SETTLE_ROUND_BYTES), so the 500 take several.
    let round = settle_behind(&pool, &consumer(), chrono::Utc::now(), WAIT, usize::MAX)
        .await
        .expect("the rounds");
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::SeqCst).saturating_sub(baseline);
    assert_eq!(round.new_letters, 500);
    assert!(
        grew < 160 << 20,
        "settling grew this process by {} MB (a 256 MB function)",
        grew >> 20
    );
    promises_hold(&pool).await;
}
