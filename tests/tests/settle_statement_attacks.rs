//! An outside attack on the settle round as one statement (`core.settle_intake`, 0038) and its
//! fallback one by one (`settle_one_by_one`): rounds PostgreSQL refuses mid-way, claims that wait
//! out, a settler cancelled or terminated mid-round, a writer receiving while a round falls back,
//! a pool of one connection, digest fields that change between rows, rounds over 500 rows and
//! 4 MiB, a tight statement_timeout, and conflict errors cut by SQL vs by the harness.

use consumer::AwardPoints;
use e2e::intake_kit::{
    copy_inside_its_transaction, harness_waiting, hold_settle_lock, run, settle_all,
};
use serde_json::{Value, json};
use shared::dead_letter::{
    ErrorKind, NewDeadLetter, Recorded, Settled, receive_letters, settle_behind,
};
use shared::envelope::JobDigest;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(5);

fn consumer() -> ConsumerName {
    e2e::consumer_name()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn letters_of(pool: &PgPool, message_id: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE consumer = $1 AND message_id = $2",
    )
    .bind(consumer().as_str())
    .bind(message_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn intake_rows(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM core.letter_intake").await
}

async fn promises_hold(pool: &PgPool) {
    e2e::promises::both_hold(pool).await;
    assert_eq!(
        intake_rows(pool).await,
        0,
        "a received row was never settled"
    );
}

fn new_job() -> (JobId, TenantId) {
    (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()))
}

fn award(account: &str, points: i64) -> Value {
    json!({"account_id": account, "points": points})
}

fn poison_of(job: JobId, tenant: TenantId, correlation: &str) -> IncomingMessage {
    let body = envelope(
        job,
        tenant,
        correlation,
        json!({"account_id": "a", "points": "x"}),
    );
    message_on("jobs", &body, 1)
}

fn poison() -> IncomingMessage {
    let (j, t) = new_job();
    poison_of(j, t, "c")
}

fn valid(job: JobId, tenant: TenantId) -> IncomingMessage {
    message_on("jobs", &envelope(job, tenant, "c", award("a", 5)), 1)
}

fn digest_of(body: &str, fields: &[&str]) -> JobDigest {
    let value: Value = serde_json::from_str(body).expect("JSON");
    JobDigest::of(&value, fields)
}

fn harness(pool: &PgPool) -> Harness<AwardPoints> {
    e2e::harness_in(
        pool.clone(),
        AwardPoints::new(consumer()),
        CommitMode::Batch,
    )
}

/// Waits until a session waits on a lock, its query matching `like` (or not, for `!like`).
async fn until_waiting(pool: &PgPool, condition: &str) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock' AND {condition}"
    );
    let waiting = async {
        loop {
            if count(pool, &sql).await > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap_or_else(|_| panic!("no session waits on a lock where {condition}"));
}

const IN_THE_STATEMENT: &str = "query ILIKE '%settle_intake%'";
const ONE_BY_ONE: &str = "query NOT ILIKE '%settle_intake%'";

async fn own_pool(pool: &PgPool, connections: u32, acquire: Duration) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(acquire)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// Refuses (23514) a letter whose body holds `marker`: only inside core.record_letters' insert
/// (`in_call_only`), or always.
async fn refuse_letters_of(pool: &PgPool, marker: &str, in_call_only: bool) {
    let condition = if in_call_only {
        "AND current_setting('core.letters_grouped', true) = 'by the call'"
    } else {
        ""
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION public.refuse_{marker}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.body LIKE '%{marker}%' {condition} THEN
                 RAISE EXCEPTION 'refused {marker}' USING ERRCODE = '23514';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_{marker} BEFORE INSERT ON core.dead_letters
             FOR EACH ROW EXECUTE FUNCTION public.refuse_{marker}();"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// A letter as a writer would receive it.
#[allow(clippy::too_many_arguments)]
fn letter<'a>(
    consumer: &'a ConsumerName,
    job: Option<(JobId, TenantId)>,
    message_id: &'a str,
    body: &'a str,
    error: &'a str,
    fields: &'a [&'a str],
) -> NewDeadLetter<'a> {
    NewDeadLetter {
        job_id: job.map(|j| j.0),
        tenant_id: job.map(|j| j.1),
        consumer,
        queue: "jobs",
        message_id,
        body,
        attempts: 1,
        kind: ErrorKind::Poison,
        last_error: error,
        correlation_id: None,
        replay_of: None,
        message_group: None,
        digest_fields: fields,
        trace: None,
        nul_replaced: false,
    }
}

// =============================================================================================

/// A round PostgreSQL refuses mid-way (one row's letter refused inside the call only): the
/// statement fails whole, the fallback writes every letter once (the refused one alone), the
/// intake is emptied. Then a row refused even alone: set aside (`refused`), the others written
/// once, later rounds skip it without falling back again.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_round_refused_mid_way_falls_back_and_writes_every_other_letter_once(pool: PgPool) {
    refuse_letters_of(&pool, "incall", true).await;
    refuse_letters_of(&pool, "always", false).await;
    let h = harness(&pool);
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..8).map(|_| poison()).collect();
    let (j, t) = new_job();
    batch.insert(4, poison_of(j, t, "incall"));
    run(&h, &batch).await;
    held.rollback().await.unwrap();
    assert_eq!(intake_rows(&pool).await, 9);
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 9, "{settled:?}");
    for m in &batch {
        assert_eq!(
            letters_of(&pool, &m.message_id).await,
            1,
            "{}",
            m.message_id
        );
    }
    promises_hold(&pool).await;

    // Refused even alone.
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..6).map(|_| poison()).collect();
    let (j, t) = new_job();
    let refused = poison_of(j, t, "always");
    batch.insert(2, refused.clone());
    run(&h, &batch).await;
    held.rollback().await.unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 6, "{settled:?}");
    for m in batch.iter().filter(|m| m.message_id != refused.message_id) {
        assert_eq!(letters_of(&pool, &m.message_id).await, 1);
    }
    assert_eq!(letters_of(&pool, &refused.message_id).await, 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.letter_intake WHERE refused IS NOT NULL"
        )
        .await,
        1,
        "the row refused even alone is kept, set aside"
    );
    // Later rounds skip it: nothing settled, no fallback loop (a round is quick and empty).
    let started = Instant::now();
    for _ in 0..3 {
        let again = settle_all(&pool).await;
        assert!(again.settled.is_empty(), "{again:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        shared::dead_letter::oldest_received(&mut conn)
            .await
            .unwrap(),
        None
    );
    e2e::promises::both_hold(&pool).await;
}

/// A claim that waits out (a copy holds the job's fence) fails the statement: the fallback writes
/// every other letter once, leaves the held job's row, which settles through the job's fence
/// once the copy commits (no letter: the job ran).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_claim_that_waits_out_falls_back_and_the_held_row_settles_after_the_commit(pool: PgPool) {
    let (j, t) = new_job();
    let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&valid(j, t).body, &[])).await;
    let h = harness_waiting(&pool, CommitMode::Batch, Duration::from_millis(300));
    // The same job spelled as poison (a correlation id that is no string): its own digest.
    let same = message_on(
        "jobs",
        &json!({"job_id": j, "tenant_id": t, "correlation_id": 5,
            "payload": {"account_id": "a", "points": 5}})
        .to_string(),
        1,
    );
    let mut batch: Vec<_> = (0..6).map(|_| poison()).collect();
    batch.insert(3, same.clone());
    let outcomes = run(&h, &batch).await;
    for (m, o) in batch.iter().zip(&outcomes) {
        if m.message_id == same.message_id {
            assert!(
                matches!(
                    o,
                    RecordOutcome::DeadLettered {
                        letter: Recorded::Received(_),
                        ..
                    }
                ),
                "{o:?}"
            );
        } else {
            assert_eq!(letters_of(&pool, &m.message_id).await, 1, "{o:?}");
        }
    }
    assert_eq!(intake_rows(&pool).await, 1);
    copy.commit().await.unwrap();
    settle_all(&pool).await;
    assert_eq!(
        letters_of(&pool, &same.message_id).await,
        0,
        "a letter of a job that ran"
    );
    promises_hold(&pool).await;
}

// Found a hole (fixed: the fall back writes each row in a savepoint on its own connection):
// a fallback on a pool of one connection wrote nothing.
/// The same as above with DATABASE_POOL_SIZE=1 (allowed: 1..=100). The fallback
/// holds the pool's only connection for its settle lock while each row alone asks the same pool
/// for another: every row waits out the acquire timeout and none is written.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_fallback_on_a_pool_of_one_connection_still_writes_the_other_letters(pool: PgPool) {
    let (j, t) = new_job();
    let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&valid(j, t).body, &[])).await;
    let one = own_pool(&pool, 1, Duration::from_millis(700)).await;
    let h = harness_waiting(&one, CommitMode::Batch, Duration::from_millis(300));
    let mut batch: Vec<_> = (0..5).map(|_| poison()).collect();
    batch.push(poison_of(j, t, "c"));
    let started = Instant::now();
    run(&h, &batch).await;
    let took = started.elapsed();
    let mut written = 0;
    for m in &batch[..5] {
        written += letters_of(&pool, &m.message_id).await;
    }
    copy.rollback().await.unwrap();
    settle_all(&pool).await;
    promises_hold(&pool).await;
    assert_eq!(
        written, 5,
        "the fallback on a pool of one wrote {written} of the 5 other letters (took {took:?})"
    );
}

// Found a hole (fixed: rounds go on after a fall back, passing by the rows it left): rows of a
// writer that found the lock held during a fallback were left to nobody.
/// A writer receives while the settler at work is in its one-by-one fallback: it
/// finds the lock held and leaves its rows to that settler, which stops after its fallback
/// round. The writer's rows are left for whoever comes next (the scheduled run).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_writer_receiving_during_a_fallback_has_its_rows_settled_by_the_settler_at_work(
    pool: PgPool,
) {
    let (j, t) = new_job();
    let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&valid(j, t).body, &[])).await;
    let h = harness(&pool);
    let held = hold_settle_lock(&pool).await;
    let first = poison_of(j, t, "c");
    let mut others: Vec<_> = (0..2).map(|_| poison()).collect();
    let mut together = vec![first.clone()];
    together.extend(others.iter().cloned());
    run(&h, &together).await;
    held.rollback().await.unwrap();
    let settler_pool = own_pool(&pool, 3, Duration::from_secs(5)).await;
    let settler = tokio::spawn(async move {
        settle_behind(
            &settler_pool,
            &consumer(),
            chrono::Utc::now(),
            Duration::from_millis(1500),
            shared::dead_letter::SETTLE_ROUNDS,
        )
        .await
    });
    // The statement waits out on the held job, then the fallback waits on it again.
    until_waiting(&pool, IN_THE_STATEMENT).await;
    until_waiting(&pool, ONE_BY_ONE).await;
    let late: Vec<_> = (0..5).map(|_| poison()).collect();
    let outcomes = run(&h, &late).await;
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            RecordOutcome::DeadLettered {
                letter: Recorded::Received(_),
                ..
            }
        )),
        "the writer found the settler at work: {outcomes:?}"
    );
    let _ = tokio::time::timeout(Duration::from_secs(20), settler)
        .await
        .expect("the settler returns");
    let mut left = 0;
    for m in &late {
        left += 1 - letters_of(&pool, &m.message_id).await;
    }
    copy.rollback().await.unwrap();
    others.extend(late.iter().cloned());
    settle_all(&pool).await;
    for m in others.iter().chain([&first]) {
        assert_eq!(letters_of(&pool, &m.message_id).await, 1);
    }
    promises_hold(&pool).await;
    assert_eq!(
        left, 0,
        "{left} of the writer's 5 rows were left unsettled after the settler at work returned"
    );
}

/// The settler's statement cancelled (pg_cancel_backend, 57014) while its claim waits: it falls
/// back, and every letter is written exactly once; nothing is left once the copy rolls back.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_settler_cancelled_mid_statement_falls_back_and_doubles_nothing(pool: PgPool) {
    let (j, t) = new_job();
    let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&valid(j, t).body, &[])).await;
    let h = harness(&pool);
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..6).map(|_| poison()).collect();
    batch.push(poison_of(j, t, "c"));
    run(&h, &batch).await;
    held.rollback().await.unwrap();
    let settler_pool = own_pool(&pool, 3, Duration::from_secs(5)).await;
    let settler = tokio::spawn(async move {
        settle_behind(
            &settler_pool,
            &consumer(),
            chrono::Utc::now(),
            Duration::from_secs(4),
            10,
        )
        .await
    });
    until_waiting(&pool, IN_THE_STATEMENT).await;
    let cancelled = count(
        &pool,
        "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND query ILIKE '%settle_intake%'
            AND pid <> pg_backend_pid() AND state = 'active'",
    )
    .await;
    assert_eq!(cancelled, 1);
    // The fallback reaches the held job alone; the copy rolls back under it.
    until_waiting(&pool, ONE_BY_ONE).await;
    copy.rollback().await.unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(20), settler)
        .await
        .expect("the settler returns")
        .unwrap()
        .expect("a cancelled statement falls back");
    assert_eq!(settled.new_letters, 7, "{settled:?}");
    for m in &batch {
        assert_eq!(letters_of(&pool, &m.message_id).await, 1);
    }
    promises_hold(&pool).await;
}

/// The fallback's connection terminated (pg_terminate_backend) while it waits on the held job,
/// after it wrote the other letters alone (each in a savepoint of its transaction, which holds
/// the settle lock): nothing of it commits, every row stays, and the next settle writes each
/// letter once (no group counted twice).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_fallback_whose_lock_is_terminated_leaves_rows_that_resettle_to_the_same_letters(
    pool: PgPool,
) {
    let (j, t) = new_job();
    let copy = copy_inside_its_transaction(&pool, j, t, &digest_of(&valid(j, t).body, &[])).await;
    let h = harness(&pool);
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..5).map(|_| poison()).collect();
    batch.push(poison_of(j, t, "c"));
    run(&h, &batch).await;
    held.rollback().await.unwrap();
    let settler_pool = own_pool(&pool, 3, Duration::from_secs(5)).await;
    let settler = tokio::spawn(async move {
        settle_behind(
            &settler_pool,
            &consumer(),
            chrono::Utc::now(),
            Duration::from_millis(1500),
            10,
        )
        .await
    });
    until_waiting(&pool, IN_THE_STATEMENT).await;
    until_waiting(&pool, ONE_BY_ONE).await;
    let killed = count(
        &pool,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity a
          WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
            AND a.state = 'active'
            AND a.pid IN (SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted)",
    )
    .await;
    assert_eq!(killed, 1, "the fallback's lock holder");
    let _ = tokio::time::timeout(Duration::from_secs(20), settler)
        .await
        .expect("the settler returns");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        0,
        "nothing of a killed fall back commits"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        6
    );
    copy.rollback().await.unwrap();
    let again = settle_all(&pool).await;
    assert_eq!(again.new_letters, 6, "{again:?}");
    for m in &batch {
        assert_eq!(letters_of(&pool, &m.message_id).await, 1);
    }
    assert_eq!(
        count(
            &pool,
            "SELECT coalesce(sum(letter_count), 0)::bigint FROM core.dead_letter_groups_counted"
        )
        .await,
        6,
        "a group counted a letter twice"
    );
    promises_hold(&pool).await;
}

/// Rows whose digest fields change (A, B, A, none, A): each letter keeps its own row's fields
/// and its own digest, whatever round took it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn rows_of_digest_fields_a_b_a_none_a_each_keep_their_own_fields(pool: PgPool) {
    let c = consumer();
    let sets: [&[&str]; 5] = [
        &["account_id"],
        &["points"],
        &["account_id"],
        &[],
        &["account_id"],
    ];
    let mut owned = Vec::new();
    for _ in sets {
        let (j, t) = new_job();
        let body = envelope(j, t, "c", json!({"account_id": "a", "points": "x"}));
        owned.push((j, t, Uuid::new_v4().to_string(), body));
    }
    let digests: Vec<JobDigest> = owned
        .iter()
        .zip(sets)
        .map(|((_, _, _, body), f)| digest_of(body, f))
        .collect();
    let letters: Vec<_> = owned
        .iter()
        .zip(sets)
        .zip(&digests)
        .map(|(((j, t, m, body), f), d)| {
            (
                letter(&c, Some((*j, *t)), m, body, "bad points", f),
                Some(d),
            )
        })
        .collect();
    receive_letters(&pool, &letters, chrono::Utc::now())
        .await
        .unwrap();
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 5);
    for (((_, _, m, _), f), d) in owned.iter().zip(sets).zip(&digests) {
        let (fields, digest): (Option<Vec<String>>, Option<Vec<u8>>) = sqlx::query_as(
            "SELECT digest_fields, job_digest FROM core.dead_letters WHERE message_id = $1",
        )
        .bind(m)
        .fetch_one(&pool)
        .await
        .unwrap();
        let expected = (!f.is_empty()).then(|| f.iter().map(|s| s.to_string()).collect());
        assert_eq!(fields, expected, "{m}");
        assert_eq!(digest.as_deref(), Some(&d.0[..]));
    }
    promises_hold(&pool).await;
}

/// 1,200 rows and three bodies of 2.5 MiB (rounds bounded by 500 rows and by 4 MiB): one letter
/// each, the intake emptied, every group's counts exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn rounds_over_500_rows_and_4_mib_settle_every_row_once(pool: PgPool) {
    let c = consumer();
    let big = "é".repeat(1_310_720); // 2.5 MiB
    let mut rows = Vec::new();
    for i in 0..1_203 {
        let id = Uuid::new_v4().to_string();
        let body = if i % 400 == 7 {
            format!("{{\"pad\":\"{big}\"}}")
        } else {
            format!("not json {i}")
        };
        rows.push((id, body));
    }
    for chunk in rows.chunks(401) {
        let letters: Vec<_> = chunk
            .iter()
            .map(|(m, b)| (letter(&c, None, m, b, "not JSON", &[]), None))
            .collect();
        receive_letters(&pool, &letters, chrono::Utc::now())
            .await
            .unwrap();
    }
    let settled = settle_all(&pool).await;
    assert_eq!(settled.new_letters, 1_203);
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT message_id) FROM core.dead_letters"
        )
        .await,
        1_203
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        1_203
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters WHERE octet_length(body) > 2000000"
        )
        .await,
        3
    );
    promises_hold(&pool).await;
}

/// A statement_timeout on the database shorter than a 500-row round: the round is cancelled
/// (57014), falls back, and every row is still settled once by settlers that go on.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_statement_timeout_shorter_than_a_round_still_settles_every_row_once(pool: PgPool) {
    let c = consumer();
    let rows: Vec<(String, String, JobId, TenantId)> = (0..700)
        .map(|i| {
            let (j, t) = new_job();
            (
                Uuid::new_v4().to_string(),
                format!("{{\"job_id\":\"{}\",\"x\":{i}", j.0),
                j,
                t,
            )
        })
        .collect();
    let letters: Vec<_> = rows
        .iter()
        .map(|(m, b, j, t)| (letter(&c, Some((*j, *t)), m, b, "not JSON", &[]), None))
        .collect();
    receive_letters(&pool, &letters, chrono::Utc::now())
        .await
        .unwrap();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db}\" SET statement_timeout = '25ms'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let tight = own_pool(&pool, 3, Duration::from_secs(5)).await;
    let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&tight)
        .await
        .unwrap();
    assert_eq!(timeout, "25ms");
    let mut fell_back = false;
    for _ in 0..10 {
        let round =
            shared::dead_letter::settle_round(&tight, &consumer(), chrono::Utc::now(), WAIT)
                .await
                .expect("a round");
        fell_back |= round.fell_back;
        if intake_rows(&pool).await == 0 {
            break;
        }
    }
    tight.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db}\" RESET statement_timeout"
    )))
    .execute(&pool)
    .await
    .unwrap();
    for (m, ..) in &rows {
        assert_eq!(
            letters_of(&pool, m).await,
            1,
            "{m} (fell back: {fell_back})"
        );
    }
    promises_hold(&pool).await;
}

/// A conflict letter's error, long and multibyte: written by the statement (core.cut_to_bytes)
/// and by the one-by-one path (shared::ids::truncate), for the same row's error, the same text,
/// so one failure group.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_conflict_letters_long_multibyte_error_is_the_same_from_the_statement_and_one_by_one(
    pool: PgPool,
) {
    refuse_letters_of(&pool, "incall", true).await;
    let (j, t) = new_job();
    let h = harness(&pool);
    let outcomes = run(&h, &[valid(j, t)]).await;
    assert_eq!(outcomes[0], RecordOutcome::Processed);
    let c = consumer();
    let error = "é€😀a\u{301}".repeat(1_700);
    let other = envelope(j, t, "c", json!({"account_id": "b", "points": "x"}));
    let other_digest = digest_of(&other, &[]);
    let by_statement = Uuid::new_v4().to_string();
    receive_letters(
        &pool,
        &[(
            letter(&c, Some((j, t)), &by_statement, &other, &error, &[]),
            Some(&other_digest),
        )],
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let s = settle_all(&pool).await;
    assert!(
        s.settled
            .values()
            .all(|v| matches!(v, Settled::Conflict(Recorded::New(_)))),
        "{s:?}"
    );
    // The same again, beside a row the call refuses: one by one.
    let one_by_one = Uuid::new_v4().to_string();
    let refused_body = "incall not json".to_string();
    let refused_id = Uuid::new_v4().to_string();
    receive_letters(
        &pool,
        &[
            (
                letter(&c, Some((j, t)), &one_by_one, &other, &error, &[]),
                Some(&other_digest),
            ),
            (
                letter(&c, None, &refused_id, &refused_body, "not JSON", &[]),
                None,
            ),
        ],
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    settle_all(&pool).await;
    let read = |m: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (String, String, i64)>(
                "SELECT error_kind, last_error, group_id FROM core.dead_letters WHERE message_id = $1",
            )
            .bind(m)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let a = read(by_statement).await;
    let b = read(one_by_one).await;
    assert_eq!(a.0, "conflict");
    assert_eq!(b.0, "conflict");
    assert!(a.1.len() <= 8 * 1024, "{} bytes", a.1.len());
    assert_eq!(
        a.1, b.1,
        "the statement and the one-by-one path cut the error differently"
    );
    assert_eq!(a.2, b.2, "one failure, one group");
    promises_hold(&pool).await;
}

/// The same message received twice and a job spelled as poison then committed, all received
/// while a settler is at work through the DLQ ingester and the harness, then settled in one
/// statement: one letter per message, none for the job that ran.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn repeats_and_a_job_committed_between_receipt_and_settle_in_one_statement(pool: PgPool) {
    let h = harness(&pool);
    let (j, t) = new_job();
    let same = message_on(
        "jobs",
        &json!({"job_id": j, "tenant_id": t, "correlation_id": 5,
            "payload": {"account_id": "a", "points": 5}})
        .to_string(),
        1,
    );
    let held = hold_settle_lock(&pool).await;
    let mut batch: Vec<_> = (0..4).map(|_| poison()).collect();
    batch.push(same.clone());
    run(&h, &batch).await;
    let mut again = batch.clone();
    again.push(batch[0].clone());
    run(&h, &again).await;
    assert_eq!(intake_rows(&pool).await, 11);
    run(&h, &[valid(j, t)]).await;
    held.rollback().await.unwrap();
    let s = settle_all(&pool).await;
    assert_eq!(s.new_letters, 4, "{s:?}");
    assert_eq!(letters_of(&pool, &same.message_id).await, 0);
    for m in &batch[..4] {
        assert_eq!(letters_of(&pool, &m.message_id).await, 1);
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        1
    );
    promises_hold(&pool).await;
}

// Found a hole (fixed: the fall back runs on the statement's own connection): a fallback could
// find its own failed statement still holding the settle lock.
/// The statement's failure reaches the client before its backend has let go of
/// the settle lock (PostgreSQL reports the error, then aborts the transaction), and the fallback
/// tries the lock at once on another connection: it finds its own failed round "at work" and
/// answers busy, settling nothing, with no other settler anywhere. With a row the call always
/// refuses at the head of the intake, every round of every settler does the same.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_fallback_is_never_busy_with_its_own_failed_statement(pool: PgPool) {
    refuse_letters_of(&pool, "incall", true).await;
    let c = consumer();
    let settler = own_pool(&pool, 3, Duration::from_secs(5)).await;
    let mut busy = 0;
    let tries = 30;
    for _ in 0..tries {
        let ids: Vec<String> = (0..4).map(|_| Uuid::new_v4().to_string()).collect();
        let bodies = ["incall not json", "not json a", "not json b", "not json c"];
        let letters: Vec<_> = ids
            .iter()
            .zip(bodies)
            .map(|(m, b)| (letter(&c, None, m, b, "not JSON", &[]), None))
            .collect();
        receive_letters(&pool, &letters, chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            .await,
            0,
            "no settler is at work"
        );
        let round = shared::dead_letter::settle_round(&settler, &c, chrono::Utc::now(), WAIT)
            .await
            .expect("a round");
        if round.busy {
            busy += 1;
        }
        // Whatever the round did, settle the rest before the next try.
        for _ in 0..20 {
            if intake_rows(&pool).await == 0 {
                break;
            }
            let _ = shared::dead_letter::settle_round(&settler, &c, chrono::Utc::now(), WAIT).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let left = intake_rows(&pool).await;
    promises_hold(&pool).await;
    assert_eq!(
        busy, 0,
        "{busy} of {tries} rounds refused by PostgreSQL answered busy with no other settler at work"
    );
    assert_eq!(left, 0);
}
