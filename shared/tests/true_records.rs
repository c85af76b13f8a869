//! Issue 13 at the library level: every dead letter is a true record, nothing is acked that did
//! not commit its fence, and attempts are executions. Each test is named for what it proves
//! and failed on the code before the fix (see the closing note of issue 13).

use consumer::{AwardPoints, PointsAward, count_awards, insert_award};
use serde_json::{Value, json};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::dead_letter::ErrorKind;
use shared::fence::fence_exists;
use shared::harness::{CommitMode, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, DeadLetterId, JobId};
use shared::upkeep::sweep::sweep;
use shared_testkit::commit_cutter::{Cut, pools_through};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use uuid::Uuid;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// The reference consumer's letters of `job_id`, oldest first.
async fn letters(pool: &PgPool, job_id: JobId) -> Vec<shared::dead_letter::DeadLetter> {
    shared_testkit::letters(pool, job_id, &reference_name()).await
}

/// Fails permanently on its first call, then awards like the reference consumer.
struct PermanentOnce {
    inner: AwardPoints,
    calls: AtomicUsize,
}

impl PermanentOnce {
    fn new() -> Self {
        Self {
            inner: award_points(),
            calls: AtomicUsize::new(0),
        }
    }
}

impl Consumer for PermanentOnce {
    type Payload = PointsAward;
    fn name(&self) -> &ConsumerName {
        self.inner.name()
    }
    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ProcessError::permanent(
                "the account was closed (then reopened)",
            ));
        }
        self.inner.handle(job, tx).await
    }
}

/// Writes its effect, then hits an SQL error and ignores it: the transaction is aborted.
fn swallows_sql_error() -> impl Consumer<Payload = PointsAward> {
    Counting::then(award_points(), |tx| {
        Box::pin(async move {
            let ignored = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
            assert!(ignored.is_err(), "the statement fails");
            Ok(())
        })
    })
}

/// The over-budget path read the fence with a query that cannot see a copy still inside
/// its transaction, and wrote a `crashed` letter for a job that then committed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_over_budget_delivery_waits_for_an_in_flight_copy_and_writes_no_letter(pool: PgPool) {
    let harness = harness(&pool, Counting::new(award_points()));
    let (job_id, body) = job(award(3));
    charge_executions(&pool, job_id, &reference_name(), 5, None).await;
    // Another copy is inside its transaction: fence claimed, effect written, not committed.
    let mut copy = hold_fence(&pool, job_id, &reference_name(), TENANT, t0()).await;
    insert_award(&mut copy, job_id, TENANT, "acct-1", 3, t0())
        .await
        .unwrap();
    let late = tokio::spawn(async move { harness.process(&message(&body, 7)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    copy.commit().await.unwrap();
    let outcome = late.await.unwrap();
    assert_eq!(outcome, RecordOutcome::Duplicate);
    assert!(
        letters(&pool, job_id).await.is_empty(),
        "no letter for a committed job"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

/// A COMMIT whose reply is lost on the last attempt became an `exhausted` letter,
/// although the job had committed. A proxy forwards the COMMIT and drops the connection before
/// the reply: the fence settles that it committed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_whose_reply_is_lost_is_settled_by_the_fence_as_processed(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, job_id, outcome) = last_attempt_cut(pool_opts, connect, Cut::AfterCommitSent).await;
    assert_eq!(outcome, RecordOutcome::Processed);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    assert!(
        letters(&pool, job_id).await.is_empty(),
        "a committed job has no letter"
    );
}

/// The other side of the same cut: a COMMIT that never reached the server did not commit, and
/// on the last attempt that is an honest `exhausted` letter, with the fence free for a replay.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_lost_before_the_server_is_a_failure_and_its_letter_is_true(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, job_id, outcome) = last_attempt_cut(pool_opts, connect, Cut::BeforeCommitSent).await;
    assert_eq!(
        outcome.dead_letter_kind(),
        Some(ErrorKind::Exhausted),
        "{outcome:?}"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    assert!(
        !fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
    let letter = &letters(&pool, job_id).await[0];
    assert!(
        letter.last_error.contains("did not commit"),
        "{}",
        letter.last_error
    );
}

/// A permanent failure whose acknowledgement was lost ran again, succeeded, and left
/// its letter pending for a job that had committed. Its message now finds its letter and is
/// acked without running.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_redelivered_permanent_failure_is_acked_by_its_letter_without_running_again(
    pool: PgPool,
) {
    let harness = harness(&pool, PermanentOnce::new());
    let (job_id, body) = job(award(2));
    let msg = message(&body, 1);
    let first = harness.process(&msg).await;
    assert_eq!(first.dead_letter_kind(), Some(ErrorKind::Permanent));
    let again = IncomingMessage {
        receive_count: 2,
        ..msg
    };
    let second = harness.process(&again).await;
    assert_eq!(
        second.dead_letter_kind(),
        Some(ErrorKind::Permanent),
        "{second:?}"
    );
    assert_eq!(
        harness.consumer().calls.load(Ordering::SeqCst),
        1,
        "not run again"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    assert_eq!(
        letters(&pool, job_id).await[0].status.as_str(),
        "pending_review"
    );
}

/// Two messages with one job id: one fails for good, the other later succeeds. The
/// letter written for the first is closed in the commit of the second, so no letter stays
/// pending for a job whose effect exists.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_pending_for_a_job_is_closed_when_another_copy_commits_it(pool: PgPool) {
    let harness = harness(&pool, PermanentOnce::new());
    let (job_id, body) = job(award(2));
    let failed = message(&body, 1);
    assert!(matches!(
        harness.process(&failed).await,
        RecordOutcome::DeadLettered { .. }
    ));
    let other = message(&body, 1);
    assert_eq!(harness.process(&other).await, RecordOutcome::Processed);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    let letter = &letters(&pool, job_id).await[0];
    assert_eq!(
        (letter.status.as_str(), letter.reviewed_by.as_deref()),
        ("discarded", Some("harness"))
    );
    let reason = letter.discard_reason.as_deref().unwrap();
    assert!(reason.contains(&other.message_id), "{reason}");
}

/// The fence of a job with a letter pending review is never swept, however old, so a
/// replay of that letter finds the job processed and sends nothing. Once reviewed, it goes.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_fence_of_a_job_with_a_pending_letter_outlives_its_ttl(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(award(1));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    // A letter for the same job that the harness cannot close (written before this version).
    sqlx::query(
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, attempts,
             error_kind, last_error, created_at)
         VALUES ($1, $2, $3, 'older-copy', $4, 7, 'crashed', 'redriven', $5)",
    )
    .bind(job_id.0)
    .bind(reference_name().as_str())
    .bind(QUEUE)
    .bind(serde_json::from_str::<Value>(&body).unwrap())
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    let clock = shared::clock::ManualClock::new(t0() + chrono::Duration::days(30));
    let report = sweep(&pool, &clock, SWEEP, None).await.unwrap();
    assert_eq!(report.deleted, 0);
    assert_eq!(report.backlog, Duration::ZERO, "a kept fence is no backlog");
    assert!(
        fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
    sqlx::query(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'seen',
             reviewed_by = 'op', reviewed_at = $2 WHERE job_id = $1",
    )
    .bind(job_id.0)
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(sweep(&pool, &clock, SWEEP, None).await.unwrap().deleted, 1);
}

/// A handler that ignored an SQL error and returned Ok left its transaction aborted;
/// PostgreSQL answered COMMIT with a silent ROLLBACK and the harness acked `Processed` with
/// nothing committed. Now it is a transient failure with a clear error, then a letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_handler_returning_ok_from_an_aborted_transaction_is_retried_then_dead_lettered(
    pool: PgPool,
) {
    let harness = harness(&pool, swallows_sql_error());
    let (job_id, body) = job(award(4));
    let first = harness.process(&message(&body, 1)).await;
    let RecordOutcome::Retry {
        attempt: 1, error, ..
    } = &first
    else {
        panic!("{first:?}");
    };
    assert!(
        error.contains("SQL error inside handle was not returned"),
        "{error}"
    );
    assert!(!first.is_ack());
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);
    assert!(
        !fence_exists(&pool, job_id, &reference_name())
            .await
            .unwrap()
    );
    let mut last = first;
    for delivery in 2..=5 {
        last = harness.process(&message(&body, delivery)).await;
    }
    assert_eq!(
        last.dead_letter_kind(),
        Some(ErrorKind::Exhausted),
        "{last:?}"
    );
    assert_eq!(letters(&pool, job_id).await[0].attempts, 5);
}

/// A `replay_of` attribute naming no letter broke the letter's foreign key, so neither
/// the consumer nor the ingester could record the failure. Any producer can set it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_of_naming_no_letter_still_gets_its_letter(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(json!({"account_id": "a", "points": -1}));
    let msg = IncomingMessage {
        replay_of: Some(DeadLetterId(Uuid::new_v4())),
        message_group: None,
        ..message(&body, 1)
    };
    let outcome = harness.process(&msg).await;
    assert_eq!(
        outcome.dead_letter_kind(),
        Some(ErrorKind::Poison),
        "{outcome:?}"
    );
    assert_eq!(letters(&pool, job_id).await[0].replay_of, None);
}

/// SQS receives are not executions. A delivery handed back (deadline, contention) or
/// delivered many times by crashes of its batch-mates has not run: it runs as attempt 1.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn receives_that_ran_nothing_spend_no_attempts(pool: PgPool) {
    let harness = harness(
        &pool,
        Counting::failing(award_points(), Fault::TransientUntilAttempt(2)),
    );
    let (job_id, body) = job(award(1));
    let outcome = harness.process(&message(&body, 6)).await;
    assert!(
        matches!(outcome, RecordOutcome::Retry { attempt: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(
        harness.process(&message(&body, 7)).await,
        RecordOutcome::Processed
    );
    assert_eq!(harness.consumer().calls(), 2);
    assert!(letters(&pool, job_id).await.is_empty());
}

/// A contended fence means the execution did not run: its charge is taken back.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_contended_fence_charges_no_execution(pool: PgPool) {
    let settings = HarnessSettings {
        lock_timeout: Duration::from_millis(100),
        ..settings()
    };
    let (harness, _) = harness_with(&pool, award_points(), settings);
    let (job_id, body) = job(award(1));
    let holder = hold_fence(&pool, job_id, &reference_name(), TENANT, t0()).await;
    for delivery in 2..=8 {
        let outcome = harness.process(&message(&body, delivery)).await;
        assert!(
            matches!(outcome, RecordOutcome::Contended { .. }),
            "{outcome:?}"
        );
    }
    holder.rollback().await.unwrap();
    let ledger = shared::ledger::ledger(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!(
        ledger.executions, 0,
        "seven contended deliveries, no execution"
    );
    assert_eq!(
        harness.process(&message(&body, 9)).await,
        RecordOutcome::Processed
    );
}

/// A letter keeps its body once (issue 36, migration 0032): a letter written as parsed, alone or
/// settled from the intake in bulk, stores no payload of its own, and reads back the payload the
/// body gives (`body_as_json`: a JSON body as JSON, any other as a JSON string); a body that held
/// a NUL (which the stored body replaces) keeps its payload apart, as received.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_keeps_its_body_once_and_reads_its_payload_back_from_it(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let envelope = |points: &str| {
        format!(
            r#"{{"job_id":"{}","tenant_id":"{}","payload":{{"account_id":"a","points":{points}}}}}"#,
            Uuid::new_v4(),
            Uuid::new_v4()
        )
    };
    let alone = [
        envelope("\"many\""),
        "not json at all".to_owned(),
        "{\"a\":\"x\0\"}".to_owned(),
    ];
    let together = [envelope("\"lots\""), "[1, 2".to_owned(), envelope("-1.50")];
    let mut written = Vec::new();
    for body in &alone {
        let msg = message(body, 1);
        let outcome = harness.process(&msg).await;
        assert!(
            outcome.dead_letter_kind().is_some(),
            "{body:?}: {outcome:?}"
        );
        written.push((msg.message_id, body));
    }
    let batch: Vec<IncomingMessage> = together.iter().map(|b| message(b, 1)).collect();
    let outcomes = harness.process_batch(&batch, &|| true, 4).await;
    assert!(
        outcomes
            .iter()
            .all(|o| o.as_ref().is_some_and(|o| o.dead_letter_kind().is_some()))
    );
    written.extend(batch.iter().map(|m| m.message_id.clone()).zip(&together));
    shared::dead_letter::settle_behind(
        &pool,
        &reference_name(),
        chrono::Utc::now(),
        Duration::from_secs(1),
        4,
    )
    .await
    .unwrap();
    for (message_id, body) in written {
        let kept: Option<Value> =
            sqlx::query_scalar("SELECT payload FROM core.dead_letters WHERE message_id = $1")
                .bind(&message_id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let letter = shared::dead_letter::letter_for_message(&pool, &reference_name(), &message_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            letter.payload,
            shared::envelope::body_as_json(body),
            "{body:?}"
        );
        if body.contains('\0') {
            assert_eq!(
                kept,
                Some(json!(body.replace('\0', "\u{fffd}"))),
                "{body:?}"
            );
        } else {
            assert_eq!(kept, None, "{body:?}: the body once");
            assert_eq!(letter.body.as_deref(), Some(body.as_str()));
        }
    }
}

/// A letter's payload is the body as received, number for number (it went through
/// f64: 123456789012345678901234567890 was stored as 123456789012345680000000000000).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_keeps_every_number_of_the_body_as_received(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let job_id = JobId(Uuid::new_v4());
    let body = format!(
        r#"{{"job_id":"{job_id}","tenant_id":"{}","correlation_id":"c","payload":{{"account_id":"a","points":"many","big":123456789012345678901234567890,"tiny":0.1000000000000000055511151231257827,"scaled":-7.250}}}}"#,
        Uuid::from_u128(7)
    );
    let outcome = harness.process(&message(&body, 1)).await;
    assert_eq!(outcome.dead_letter_kind(), Some(ErrorKind::Poison));
    let letter = &letters(&pool, job_id).await[0];
    // As jsonb holds it, where the row keeps a payload of its own, or as read back from the body.
    let stored: String = sqlx::query_scalar(
        "SELECT coalesce(payload, $2)::text FROM core.dead_letters WHERE job_id = $1",
    )
    .bind(job_id.0)
    .bind(&letter.payload)
    .fetch_one(&pool)
    .await
    .unwrap();
    for number in [
        "123456789012345678901234567890",
        "0.1000000000000000055511151231257827",
        "-7.250",
    ] {
        assert!(stored.contains(number), "{number} in {stored}");
    }
    assert_eq!(
        letter.payload,
        serde_json::from_str::<Value>(&body).unwrap()
    );
    assert_eq!(
        shared::replay::original_body(&letter.payload),
        letter.payload.to_string()
    );
    assert!(
        shared::replay::original_body(&letter.payload)
            .contains("0.1000000000000000055511151231257827")
    );
}

/// A consumer's payload type gets exact numbers where its fields can hold them: an
/// amount as a decimal keeps every digit an f64 would lose.
#[test]
fn a_decimal_amount_reaches_the_payload_type_exactly() {
    #[derive(serde::Deserialize)]
    struct Payment {
        amount: rust_decimal::Decimal,
    }
    let body = format!(
        r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":"c","payload":{{"amount":12345678901234567.89}}}}"#,
        Uuid::new_v4(),
        Uuid::new_v4()
    );
    let envelope = shared::envelope::Envelope::<Payment>::parse(&body).unwrap();
    assert_eq!(envelope.payload.amount.to_string(), "12345678901234567.89");
}

/// The sweep needed two connections and timed out with `DATABASE_POOL_SIZE=1`.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_sweep_runs_on_a_pool_of_one_connection(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let one = pool_opts
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(connect)
        .await
        .unwrap();
    let harness = harness(&one, award_points());
    let (_, body) = job(award(1));
    assert_eq!(
        harness.process(&message(&body, 1)).await,
        RecordOutcome::Processed
    );
    let clock = shared::clock::ManualClock::new(t0() + chrono::Duration::days(30));
    let report = sweep(&one, &clock, SWEEP, None).await.unwrap();
    assert_eq!(report.deleted, 1);
}

/// A discard reason made only of invisible characters is no reason; the schema itself
/// rejects it, whatever wrote it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_schema_rejects_a_discard_reason_of_invisible_characters(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, body) = job(json!({"account_id": "a", "points": -1}));
    harness.process(&message(&body, 1)).await;
    for reason in ["\u{200b}\u{200b}", " \u{feff} ", "\u{2060}"] {
        let rejected = sqlx::query(
            "UPDATE core.dead_letters SET status = 'discarded', discard_reason = $2,
                 reviewed_by = 'op', reviewed_at = now() WHERE job_id = $1",
        )
        .bind(job_id.0)
        .bind(reason)
        .execute(&pool)
        .await;
        assert!(rejected.is_err(), "{reason:?} accepted");
    }
}

/// The last attempt of a job (four transient failures charged) through a harness whose pool
/// goes through a commit-cutting proxy, its `COMMIT` cut at `cut`: the test's own pool, the job
/// and the outcome.
async fn last_attempt_cut(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    cut: Cut,
) -> (PgPool, JobId, RecordOutcome) {
    let (pool, cutter, through) = pools_through(pool_opts, connect).await;
    let harness = harness(&through, award_points());
    let (job_id, body) = job(award(5));
    record_transient_failures(&pool, job_id, 4).await;
    cutter.arm(cut);
    let outcome = harness.process(&message(&body, 5)).await;
    assert!(cutter.fired(), "the COMMIT went through the proxy");
    (pool, job_id, outcome)
}

async fn record_transient_failures(pool: &PgPool, job_id: JobId, n: u32) {
    let error = Some("simulated provider timeout");
    charge_executions(pool, job_id, &reference_name(), n, error).await;
}

/// Issue 24: the harness opens and closes the job's transaction with its own statements (the
/// claim with `BEGIN`, the check with `COMMIT`); a handler's `Connection::begin` on it must
/// still nest as a savepoint, so that rolling a step of the work back keeps the fence and the
/// rest of the work, and the job commits once. (A `BEGIN` instead would be ignored, and its
/// rollback would roll back the fence too, leaving the work after it committed with no
/// fence: a retry would apply it again.)
/// In both commit modes (the guide's one truth about nested transactions, issue 35).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_handlers_nested_transaction_is_a_savepoint_of_the_jobs(pool: PgPool) {
    use sqlx::Connection;
    let mut expected = 0;
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        let consumer = Counting::then(award_points(), |tx| {
            Box::pin(async move {
                let mut step = tx.begin().await.map_err(ProcessError::from_database)?;
                sqlx::query("SELECT 1")
                    .execute(&mut *step)
                    .await
                    .map_err(ProcessError::from_database)?;
                step.rollback().await.map_err(ProcessError::from_database)?;
                sqlx::query("INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at) VALUES (gen_random_uuid(), gen_random_uuid(), 'after-the-step', 1, now())")
                    .execute(&mut *tx)
                    .await
                    .map_err(ProcessError::from_database)?;
                Ok(())
            })
        });
        let harness = harness_in(&pool, consumer, mode);
        let (job_id, body) = job(award(4));
        assert_eq!(
            deliver(&harness, &message(&body, 1)).await,
            RecordOutcome::Processed,
            "{mode:?}"
        );
        // Per job, the job; in batch mode, the job and its batch's companion.
        expected += if mode == CommitMode::Batch { 2 } else { 1 };
        assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
        assert!(
            fence_exists(&pool, job_id, &reference_name())
                .await
                .unwrap()
        );
        assert_eq!(
            harness.process(&message(&body, 2)).await,
            RecordOutcome::Duplicate
        );
        let after: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reference.point_awards WHERE account_id = 'after-the-step'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            after, expected,
            "{mode:?}: the work after the rolled-back step ran once"
        );
    }
}
