//! An outside attack on the DLQ ingester's batch path (commit 4346d8a): every redriven job's
//! ledger read in one statement per batch (`shared::ledger::ledgers_of`), then each record
//! judged; and the consumer's settle due (`settle_due`, `LETTER_SETTLE_DUE_MS`): with a due, a
//! batch that finds its consumer's newest letter younger than the due is acked with its rows
//! left received, for a later batch or the scheduled function's operations invocation.
//!
//! Real PostgreSQL, the library's `DlqIngester`, harness and settlers; real concurrency (tokio
//! tasks on pools of their own); the ingester's clock frozen, moved back and moved on.
//!
//! Every test checks the promises in SQL: exactly one letter per (consumer, message id) of the
//! right kind (or a received row that a later settle turns into exactly one), no pending letter
//! for a job that committed as the same job, a `conflict` letter for another job under a
//! committed id, the intake empty after the final settle, `e2e::promises::both_hold`.

// The operations invocation's settle (`settle_received_and_page`) is a deep future.
#![recursion_limit = "256"]

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use chrono::{DateTime, Utc};
use consumer::{AwardPoints, count_awards};
use e2e::intake_kit::{
    copy_inside_its_transaction, hold_settle_lock, scheduled_run, settle_all,
    until_a_session_waits_on_a_lock,
};
use serde_json::{Value, json};
use shared::clock::{ManualClock, SystemClock};
use shared::dead_letter::SETTLE_DUE;
use shared::dlq_ingester::DlqIngester;
use shared::envelope::JobDigest;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(5);
const DUES: [Duration; 2] = [Duration::ZERO, SETTLE_DUE];

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

/// The reference consumer's letters of `message_id`: (kind, status, attempts).
async fn letters_of_message(pool: &PgPool, message_id: &str) -> Vec<(String, String, i32)> {
    sqlx::query_as(
        "SELECT error_kind, status, attempts FROM core.dead_letters
          WHERE consumer = $1 AND message_id = $2 ORDER BY created_at, id",
    )
    .bind(consumer().as_str())
    .bind(message_id)
    .fetch_all(pool)
    .await
    .expect("reading a message's letters")
}

async fn intake_rows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM core.letter_intake").await
}

async fn awards(pool: &PgPool, job: JobId) -> i64 {
    count_awards(pool, job).await.expect("counting awards")
}

/// The promises over the whole database, and the intake empty.
async fn promises_hold(pool: &PgPool) {
    e2e::promises::both_hold(pool).await;
    assert_eq!(
        intake_rows(pool).await,
        0,
        "a received row was never settled"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM (SELECT 1 FROM core.dead_letters
               GROUP BY consumer, message_id HAVING count(*) > 1) twice"
        )
        .await,
        0,
        "two letters for one message"
    );
}

/// What a redriven message must end as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Exactly one letter, of this kind, saying this many attempts.
    Letter(&'static str, i32),
    /// Exactly one letter, of one of these kinds (who settled it first decides).
    OneOf(&'static str, &'static str),
    /// No pending letter (its job committed as the same job): none, or one its commit closed.
    NonePending,
}

async fn check(pool: &PgPool, message_id: &str, want: Want) {
    let letters = letters_of_message(pool, message_id).await;
    match want {
        Want::Letter(kind, attempts) => {
            assert_eq!(
                letters.len(),
                1,
                "{message_id} wants one {kind}: {letters:?}"
            );
            assert_eq!(
                (letters[0].0.as_str(), letters[0].2),
                (kind, attempts),
                "{message_id}: {letters:?}"
            );
        }
        Want::OneOf(a, b) => {
            assert_eq!(
                letters.len(),
                1,
                "{message_id} wants one letter: {letters:?}"
            );
            assert!(
                letters[0].0 == a || letters[0].0 == b,
                "{message_id} wants {a} or {b}: {letters:?}"
            );
        }
        Want::NonePending => {
            assert!(letters.len() <= 1, "{message_id}: {letters:?}");
            assert!(
                letters.iter().all(|l| l.1 != "pending_review"),
                "{message_id}: a pending letter of a job that committed as the same job: {letters:?}"
            );
        }
    }
}

async fn check_all(pool: &PgPool, wants: &[(String, Want)]) {
    for (id, want) in wants {
        check(pool, id, *want).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies, records, ledgers.

fn new_job() -> (JobId, TenantId) {
    (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()))
}

fn award(account: &str, points: i64) -> Value {
    json!({"account_id": account, "points": points})
}

fn new_id() -> String {
    Uuid::new_v4().to_string()
}

/// `job`'s body as the reference harness's `valid` sends it.
fn valid_body(job: JobId, tenant: TenantId) -> String {
    envelope(job, tenant, "c", award("a", 5))
}

/// The same job as [`valid_body`], spelled otherwise: keys reordered, whitespace, the id
/// upper-cased, another correlation id (not part of the digest).
fn spelled_otherwise(job: JobId, tenant: TenantId) -> String {
    format!(
        "{{\n \"payload\": {{\"points\": 5, \"account_id\": \"a\"}},\n \"correlation_id\": \"other\",\n \"tenant_id\": \"{}\",\n \"job_id\": \"{}\"\n}}",
        tenant.0,
        job.0.to_string().to_uppercase()
    )
}

/// Poison that names `job` and has the digest of [`valid_body`]: its correlation id is no string.
fn poison_naming(job: JobId, tenant: TenantId) -> String {
    format!(
        r#"{{"job_id":"{}","correlation_id":7,"tenant_id":"{}","payload":{{"account_id":"a","points":5}}}}"#,
        job.0, tenant.0
    )
}

/// Poison that names `job` twice (a repeated key: no ids are read from it).
fn poison_with_a_repeated_job_id(job: JobId, tenant: TenantId) -> String {
    format!(
        r#"{{"job_id":"{j}","job_id":"{j}","tenant_id":"{}","correlation_id":"c","payload":{{"points":1}}}}"#,
        tenant.0,
        j = job.0
    )
}

fn digest_of(body: &str) -> JobDigest {
    let value: Value = serde_json::from_str(body).expect("JSON");
    JobDigest::of(&value, &[])
}

/// A record of the DLQ as Lambda delivers it, first sent at `sent`.
fn dlq_record_sent(message_id: &str, body: &str, sent: DateTime<Utc>) -> SqsMessage {
    serde_json::from_value(json!({
        "messageId": message_id,
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": sent.timestamp_millis().to_string(),
        },
        "messageAttributes": {},
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs-dlq",
        "eventSource": "aws:sqs",
    }))
    .expect("an SQS record")
}

/// A record of the DLQ, sent now.
fn dlq_record(message_id: &str, body: &str) -> SqsMessage {
    dlq_record_sent(message_id, body, Utc::now())
}

fn id_of(record: &SqsMessage) -> String {
    record.message_id.clone().expect("a message id")
}

fn failed_ids(response: &SqsBatchResponse) -> Vec<String> {
    (response.batch_item_failures.iter())
        .map(|f| f.item_identifier.clone())
        .collect()
}

/// Charges `job` a ledger row of `consumer_name` (any consumer, not only the reference one).
async fn ledger_row(
    pool: &PgPool,
    consumer_name: &str,
    job: JobId,
    executions: i32,
    last_error: Option<&str>,
) {
    sqlx::query(
        "INSERT INTO core.job_executions (job_id, consumer, executions, last_error, updated_at)
         VALUES ($1, $2, $3, $4, now())
         ON CONFLICT (job_id, consumer) DO UPDATE SET executions = $3, last_error = $4",
    )
    .bind(job.0)
    .bind(consumer_name)
    .bind(executions)
    .bind(last_error)
    .execute(pool)
    .await
    .expect("a ledger row");
}

/// `n` redriven records of new jobs, in turn: spent on recorded failures (`exhausted`, 5),
/// crashed after two executions (`crashed`, 2), never run (`crashed`, 0), not an envelope
/// (`poison`, 1); their ledgers charged in one statement.
async fn mixed_records(pool: &PgPool, n: usize) -> (Vec<SqsMessage>, Vec<(String, Want)>) {
    let mut records = Vec::with_capacity(n);
    let mut wants = Vec::with_capacity(n);
    let (mut jobs, mut executions, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (j, t) = new_job();
        let id = new_id();
        let (body, want) = match i % 4 {
            0 => {
                jobs.push(j.0);
                executions.push(5i32);
                errors.push(Some("provider said no"));
                (valid_body(j, t), Want::Letter("exhausted", 5))
            }
            1 => {
                jobs.push(j.0);
                executions.push(2i32);
                errors.push(None);
                (valid_body(j, t), Want::Letter("crashed", 2))
            }
            2 => (valid_body(j, t), Want::Letter("crashed", 0)),
            _ => (format!("[not an envelope {i}"), Want::Letter("poison", 1)),
        };
        records.push(dlq_record(&id, &body));
        wants.push((id, want));
    }
    sqlx::query(
        "INSERT INTO core.job_executions (job_id, consumer, executions, last_error, updated_at)
         SELECT j, $2, e, l, now() FROM unnest($1::uuid[], $3::int[], $4::text[]) AS u (j, e, l)",
    )
    .bind(&jobs)
    .bind(consumer().as_str())
    .bind(&executions)
    .bind(&errors)
    .execute(pool)
    .await
    .expect("charging the ledgers");
    (records, wants)
}

// ---------------------------------------------------------------------------------------------
// Ingesters, harnesses.

fn ingester(pool: &PgPool) -> DlqIngester {
    DlqIngester {
        pool: pool.clone(),
        consumer: consumer(),
        job_queue: "jobs".into(),
        max_receive_count: 7,
        max_attempts: 5,
        settle_wait: WAIT,
        fence_ttl: shared_testkit::FENCE_TTL,
        queue_retention: Duration::from_secs(3_600),
        job_fields: Vec::new(),
        settle_due: Duration::ZERO,
        clock: Arc::new(SystemClock),
        metrics: Default::default(),
        alerter: None,
    }
}

/// An ingester with `due` on a clock stopped now.
fn frozen_ingester(pool: &PgPool, due: Duration) -> (DlqIngester, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let ingester = DlqIngester {
        settle_due: due,
        clock: clock.clone(),
        ..ingester(pool)
    };
    (ingester, clock)
}

/// `records` through `ingester`, none reported failed.
async fn ingest_acked(ingester: &DlqIngester, records: Vec<SqsMessage>) {
    let response = ingester.ingest(records).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "reported failed: {:?}",
        failed_ids(&response)
    );
}

/// A letter of the consumer written at the ingester's now (a lone record is written at once,
/// whatever the due): the next batches find it fresh. Its message id.
async fn a_letter_just_written(ingester: &DlqIngester) -> String {
    let id = new_id();
    ingest_acked(ingester, vec![dlq_record(&id, "not json at all")]).await;
    id
}

fn harness(pool: &PgPool, due: Duration) -> Harness<AwardPoints> {
    let settings = HarnessSettings {
        commit: CommitMode::Batch,
        settle_due: due,
        ..shared_testkit::settings()
    };
    shared_testkit::harness_on(
        pool,
        AwardPoints::new(consumer()),
        settings,
        Arc::new(SystemClock),
    )
}

fn valid(job: JobId, tenant: TenantId) -> IncomingMessage {
    message_on("jobs", &valid_body(job, tenant), 1)
}

async fn commit_through_the_harness(pool: &PgPool, job: JobId, tenant: TenantId) {
    let outcomes =
        shared_testkit::run_batch(&harness(pool, Duration::ZERO), &[valid(job, tenant)]).await;
    assert_eq!(outcomes, vec![RecordOutcome::Processed]);
}

async fn own_pool(pool: &PgPool, max: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("a pool of its own")
}

// =============================================================================================
// Identity inside one batch.

/// One batch, with and without a due (with one: its rows left received, then settled): one job
/// id in five records (the same body under two message ids, the same body again under the first
/// message id, the job spelled otherwise, another job under its id, poison naming it, poison
/// naming it twice); a message id twice with two bodies; a job that never ran; a committed job's
/// copy, its poison spelling (its digest) and another job under its id; and ledgers that must be
/// read right: another consumer's row for a job (not this consumer's), a row of 0 executions with
/// an error, 7 executions ended without one, 4 with one, 5 with one beside another consumer's.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_batch_with_one_job_id_in_many_records_and_odd_ledgers_gets_one_right_letter_per_message(
    pool: PgPool,
) {
    for due in DUES {
        let (ingester, _clock) = frozen_ingester(&pool, due);
        let mut wants = Vec::new();
        let mut records = Vec::new();
        let mut add = |id: &str, body: String, want: Option<Want>| {
            records.push(dlq_record(id, &body));
            if let Some(want) = want {
                wants.push((id.to_owned(), want));
            }
        };
        // One job in many records, spent on recorded failures.
        let (j, tj) = new_job();
        ledger_row(&pool, consumer().as_str(), j, 5, Some("provider said no")).await;
        let (a, b) = (new_id(), new_id());
        add(&a, valid_body(j, tj), Some(Want::Letter("exhausted", 5)));
        add(&b, valid_body(j, tj), Some(Want::Letter("exhausted", 5)));
        add(&a, valid_body(j, tj), None);
        add(
            &new_id(),
            spelled_otherwise(j, tj),
            Some(Want::Letter("exhausted", 5)),
        );
        let other_under_j = envelope(j, tj, "c", award("zz", 9));
        add(&new_id(), other_under_j, Some(Want::Letter("exhausted", 5)));
        add(
            &new_id(),
            poison_naming(j, tj),
            Some(Want::Letter("poison", 1)),
        );
        add(
            &new_id(),
            poison_with_a_repeated_job_id(j, tj),
            Some(Want::Letter("poison", 1)),
        );
        // One message id, two bodies.
        let (k2, tk2) = new_job();
        let twice = new_id();
        add(
            &twice,
            "[not an envelope".into(),
            Some(Want::OneOf("poison", "crashed")),
        );
        add(&twice, valid_body(k2, tk2), None);
        // A job that never ran.
        let (k, tk) = new_job();
        add(
            &new_id(),
            valid_body(k, tk),
            Some(Want::Letter("crashed", 0)),
        );
        // A committed job: its copy, its poison spelling (same digest), another job under it.
        let (l, tl) = new_job();
        commit_through_the_harness(&pool, l, tl).await;
        add(&new_id(), valid_body(l, tl), Some(Want::NonePending));
        add(&new_id(), spelled_otherwise(l, tl), Some(Want::NonePending));
        add(&new_id(), poison_naming(l, tl), Some(Want::NonePending));
        let other_under_l = envelope(l, tl, "c", award("other", 7));
        add(&new_id(), other_under_l, Some(Want::Letter("conflict", 0)));
        // Odd ledgers.
        let (m, tm) = new_job();
        ledger_row(&pool, "another-consumer", m, 5, Some("not ours")).await;
        add(
            &new_id(),
            valid_body(m, tm),
            Some(Want::Letter("crashed", 0)),
        );
        let (n, tn) = new_job();
        ledger_row(
            &pool,
            consumer().as_str(),
            n,
            0,
            Some("an error, no execution"),
        )
        .await;
        add(
            &new_id(),
            valid_body(n, tn),
            Some(Want::Letter("crashed", 0)),
        );
        let (o, to) = new_job();
        ledger_row(&pool, consumer().as_str(), o, 7, None).await;
        add(
            &new_id(),
            valid_body(o, to),
            Some(Want::Letter("crashed", 7)),
        );
        let (p, tp) = new_job();
        ledger_row(&pool, consumer().as_str(), p, 4, Some("one short")).await;
        add(
            &new_id(),
            valid_body(p, tp),
            Some(Want::Letter("crashed", 4)),
        );
        let (q, tq) = new_job();
        ledger_row(&pool, consumer().as_str(), q, 5, Some("spent")).await;
        ledger_row(&pool, "another-consumer", q, 1, None).await;
        add(
            &new_id(),
            valid_body(q, tq),
            Some(Want::Letter("exhausted", 5)),
        );
        add(
            &new_id(),
            "[pure poison".into(),
            Some(Want::Letter("poison", 1)),
        );

        let fresh = if due.is_zero() {
            None
        } else {
            Some(a_letter_just_written(&ingester).await)
        };
        let n_records = records.len() as i64;
        ingest_acked(&ingester, records).await;
        if due.is_zero() {
            assert_eq!(intake_rows(&pool).await, 0, "settled behind its own rows");
        } else {
            assert_eq!(
                intake_rows(&pool).await,
                n_records,
                "a batch that found a fresh letter leaves its rows received"
            );
            let settled = settle_all(&pool).await;
            assert!(!settled.busy);
        }
        check_all(&pool, &wants).await;
        if let Some(fresh) = fresh {
            check(&pool, &fresh, Want::Letter("poison", 1)).await;
        }
        assert_eq!(awards(&pool, l).await, 1);
        // The ledgers of this consumer's lettered jobs went with their letters; the other
        // consumer's stayed.
        let ours: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM core.job_executions WHERE consumer = $1 AND job_id = ANY ($2)",
        )
        .bind(consumer().as_str())
        .bind([j.0, n.0, o.0, p.0, q.0])
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(ours, 0, "due {due:?}: a lettered job kept its ledger");
        let theirs: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM core.job_executions WHERE consumer = 'another-consumer'
               AND job_id = ANY ($1)",
        )
        .bind([m.0, q.0])
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            theirs, 2,
            "due {due:?}: another consumer's ledger was touched"
        );
        promises_hold(&pool).await;
    }
}

/// A job committing while its redriven copy is being settled: a copy inside its transaction
/// holds the job's fence while the ingester's claim waits; it commits (no letter) or rolls back
/// (a `crashed` letter). Alone in its batch and beside poison (through the intake). Then with a
/// due: the copy's row left received, the job committed through the harness, then settled: no
/// letter; its batch-mates' letters written.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_committing_while_its_redriven_copy_is_settled_gets_no_pending_letter(pool: PgPool) {
    let side = own_pool(&pool, 4).await;
    for beside_poison in [false, true] {
        for commits in [true, false] {
            let (j, t) = new_job();
            let body = valid_body(j, t);
            let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&body)).await;
            let id = new_id();
            let poison_id = new_id();
            let mut records = vec![dlq_record(&id, &body)];
            if beside_poison {
                records.push(dlq_record(&poison_id, "not json"));
            }
            let task = {
                let side = side.clone();
                tokio::spawn(async move { ingester(&side).ingest(records).await })
            };
            until_a_session_waits_on_a_lock(&pool).await;
            if commits {
                copy.commit().await.unwrap();
            } else {
                copy.rollback().await.unwrap();
            }
            let response = tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("the ingester returns")
                .unwrap();
            assert!(
                response.batch_item_failures.is_empty(),
                "{:?}",
                failed_ids(&response)
            );
            let case = format!("beside poison {beside_poison}, commits {commits}");
            if commits {
                assert!(letters_of_message(&pool, &id).await.is_empty(), "{case}");
                assert_eq!(awards(&pool, j).await, 1, "{case}");
            } else {
                check(&pool, &id, Want::Letter("crashed", 0)).await;
                assert_eq!(awards(&pool, j).await, 0, "{case}");
            }
            if beside_poison {
                check(&pool, &poison_id, Want::Letter("poison", 1)).await;
            }
            promises_hold(&pool).await;
        }
    }
    // With a due: left received, then the job commits, then settled.
    let (ingester, _clock) = frozen_ingester(&pool, SETTLE_DUE);
    a_letter_just_written(&ingester).await;
    let (j, t) = new_job();
    let (k, tk) = new_job();
    e2e::charge_executions(&pool, j, 5, Some("provider said no")).await;
    let (jid, kid, pid) = (new_id(), new_id(), new_id());
    ingest_acked(
        &ingester,
        vec![
            dlq_record(&jid, &valid_body(j, t)),
            dlq_record(&kid, &valid_body(k, tk)),
            dlq_record(&pid, "not json"),
        ],
    )
    .await;
    assert_eq!(intake_rows(&pool).await, 3);
    commit_through_the_harness(&pool, j, t).await;
    settle_all(&pool).await;
    check(&pool, &jid, Want::NonePending).await;
    assert!(letters_of_message(&pool, &jid).await.is_empty());
    check(&pool, &kid, Want::Letter("crashed", 0)).await;
    check(&pool, &pid, Want::Letter("poison", 1)).await;
    assert_eq!(awards(&pool, j).await, 1);
    promises_hold(&pool).await;
}

// =============================================================================================
// The ledger read.

/// The batch's one ledger read fails: a ledger row no `u32` can hold (its CHECK dropped to let
/// one in), and then the ingester's pool closed. Every record whose job needs the read is
/// reported failed (left in the DLQ) with no letter and no row; poison beside it is lettered;
/// the records redelivered once the ledger reads again each get their letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_batch_whose_ledger_read_fails_leaves_its_jobs_in_the_dlq_and_loses_nothing(
    pool: PgPool,
) {
    sqlx::raw_sql(
        "ALTER TABLE core.job_executions DROP CONSTRAINT job_executions_executions_check",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (x, tx) = new_job();
    ledger_row(&pool, consumer().as_str(), x, -1, None).await;
    let (j, tj) = new_job();
    e2e::charge_executions(&pool, j, 5, Some("provider said no")).await;
    let (k, tk) = new_job();
    let (xid, jid, kid, p1, p2) = (new_id(), new_id(), new_id(), new_id(), new_id());
    let records = vec![
        dlq_record(&xid, &valid_body(x, tx)),
        dlq_record(&p1, "not json"),
        dlq_record(&jid, &valid_body(j, tj)),
        dlq_record(&kid, &valid_body(k, tk)),
        dlq_record(&p2, "[nope"),
    ];
    let response = ingester(&pool).ingest(records.clone()).await;
    let failed: HashSet<String> = failed_ids(&response).into_iter().collect();
    // Whatever the ingester reports failed stays in the DLQ; what it acks must be lettered.
    assert!(
        failed.contains(&xid),
        "a job whose ledger is unreadable was acked"
    );
    for id in [&jid, &kid] {
        if failed.contains(id) {
            assert!(letters_of_message(&pool, id).await.is_empty());
        }
    }
    assert!(!failed.contains(&p1) && !failed.contains(&p2), "{failed:?}");
    check(&pool, &p1, Want::Letter("poison", 1)).await;
    check(&pool, &p2, Want::Letter("poison", 1)).await;
    assert!(letters_of_message(&pool, &xid).await.is_empty());
    assert_eq!(intake_rows(&pool).await, 0);
    // The ledger reads again: the failed records redelivered.
    ledger_row(&pool, consumer().as_str(), x, 1, None).await;
    let again: Vec<SqsMessage> = (records.iter())
        .filter(|r| failed.contains(&id_of(r)))
        .cloned()
        .collect();
    ingest_acked(&ingester(&pool), again).await;
    check(&pool, &xid, Want::Letter("crashed", 1)).await;
    check(&pool, &jid, Want::Letter("exhausted", 5)).await;
    check(&pool, &kid, Want::Letter("crashed", 0)).await;
    promises_hold(&pool).await;

    // The ingester's pool closed: every record reported failed, nothing written.
    let closed = own_pool(&pool, 2).await;
    closed.close().await;
    let (m, tm) = new_job();
    let (mid, qid) = (new_id(), new_id());
    let records = vec![
        dlq_record(&mid, &valid_body(m, tm)),
        dlq_record(&qid, "not json"),
    ];
    let response = ingester(&closed).ingest(records.clone()).await;
    let failed: HashSet<String> = failed_ids(&response).into_iter().collect();
    assert_eq!(failed, HashSet::from([mid.clone(), qid.clone()]));
    assert!(letters_of_message(&pool, &mid).await.is_empty());
    assert_eq!(intake_rows(&pool).await, 0);
    ingest_acked(&ingester(&pool), records).await;
    check(&pool, &mid, Want::Letter("crashed", 0)).await;
    check(&pool, &qid, Want::Letter("poison", 1)).await;
    promises_hold(&pool).await;
}

// =============================================================================================
// The due.

/// The ingester's clock frozen: the first batch (no letter yet) settles; every later batch finds
/// a letter 0 ms old and leaves its rows. The clock moved back an hour: a batch finds the
/// newest letter in its future and settles everything (as if alone). Moved on to half the due
/// past the newest letter: left; to exactly the due: settled. Frozen again: left, then the
/// scheduled function's operations invocation settles them. Every row one letter, of its kind.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_due_under_a_frozen_a_backward_and_a_forward_clock_leaves_nothing_unsettled(
    pool: PgPool,
) {
    let (ingester, clock) = frozen_ingester(&pool, SETTLE_DUE);
    let t0 = clock_now(&clock);
    let mut wants = Vec::new();
    // No letter yet: settled before it acks.
    let (records, w) = mixed_records(&pool, 8).await;
    wants.extend(w);
    ingest_acked(&ingester, records).await;
    assert_eq!(intake_rows(&pool).await, 0, "the first batch settles");
    // Frozen: ten batches within the due, each left.
    for i in 1..=10 {
        let (records, w) = mixed_records(&pool, 8).await;
        wants.extend(w);
        ingest_acked(&ingester, records).await;
        assert_eq!(intake_rows(&pool).await, 8 * i, "batch {i} left its rows");
    }
    // The clock moved back an hour: the newest letter is in its future; settled at once.
    clock.set(t0 - chrono::Duration::hours(1));
    let (records, w) = mixed_records(&pool, 8).await;
    wants.extend(w);
    ingest_acked(&ingester, records).await;
    assert_eq!(intake_rows(&pool).await, 0, "a clock moved back settles");
    check_all(&pool, &wants).await;
    // Half the due after the newest letter (written at t0): left.
    clock.set(t0 + chrono::Duration::milliseconds(500));
    let (records, w) = mixed_records(&pool, 8).await;
    wants.extend(w);
    ingest_acked(&ingester, records).await;
    assert_eq!(intake_rows(&pool).await, 8);
    // Exactly the due: settled, the rows left with it.
    clock.set(t0 + chrono::Duration::from_std(SETTLE_DUE).unwrap());
    let (records, w) = mixed_records(&pool, 8).await;
    wants.extend(w);
    ingest_acked(&ingester, records).await;
    assert_eq!(
        intake_rows(&pool).await,
        0,
        "a batch exactly the due after settles"
    );
    // Frozen there: left again, then the operations invocation.
    for _ in 0..3 {
        let (records, w) = mixed_records(&pool, 8).await;
        wants.extend(w);
        ingest_acked(&ingester, records).await;
    }
    assert_eq!(intake_rows(&pool).await, 24);
    let answer = scheduled_run(&pool)
        .settle_received_and_page(Duration::from_secs(20))
        .await;
    assert_eq!(
        intake_rows(&pool).await,
        0,
        "the operations settle: {answer}"
    );
    check_all(&pool, &wants).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        wants.len() as i64
    );
    promises_hold(&pool).await;
}

fn clock_now(clock: &ManualClock) -> DateTime<Utc> {
    use shared::clock::Clock;
    clock.now()
}

/// The due is its consumer's: a letter of another consumer written just now does not hold back
/// this consumer's batch; one of its own does.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn another_consumers_fresh_letter_does_not_hold_a_batch_back(pool: PgPool) {
    let (ours, clock) = frozen_ingester(&pool, SETTLE_DUE);
    let theirs = DlqIngester {
        consumer: ConsumerName::new("another-consumer").unwrap(),
        clock: clock.clone(),
        ..ingester(&pool)
    };
    let theirs_id = new_id();
    ingest_acked(&theirs, vec![dlq_record(&theirs_id, "not json")]).await;
    let (records, mut wants) = mixed_records(&pool, 4).await;
    ingest_acked(&ours, records).await;
    assert_eq!(
        intake_rows(&pool).await,
        0,
        "held back by another consumer's letter"
    );
    let (records, w) = mixed_records(&pool, 4).await;
    wants.extend(w);
    ingest_acked(&ours, records).await;
    assert_eq!(
        intake_rows(&pool).await,
        4,
        "not held back by its own letter"
    );
    settle_all(&pool).await;
    check_all(&pool, &wants).await;
    let of_theirs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE consumer = 'another-consumer' AND message_id = $1",
    )
    .bind(&theirs_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(of_theirs, 1);
    promises_hold(&pool).await;
}

// =============================================================================================
// Redelivery chains.

/// The same DLQ batch delivered again after lost acks, with and without a due: twice before it
/// is settled (with a due its rows wait twice over; without, the second finds a settler at work
/// and leaves its rows), settled, then again after. One letter each, of the kind its first
/// judgement said: the exhausted job stays `exhausted` with 5 attempts although its ledger went
/// with its letter (the redelivery judges it `crashed`, 0).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_dlq_batch_redelivered_before_and_after_its_settle_keeps_one_letter_per_message(
    pool: PgPool,
) {
    for due in DUES {
        let (ingester, clock) = frozen_ingester(&pool, due);
        let (j, tj) = new_job();
        e2e::charge_executions(&pool, j, 5, Some("provider said no")).await;
        let (k, tk) = new_job();
        e2e::charge_executions(&pool, k, 2, None).await;
        let (n, tn) = new_job();
        let (l, tl) = new_job();
        commit_through_the_harness(&pool, l, tl).await;
        let mut wants = Vec::new();
        let mut records = Vec::new();
        let mut add = |body: String, want: Want| {
            let id = new_id();
            records.push(dlq_record(&id, &body));
            wants.push((id, want));
        };
        add(valid_body(j, tj), Want::Letter("exhausted", 5));
        add(poison_naming(j, tj), Want::Letter("poison", 1));
        add(valid_body(k, tk), Want::Letter("crashed", 2));
        add(valid_body(n, tn), Want::Letter("crashed", 0));
        add("[not an envelope".into(), Want::Letter("poison", 1));
        add(valid_body(l, tl), Want::NonePending);
        add(
            envelope(l, tl, "c", award("other", 1)),
            Want::Letter("conflict", 0),
        );
        let len = records.len() as i64;

        if !due.is_zero() {
            a_letter_just_written(&ingester).await;
            ingest_acked(&ingester, records.clone()).await;
            ingest_acked(&ingester, records.clone()).await;
            assert_eq!(intake_rows(&pool).await, 2 * len, "due {due:?}");
        } else {
            ingest_acked(&ingester, records.clone()).await;
            assert_eq!(intake_rows(&pool).await, 0);
            check_all(&pool, &wants).await;
            let held = hold_settle_lock(&pool).await;
            ingest_acked(&ingester, records.clone()).await;
            held.rollback().await.unwrap();
            assert_eq!(intake_rows(&pool).await, len, "left to the settler at work");
        }
        settle_all(&pool).await;
        check_all(&pool, &wants).await;
        // Again after its settle (the ledgers are gone now), and again with the clock moved on.
        ingest_acked(&ingester, records.clone()).await;
        clock.advance(chrono::Duration::seconds(5));
        ingest_acked(&ingester, records.clone()).await;
        let again = settle_all(&pool).await;
        assert_eq!(again.new_letters, 0, "due {due:?}: {again:?}");
        check_all(&pool, &wants).await;
        assert_eq!(awards(&pool, l).await, 1);
        promises_hold(&pool).await;
    }
}

// =============================================================================================
// Concurrency.

/// Four ingesters, each a task on a pool of its own, with and without a due (real clock): each
/// ingests batches of its own redriven jobs, the same shared records (one SQS message delivered
/// to all four at once), and copies of committed jobs and of other jobs under their ids. Then
/// settled: one letter per message of the kind its ledger said, none for the committed copies,
/// a conflict for each other job.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn four_ingesters_on_their_own_pools_with_and_without_a_due_keep_one_letter_per_message(
    pool: PgPool,
) {
    for due in DUES {
        let (shared_records, shared_wants) = mixed_records(&pool, 24).await;
        let mut committed = Vec::new();
        for _ in 0..6 {
            let (l, tl) = new_job();
            commit_through_the_harness(&pool, l, tl).await;
            committed.push((l, tl));
        }
        let mut wants = shared_wants.clone();
        let mut plans = Vec::new();
        for w in 0..4usize {
            let (own, own_wants) = mixed_records(&pool, 96).await;
            wants.extend(own_wants);
            let mut batches = Vec::new();
            for b in 0..12usize {
                let mut batch: Vec<SqsMessage> = own[b * 8..(b + 1) * 8].to_vec();
                batch.push(shared_records[(b * 2) % 24].clone());
                batch.push(shared_records[(b * 2 + 1) % 24].clone());
                let (l, tl) = committed[(w + b) % committed.len()];
                let copy = new_id();
                batch.push(dlq_record(&copy, &valid_body(l, tl)));
                wants.push((copy, Want::NonePending));
                let other = new_id();
                batch.push(dlq_record(&other, &envelope(l, tl, "c", award("o", 1))));
                wants.push((other, Want::Letter("conflict", 0)));
                batches.push(batch);
            }
            plans.push(batches);
        }
        let mut tasks = Vec::new();
        for batches in plans {
            let own = own_pool(&pool, 3).await;
            tasks.push(tokio::spawn(async move {
                let ingester = DlqIngester {
                    settle_due: due,
                    ..ingester(&own)
                };
                for batch in batches {
                    ingest_acked(&ingester, batch).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        settle_all(&pool).await;
        check_all(&pool, &wants).await;
        for (l, _) in &committed {
            assert_eq!(awards(&pool, *l).await, 1);
        }
        promises_hold(&pool).await;
    }
}

/// Four ingesters with a due at once, their clocks skewed (an hour behind, ten minutes behind,
/// right, ten minutes ahead): each finds the newest letter in its past or its future, and
/// settles or leaves its rows accordingly. Once the operations-style settle has run: one letter
/// per message, of its kind, the intake empty.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn four_ingesters_with_a_due_on_skewed_clocks_leave_nothing_unsettled(pool: PgPool) {
    let skews = [-3_600i64, -600, 0, 600];
    let mut wants = Vec::new();
    let mut tasks = Vec::new();
    for skew in skews {
        let (records, w) = mixed_records(&pool, 80).await;
        wants.extend(w);
        let own = own_pool(&pool, 3).await;
        tasks.push(tokio::spawn(async move {
            let clock = Arc::new(ManualClock::new(
                Utc::now() + chrono::Duration::seconds(skew),
            ));
            let ingester = DlqIngester {
                settle_due: SETTLE_DUE,
                clock: clock.clone(),
                ..ingester(&own)
            };
            for batch in records.chunks(10) {
                ingest_acked(&ingester, batch.to_vec()).await;
                clock.advance(chrono::Duration::milliseconds(300));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    settle_all(&pool).await;
    check_all(&pool, &wants).await;
    promises_hold(&pool).await;
}

/// An ingester with a due beside the consumer's harness (without a due, then with one) writing
/// poison and committing jobs of the same consumer, at once: the ingester's batches carry its own
/// redriven jobs, redriven copies of the harness's poison messages (same message ids, same
/// bodies: to the ingester they are envelopes) and of its valid jobs (same message ids). Every
/// poison message one letter (whoever settled it), the ingester's own their kinds, the valid
/// jobs applied once and without a pending letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_ingester_with_a_due_beside_a_harness_writing_poison_keeps_both_promises(pool: PgPool) {
    for harness_due in DUES {
        let mut wants = Vec::new();
        let mut harness_batches = Vec::new();
        let mut ingester_batches = Vec::new();
        let mut valid_jobs = Vec::new();
        for _ in 0..10 {
            let poison: Vec<IncomingMessage> = (0..7)
                .map(|_| {
                    let (j, t) = new_job();
                    let body = envelope(j, t, "c", json!({"account_id": "a", "points": "x"}));
                    message_on("jobs", &body, 1)
                })
                .collect();
            let valids: Vec<IncomingMessage> = (0..3)
                .map(|_| {
                    let (j, t) = new_job();
                    valid_jobs.push(j);
                    valid(j, t)
                })
                .collect();
            let (mut own, own_wants) = mixed_records(&pool, 4).await;
            wants.extend(own_wants);
            for m in poison.iter().take(3) {
                own.push(dlq_record(&m.message_id, &m.body));
            }
            for m in &valids {
                own.push(dlq_record(&m.message_id, &m.body));
                wants.push((m.message_id.clone(), Want::NonePending));
            }
            for m in &poison {
                wants.push((m.message_id.clone(), Want::OneOf("poison", "crashed")));
            }
            let mut batch = poison;
            batch.extend(valids);
            harness_batches.push(batch);
            ingester_batches.push(own);
        }
        let writer = {
            let side = own_pool(&pool, 4).await;
            tokio::spawn(async move {
                let h = harness(&side, harness_due);
                // A record handed back (its claim contended) is delivered again, as SQS does.
                let mut again = Vec::new();
                for batch in harness_batches {
                    let outcomes = shared_testkit::run_batch(&h, &batch).await;
                    for (m, o) in batch.iter().zip(&outcomes) {
                        match o {
                            o if o.is_ack() => {}
                            RecordOutcome::Contended { .. } => again.push(m.clone()),
                            o => panic!("{}: {o:?}", m.body),
                        }
                    }
                }
                while !again.is_empty() {
                    let outcomes = shared_testkit::run_batch(&h, &again).await;
                    let left = (again.iter().zip(&outcomes))
                        .filter(|(_, o)| !o.is_ack())
                        .map(|(m, _)| m.clone())
                        .collect();
                    again = left;
                }
            })
        };
        let backstop = {
            let side = own_pool(&pool, 3).await;
            tokio::spawn(async move {
                let ingester = DlqIngester {
                    settle_due: SETTLE_DUE,
                    ..ingester(&side)
                };
                for batch in ingester_batches {
                    ingest_acked(&ingester, batch).await;
                }
            })
        };
        writer.await.unwrap();
        backstop.await.unwrap();
        settle_all(&pool).await;
        check_all(&pool, &wants).await;
        for j in &valid_jobs {
            assert_eq!(awards(&pool, *j).await, 1);
        }
        promises_hold(&pool).await;
    }
}

// =============================================================================================
// Volume.

/// 2,000 redriven records (exhausted, crashed after two executions, never run, poison) from four
/// concurrent ingesters with a due, on pools of their own, real clock; then the operations-style
/// settle: exactly 2,000 letters, one per message, each of its kind and attempts; the ledgers of
/// the lettered jobs gone; the groups' counts exact; the intake empty.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn two_thousand_redriven_records_from_four_ingesters_with_a_due_settle_into_one_letter_each(
    pool: PgPool,
) {
    let started = Instant::now();
    let (records, wants) = mixed_records(&pool, 2_000).await;
    let mut tasks = Vec::new();
    for w in 0..4usize {
        let mine: Vec<SqsMessage> = records[w * 500..(w + 1) * 500].to_vec();
        let own = own_pool(&pool, 3).await;
        tasks.push(tokio::spawn(async move {
            let ingester = DlqIngester {
                settle_due: SETTLE_DUE,
                ..ingester(&own)
            };
            for batch in mine.chunks(10) {
                ingest_acked(&ingester, batch.to_vec()).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    settle_all(&pool).await;
    let letters: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT message_id, error_kind, attempts FROM core.dead_letters WHERE consumer = $1",
    )
    .bind(consumer().as_str())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(letters.len(), 2_000);
    let by_message: HashMap<&str, (&str, i32)> = (letters.iter())
        .map(|(m, k, a)| (m.as_str(), (k.as_str(), *a)))
        .collect();
    assert_eq!(by_message.len(), 2_000, "one letter per message");
    for (id, want) in &wants {
        let Want::Letter(kind, attempts) = want else {
            unreachable!()
        };
        assert_eq!(
            by_message.get(id.as_str()),
            Some(&(*kind, *attempts)),
            "{id}"
        );
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.job_executions").await,
        0,
        "a lettered job kept its ledger"
    );
    promises_hold(&pool).await;
    eprintln!(
        "2,000 records ingested and settled in {:?}",
        started.elapsed()
    );
}

// =============================================================================================
// Outside the new path (found while reading it).

/// A redriven copy too old for its fence (`unsettled`: sent longer ago than FENCE_TTL less a
/// day) of ANOTHER job under an id whose job committed: the fence is there with another
/// digest, so the copy's job did not commit; the failure needs its letter (a `conflict`, as a
/// younger copy gets). Controls: the committed job's own old copy gets none; an old copy of a
/// job with no fence gets an `unsettled` letter. Alone and in a batch.
//
// Found by this attack (older than 4346d8a): `DlqIngester::write` settled an `unsettled` letter
// with `fence_exists` alone ("a fence still there says the job committed"), without comparing
// the fence's digest: another job's old copy under a committed id was counted
// `RedrivenAlreadyProcessed`, acked, and got no letter. It now reads the fence's verdict on its
// digest in one statement (`fence::fenced_job`): another job's copy gets its `conflict` letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_old_copy_of_another_job_under_a_committed_id_is_not_taken_for_the_committed_job(
    pool: PgPool,
) {
    let old = Utc::now() - chrono::Duration::hours(6 * 24 + 12);
    let mut vanished = Vec::new();
    for alone in [true, false] {
        let (l, tl) = new_job();
        commit_through_the_harness(&pool, l, tl).await;
        let (k, tk) = new_job();
        let (same, other, unfenced) = (new_id(), new_id(), new_id());
        let mut batches = vec![
            vec![dlq_record_sent(&same, &valid_body(l, tl), old)],
            vec![dlq_record_sent(
                &other,
                &envelope(l, tl, "c", award("someone else", 70)),
                old,
            )],
            vec![dlq_record_sent(&unfenced, &valid_body(k, tk), old)],
        ];
        if !alone {
            let merged: Vec<SqsMessage> = batches.concat();
            batches = vec![merged];
            batches[0].push(dlq_record(&new_id(), "not json"));
            batches[0].push(dlq_record(&new_id(), "[x"));
        }
        for batch in batches {
            ingest_acked(&ingester(&pool), batch).await;
        }
        settle_all(&pool).await;
        assert!(
            letters_of_message(&pool, &same).await.is_empty(),
            "alone {alone}"
        );
        check(&pool, &unfenced, Want::Letter("unsettled", 1)).await;
        let letters = letters_of_message(&pool, &other).await;
        if letters.len() != 1 || letters[0].0 != "conflict" {
            vanished.push(format!("alone {alone}: {letters:?}"));
        }
        promises_hold(&pool).await;
    }
    assert!(
        vanished.is_empty(),
        "another job's old copy under a committed id was acked (reported ingested) without its \
         conflict letter, taken for the committed job: {vanished:?}"
    );
}
