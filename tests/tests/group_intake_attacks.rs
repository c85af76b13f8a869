//! Outside attacks on commit 0c4ac2f: batch mode's poison received inside its commit group's
//! transaction (`commit_group_receiving`, `receiving_statement` rendered with SQL literals and
//! sent with the group's check and `COMMIT`), and the settle due (`HarnessSettings::settle_due`).
//! Real PostgreSQL, the library harness. Every test ends with everything redelivered and settled,
//! then reads the promises back: one letter per poison message, each valid job's effect once,
//! nothing left in the intake, and `e2e::promises::both_hold`.

use chrono::{DateTime, Utc};
use consumer::AwardPoints;
use e2e::intake_kit::{copy_inside_its_transaction, hold_settle_lock, settle_all};
use serde_json::{Value, json};
use shared::clock::{Clock, ManualClock, SystemClock};
use shared::dead_letter::Recorded;
use shared::envelope::JobDigest;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{JobId, TenantId};
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Messages, harnesses, checks.

fn tenant() -> TenantId {
    TenantId(Uuid::new_v4())
}

fn award() -> Value {
    json!({"account_id": "a", "points": 5})
}

/// A valid new job's message, and its body's tenant.
fn valid_of(job: JobId, tenant: TenantId) -> IncomingMessage {
    message_on("jobs", &envelope(job, tenant, "c", award()), 1)
}

fn valid(job: JobId) -> IncomingMessage {
    valid_of(job, tenant())
}

/// A poison record of `job` (its points are not a number).
fn poison_of(job: JobId) -> IncomingMessage {
    let body = envelope(
        job,
        tenant(),
        "c",
        json!({"account_id": "a", "points": "x"}),
    );
    message_on("jobs", &body, 1)
}

fn poison() -> IncomingMessage {
    poison_of(JobId(Uuid::new_v4()))
}

fn again(m: &IncomingMessage) -> IncomingMessage {
    IncomingMessage {
        receive_count: m.receive_count + 1,
        ..m.clone()
    }
}

fn digest_of(body: &str) -> JobDigest {
    let value: Value = serde_json::from_str(body).expect("JSON");
    JobDigest::of(&value, &[])
}

fn settings(mode: CommitMode, due: Duration, wait: Duration) -> HarnessSettings {
    HarnessSettings {
        lock_timeout: wait,
        commit: mode,
        settle_due: due,
        ..shared_testkit::settings()
    }
}

fn harness(pool: &PgPool, mode: CommitMode, due: Duration) -> Harness<AwardPoints> {
    harness_on_clock(pool, mode, due, Arc::new(SystemClock))
}

fn harness_on_clock(
    pool: &PgPool,
    mode: CommitMode,
    due: Duration,
    clock: Arc<dyn Clock>,
) -> Harness<AwardPoints> {
    shared_testkit::harness_on(
        pool,
        AwardPoints::new(e2e::consumer_name()),
        settings(mode, due, Duration::from_secs(5)),
        clock,
    )
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn letters_of(pool: &PgPool, message_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE message_id = $1")
        .bind(message_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn awards(pool: &PgPool, job: JobId) -> i64 {
    consumer::count_awards(pool, job).await.unwrap()
}

/// Redelivers (one receive later) every record of `batch` whose outcome was not an ack, until
/// every one is acked (at most `rounds` times).
async fn redeliver_until_acked(
    harness: &Harness<AwardPoints>,
    batch: &[IncomingMessage],
    outcomes: &[RecordOutcome],
    rounds: usize,
) {
    let mut left: Vec<IncomingMessage> = batch
        .iter()
        .zip(outcomes)
        .filter(|(_, o)| !o.is_ack())
        .map(|(m, _)| again(m))
        .collect();
    for _ in 0..rounds {
        if left.is_empty() {
            return;
        }
        let outcomes = shared_testkit::run_batch(harness, &left).await;
        left = left
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| !o.is_ack())
            .map(|(m, _)| again(m))
            .collect();
    }
    assert!(left.is_empty(), "records never acked: {}", left.len());
}

/// Everything received settled; then: the intake empty, one letter per poison message, each
/// valid job's effect once, the promises.
async fn ends_well(pool: &PgPool, poison: &[IncomingMessage], valid: &[JobId], what: &str) {
    settle_all(pool).await;
    assert_eq!(
        count(pool, "SELECT count(*) FROM core.letter_intake").await,
        0,
        "{what}: a received row was left behind"
    );
    let ids: HashSet<&str> = poison.iter().map(|m| m.message_id.as_str()).collect();
    for id in ids {
        let n = letters_of(pool, id).await;
        assert_eq!(n, 1, "{what}: poison message {id} has {n} letters");
    }
    for job in valid {
        let n = awards(pool, *job).await;
        assert_eq!(n, 1, "{what}: job {} applied {n} times", job.0);
    }
    e2e::promises::both_hold(pool).await;
}

/// No backend of the test's database (but the asker's) is left inside a transaction: waits up
/// to two seconds for a cut connection's backend to end.
async fn no_transaction_left(pool: &PgPool, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let stuck: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT pid, state, left(query, 160) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND state LIKE 'idle in transaction%'",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        if stuck.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: backends left inside a transaction: {stuck:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn is_letter(o: &RecordOutcome, new: bool) -> bool {
    match o {
        RecordOutcome::DeadLettered {
            letter: Recorded::New(_),
            ..
        } => new,
        RecordOutcome::DeadLettered {
            letter: Recorded::Received(_),
            ..
        } => !new,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Identity and the literals.

/// Bodies, ids, queues and correlation ids that a literal could get wrong.
fn hostile(i: usize) -> IncomingMessage {
    let nasty = [
        "'",
        "\\",
        "''",
        "\\'",
        "E'\\x27'",
        "'); DROP TABLE core.letter_intake; --",
        "x'; COMMIT; DELETE FROM core.processed_jobs; --",
        "$$ dollar $$ $t$ tag $t$",
        "\\\\x00 \\u0000 \\0",
        "ü✓😀\u{2028}\u{FEFF}\u{202E}",
        "nul\0inside",
        "\"quoted\" {braces} [a,b] \"\\\"\"",
        "\t\r\n tab and newlines ",
    ];
    let n = nasty[i % nasty.len()];
    let body = match i % 4 {
        // Not JSON at all.
        0 => format!("{i}: not json {n}"),
        // An envelope whose payload does not parse, its correlation id hostile.
        1 => json!({
            "job_id": Uuid::new_v4(),
            "tenant_id": Uuid::new_v4(),
            "correlation_id": format!("{i}{n}"),
            "payload": {"account_id": n, "points": n},
        })
        .to_string(),
        // Half an envelope.
        2 => format!("{{\"job_id\": \"{}\", \"x\": \"{i}{n}", Uuid::new_v4()),
        // JSON, not an envelope.
        _ => json!([i, n]).to_string(),
    };
    let mut m = message_on("jobs", &body, 1);
    // A NUL in a message id is stored hashed: the ids here keep their other characters.
    m.message_id = format!("{}-{i}{}", m.message_id, n.replace('\0', "0"));
    if i.is_multiple_of(3) {
        m.queue = format!("q{n}");
    }
    m
}

/// The letters' columns a literal carries, keyed by body.
async fn letters_by_body(pool: &PgPool, prefix: &str) -> HashMap<String, Vec<Option<String>>> {
    let rows: Vec<(String, Vec<Option<String>>)> = sqlx::query_as(
        "SELECT body, ARRAY[queue, correlation_id, last_error, error_kind::text, job_id::text,
                      tenant_id::text, message_group, substr(message_id, 3), attempts::text,
                      job_digest::text]
           FROM core.dead_letters WHERE message_id LIKE $1 || '%'",
    )
    .bind(prefix)
    .fetch_all(pool)
    .await
    .unwrap();
    let n = rows.len();
    let map: HashMap<_, _> = rows.into_iter().collect();
    assert_eq!(map.len(), n, "two letters of one body under {prefix}");
    map
}

/// Hostile poison received in a commit group (the literal statement) and the same poison
/// received per job (the bound statement, `receive_and_settle`): both kept alike, column by
/// column; the tables whole; a 250 KB body and a batch of bodies over a round's 4 MiB.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn hostile_poison_in_a_commit_group_is_kept_as_the_bound_statement_keeps_it(pool: PgPool) {
    let grouped = harness(&pool, CommitMode::Batch, Duration::ZERO);
    let alone = harness(&pool, CommitMode::PerJob, Duration::ZERO);
    let mut all_poison = Vec::new();
    let mut jobs = Vec::new();
    let mut per_jobs = Vec::new();
    // A settler at work: the grouped rows stay received, to be read back.
    let held = hold_settle_lock(&pool).await;
    for round in 0..4 {
        let poison: Vec<IncomingMessage> = (round * 13..round * 13 + 13).map(hostile).collect();
        let mut batch: Vec<IncomingMessage> = Vec::new();
        let mut per_job: Vec<IncomingMessage> = Vec::new();
        for p in &poison {
            let mut g = p.clone();
            g.message_id = format!("g-{}", p.message_id);
            let mut a = p.clone();
            a.message_id = format!("p-{}", p.message_id);
            batch.push(g);
            per_job.push(a);
        }
        for _ in 0..3 {
            let job = JobId(Uuid::new_v4());
            jobs.push(job);
            batch.insert(1, valid(job));
        }
        let outcomes = e2e::intake_kit::run(&grouped, &batch).await;
        for (m, o) in batch.iter().zip(&outcomes) {
            if m.body.contains("\"points\":5") {
                assert!(matches!(o, RecordOutcome::Processed), "{o:?}");
            } else {
                assert!(is_letter(o, false), "{}: {o:?}", m.message_id);
            }
        }
        let ids: Vec<String> = batch.iter().map(|m| m.message_id.clone()).collect();
        let group_jobs: Vec<Uuid> = jobs[jobs.len() - 3..].iter().map(|j| j.0).collect();
        let (rows, transactions): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT x) FROM (
                 SELECT xmin::text AS x FROM core.processed_jobs WHERE job_id = ANY ($1)
                 UNION ALL
                 SELECT xmin::text FROM core.letter_intake WHERE message_id = ANY ($2)) t",
        )
        .bind(&group_jobs)
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (rows, transactions),
            (16, 1),
            "round {round}: not one commit, or rows lost"
        );
        all_poison.extend(
            batch
                .into_iter()
                .filter(|m| !m.body.contains("\"points\":5")),
        );
        per_jobs.push(per_job);
    }
    held.rollback().await.unwrap();
    for per_job in per_jobs {
        e2e::intake_kit::run(&alone, &per_job).await;
        all_poison.extend(per_job);
    }
    // Bodies of 250 KB, 17 of them (over a round's 4 MiB), with quotes and backslashes.
    let big: Vec<IncomingMessage> = (0..17)
        .map(|i| {
            let body = format!("{i}'\\E'{}", "a'\\\"\u{e9}".repeat(250 * 1024 / 6));
            let mut m = message_on("jobs", &body, 1);
            m.message_id = format!("g-big-{i}");
            m
        })
        .collect();
    let mut batch = big.clone();
    let (j1, j2) = (JobId(Uuid::new_v4()), JobId(Uuid::new_v4()));
    batch.push(valid(j1));
    batch.push(valid(j2));
    jobs.extend([j1, j2]);
    e2e::intake_kit::run(&grouped, &batch).await;
    let per_job: Vec<IncomingMessage> = big
        .iter()
        .map(|m| IncomingMessage {
            message_id: format!("p-big-{}", &m.message_id[6..]),
            ..m.clone()
        })
        .collect();
    e2e::intake_kit::run(&alone, &per_job).await;
    all_poison.extend(big);
    all_poison.extend(per_job);
    ends_well(&pool, &all_poison, &jobs, "hostile poison").await;
    let (g, p) = (
        letters_by_body(&pool, "g-").await,
        letters_by_body(&pool, "p-").await,
    );
    assert_eq!(g.len(), 13 * 4 + 17);
    assert_eq!(g.len(), p.len());
    for (body, columns) in &g {
        let other = p.get(body).unwrap_or_else(|| {
            panic!(
                "no per-job letter of body {:?}",
                &body[..body.len().min(80)]
            )
        });
        assert_eq!(columns, other, "the literal kept {body:?} otherwise");
    }
    for table in [
        "core.processed_jobs",
        "core.letter_intake",
        "core.dead_letters",
    ] {
        assert!(count(&pool, &format!("SELECT count(*) + 1 FROM {table}")).await > 0);
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        jobs.len() as i64
    );
}

/// One job id as poison and as a valid job in one batch (either first), a poison copy of a job
/// an earlier batch committed, and two poison records of one job id: each valid job applied
/// once, each poison message one letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_job_id_as_poison_and_as_valid_in_one_batch(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch, Duration::ZERO);
    let done = JobId(Uuid::new_v4());
    let earlier = vec![valid(done), valid(JobId(Uuid::new_v4()))];
    e2e::intake_kit::run(&h, &earlier).await;
    let (x, y, z) = (
        JobId(Uuid::new_v4()),
        JobId(Uuid::new_v4()),
        JobId(Uuid::new_v4()),
    );
    let others: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
    let poison = vec![
        poison_of(x),
        poison_of(y),
        poison_of(done),
        poison_of(z),
        poison_of(z),
    ];
    let batch = vec![
        poison[0].clone(),
        valid(others[0]),
        valid(x),
        valid(y),
        valid(others[1]),
        poison[1].clone(),
        poison[2].clone(),
        poison[3].clone(),
        valid(others[2]),
        poison[4].clone(),
    ];
    let outcomes = shared_testkit::run_batch(&h, &batch).await;
    redeliver_until_acked(&h, &batch, &outcomes, 5).await;
    let mut jobs = vec![x, y, done];
    jobs.extend(&others);
    ends_well(&pool, &poison, &jobs, "one job id as poison and valid").await;
}

/// The same poison message twice in one batch, and the same valid message twice, beside a commit
/// group: one letter, one effect.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_same_message_twice_in_one_batch(pool: PgPool) {
    for due in [Duration::ZERO, Duration::from_millis(50)] {
        let h = harness(&pool, CommitMode::Batch, due);
        let (p, q) = (poison(), poison());
        let jobs: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
        let v = valid(jobs[0]);
        let batch = vec![
            p.clone(),
            v.clone(),
            p.clone(),
            valid(jobs[1]),
            q.clone(),
            v.clone(),
            valid(jobs[2]),
            q.clone(),
            p.clone(),
        ];
        let outcomes = shared_testkit::run_batch(&h, &batch).await;
        redeliver_until_acked(&h, &batch, &outcomes, 5).await;
        ends_well(&pool, &[p, q], &jobs, &format!("twice, due {due:?}")).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Chains.

/// Received in the group (a settler at work), redelivered twice (once in another commit group,
/// once alone) while still received, then settled: one letter each.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn received_in_the_group_then_redelivered_then_settled(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch, Duration::ZERO);
    let held = hold_settle_lock(&pool).await;
    let poison: Vec<IncomingMessage> = (0..3).map(|_| poison()).collect();
    let mut jobs: Vec<JobId> = (0..4).map(|_| JobId(Uuid::new_v4())).collect();
    let mut first: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
    first.extend(poison.iter().cloned());
    let outcomes = e2e::intake_kit::run(&h, &first).await;
    for o in &outcomes[4..] {
        assert!(is_letter(o, false), "{o:?}");
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        3
    );
    // The whole batch again (its jobs duplicates now, its poison repeats).
    let second: Vec<IncomingMessage> = first.iter().map(again).collect();
    e2e::intake_kit::run(&h, &second).await;
    // The poison again, first deliveries' count, in a new commit group.
    let more: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
    let mut third: Vec<IncomingMessage> = more.iter().map(|j| valid(*j)).collect();
    third.extend(poison.iter().cloned());
    e2e::intake_kit::run(&h, &third).await;
    jobs.extend(more);
    held.rollback().await.unwrap();
    ends_well(&pool, &poison, &jobs, "a chain").await;
}

// ---------------------------------------------------------------------------------------------
// A group that does not commit.

/// The group's work fails (a permanent fault), with and without a due: the poison is received on
/// its own, one letter; the failing job its letter; the rest applied once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_whose_work_fails_leaves_its_poison_one_letter(pool: PgPool) {
    for due in [Duration::ZERO, Duration::from_millis(30)] {
        let faulty = e2e::faulty_award::AwardPointsWithFaults::new(e2e::consumer_name());
        let h = shared_testkit::harness_on(
            &pool,
            faulty,
            settings(CommitMode::Batch, due, Duration::from_secs(5)),
            Arc::new(SystemClock),
        );
        let jobs: Vec<JobId> = (0..5).map(|_| JobId(Uuid::new_v4())).collect();
        let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
        let bad = JobId(Uuid::new_v4());
        let failing = message_on(
            "jobs",
            &envelope(
                bad,
                tenant(),
                "c",
                json!({"account_id": "a", "points": 5, "demo_fault": "permanent"}),
            ),
            1,
        );
        batch.insert(2, failing.clone());
        let poison: Vec<IncomingMessage> = (0..2).map(|_| poison()).collect();
        batch.insert(0, poison[0].clone());
        batch.push(poison[1].clone());
        let outcomes = shared_testkit::run_batch(&h, &batch).await;
        assert!(outcomes.iter().all(RecordOutcome::is_ack), "{outcomes:?}");
        let mut lettered = poison.clone();
        lettered.push(failing);
        ends_well(&pool, &lettered, &jobs, &format!("work fails, due {due:?}")).await;
        assert_eq!(awards(&pool, bad).await, 0);
    }
}

/// The group's claim waits out (a copy of one of its jobs inside its transaction): the poison is
/// received on its own; the held job retried after the copy rolls back, applied once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_whose_claim_waits_out_leaves_its_poison_one_letter(pool: PgPool) {
    let own = shared_testkit::own_pool((*pool.connect_options()).clone(), 12).await;
    let h = shared_testkit::harness_on(
        &own,
        AwardPoints::new(e2e::consumer_name()),
        settings(
            CommitMode::Batch,
            Duration::ZERO,
            Duration::from_millis(300),
        ),
        Arc::new(SystemClock),
    );
    let jobs: Vec<JobId> = (0..4).map(|_| JobId(Uuid::new_v4())).collect();
    let t = tenant();
    let held_msg = valid_of(jobs[1], t);
    let copy = copy_inside_its_transaction(&own, jobs[1], t, &digest_of(&held_msg.body)).await;
    let poison: Vec<IncomingMessage> = (0..3).map(|_| poison()).collect();
    let mut batch = vec![valid(jobs[0]), held_msg, valid(jobs[2]), valid(jobs[3])];
    batch.insert(1, poison[0].clone());
    batch.extend(poison[1..].iter().cloned());
    let outcomes = shared_testkit::run_batch(&h, &batch).await;
    for (m, o) in batch.iter().zip(&outcomes) {
        if poison.iter().any(|p| p.message_id == m.message_id) {
            assert!(o.is_ack(), "poison not acked: {o:?}");
        }
    }
    let held_at = batch
        .iter()
        .position(|m| m.body.contains(&jobs[1].0.to_string()));
    let held_outcome = &outcomes[held_at.expect("the held job's record")];
    assert!(
        !matches!(held_outcome, RecordOutcome::Processed),
        "the copy's fence did not hold the group: {held_outcome:?}"
    );
    copy.rollback().await.unwrap();
    redeliver_until_acked(&h, &batch, &outcomes, 5).await;
    ends_well(&pool, &poison, &jobs, "claim waits out").await;
}

/// The group's intake insert refused (a constraint on one row) and, apart, its `COMMIT` refused
/// (a deferred constraint trigger that refuses the first row it checks, once): the group rolls
/// back, the poison is received on its own, nothing lost, nothing twice, no transaction left.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_whose_insert_or_commit_is_refused_leaves_its_poison_one_letter(pool: PgPool) {
    let h = harness(&pool, CommitMode::Batch, Duration::ZERO);
    // The insert refused, for one row.
    let refused = poison();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE core.letter_intake ADD CONSTRAINT refuse_one CHECK (message_id <> '{}')",
        refused.message_id
    )))
    .execute(&pool)
    .await
    .unwrap();
    let jobs: Vec<JobId> = (0..4).map(|_| JobId(Uuid::new_v4())).collect();
    let other = poison();
    let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
    batch.insert(2, refused.clone());
    batch.push(other.clone());
    let outcomes = shared_testkit::run_batch(&h, &batch).await;
    redeliver_until_acked(&h, &batch, &outcomes, 5).await;
    no_transaction_left(&pool, "insert refused").await;
    ends_well(&pool, &[refused, other], &jobs, "insert refused").await;
    // COMMIT refused: the check passed, the commit did not.
    sqlx::raw_sql(
        "CREATE SEQUENCE public.refuse_once_seq;
         CREATE FUNCTION public.refuse_once() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN
           IF nextval('public.refuse_once_seq') = 1 THEN
             RAISE EXCEPTION 'refused at commit';
           END IF;
           RETURN NULL;
         END $f$;
         CREATE CONSTRAINT TRIGGER refuse_once AFTER INSERT ON core.letter_intake
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_once();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let jobs: Vec<JobId> = (0..4).map(|_| JobId(Uuid::new_v4())).collect();
    let poison: Vec<IncomingMessage> = (0..2).map(|_| poison()).collect();
    let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
    batch.insert(1, poison[0].clone());
    batch.insert(3, poison[1].clone());
    let outcomes = shared_testkit::run_batch(&h, &batch).await;
    assert!(
        count(&pool, "SELECT last_value FROM public.refuse_once_seq").await >= 1,
        "the group's COMMIT never checked the trigger"
    );
    no_transaction_left(&pool, "commit refused").await;
    for j in &jobs {
        assert!(awards(&pool, *j).await <= 1);
    }
    redeliver_until_acked(&h, &batch, &outcomes, 5).await;
    ends_well(&pool, &poison, &jobs, "commit refused").await;
}

// ---------------------------------------------------------------------------------------------
// Cut connections.

/// A fresh batch of three jobs and two poison records (the jobs, the poison).
fn cut_batch() -> (Vec<IncomingMessage>, Vec<JobId>, Vec<IncomingMessage>) {
    let jobs: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
    let poison: Vec<IncomingMessage> = (0..2).map(|_| poison()).collect();
    let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
    batch.insert(1, poison[0].clone());
    batch.push(poison[1].clone());
    (batch, jobs, poison)
}

/// After a batch was cut (`cut`: its outcomes if it finished): no backend inside a transaction,
/// nothing applied twice; then its records redelivered until acked, everything settled, and the
/// promises read back.
async fn after_cut(
    pool: &PgPool,
    h: &Harness<AwardPoints>,
    what: &str,
    cut: Option<Vec<RecordOutcome>>,
    (batch, jobs, poison): (Vec<IncomingMessage>, Vec<JobId>, Vec<IncomingMessage>),
) {
    no_transaction_left(pool, what).await;
    let mut applied = 0;
    for j in &jobs {
        let n = awards(pool, *j).await;
        assert!(n <= 1, "{what}: applied twice");
        applied += n;
    }
    let received = count(pool, "SELECT count(*) FROM core.letter_intake").await;
    eprintln!("{what}: {applied} applied, {received} received");
    let redelivered: Vec<IncomingMessage> = match &cut {
        Some(outcomes) => batch
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| !o.is_ack())
            .map(|(m, _)| again(m))
            .collect(),
        None => batch.iter().map(again).collect(),
    };
    let outcomes = shared_testkit::run_batch(h, &redelivered).await;
    redeliver_until_acked(h, &redelivered, &outcomes, 5).await;
    ends_well(pool, &poison, &jobs, what).await;
}

/// A batch of three jobs and two poison records in batch mode cut after every poll (`n` counting
/// up until it finishes), with and without a due: after each cut no backend inside a
/// transaction, nothing applied twice; once redelivered and settled, one letter per poison
/// message, each job applied once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_carrying_poison_cut_after_any_poll(pool: PgPool) {
    let own = shared_testkit::own_pool((*pool.connect_options()).clone(), 6).await;
    for due in [Duration::ZERO, Duration::from_secs(3600)] {
        let h = harness(&own, CommitMode::Batch, due);
        let mut finished_at = None;
        for n in 1..=400u32 {
            let records = cut_batch();
            let run = shared_testkit::run_batch(&h, &records.0);
            let cut = shared_testkit::cut_after_polls(run, n).await;
            let finished = cut.is_some();
            after_cut(
                &pool,
                &h,
                &format!("due {due:?}, cut after {n} polls"),
                cut,
                records,
            )
            .await;
            if finished {
                finished_at = Some(n);
                break;
            }
        }
        assert!(
            finished_at.is_some(),
            "due {due:?}: the batch never finished"
        );
    }
}

/// The same batch cut by time, at forty points across an uncut run's duration (the poll count
/// is coarse: a whole transaction can run within one poll), so some cuts land inside the round
/// trip of the group's `INSERT …; SELECT core.finish_jobs_of(…); COMMIT`.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_carrying_poison_cut_at_any_time(pool: PgPool) {
    let own = shared_testkit::own_pool((*pool.connect_options()).clone(), 6).await;
    let h = harness(&own, CommitMode::Batch, Duration::ZERO);
    // Two uncut runs: the second, warm, is the one measured.
    let mut took = Duration::ZERO;
    for what in ["cold", "warm"] {
        let records = cut_batch();
        let started = std::time::Instant::now();
        let whole = shared_testkit::run_batch(&h, &records.0).await;
        took = started.elapsed();
        after_cut(&pool, &h, what, Some(whole), records).await;
    }
    for k in 0..40u32 {
        let at = took * k / 40;
        let records = cut_batch();
        let run = shared_testkit::run_batch(&h, &records.0);
        let cut = tokio::time::timeout(at, run).await.ok();
        after_cut(
            &pool,
            &h,
            &format!("cut at {at:?} of {took:?}"),
            cut,
            records,
        )
        .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency and volume.

/// Eight writers side by side, each its own harness, mixed batches: fresh jobs and poison of
/// their own, plus messages several writers receive at once (SQS at least once: the same poison
/// message, the same valid job, to two writers), with a due of `due`.
async fn eight_writers(pool: &PgPool, due: Duration) {
    let own = shared_testkit::own_pool((*pool.connect_options()).clone(), 24).await;
    let shared_poison: Vec<IncomingMessage> = (0..8).map(|_| poison()).collect();
    let shared_jobs: Vec<JobId> = (0..8).map(|_| JobId(Uuid::new_v4())).collect();
    let shared_valid: Vec<IncomingMessage> = shared_jobs.iter().map(|j| valid(*j)).collect();
    let mut plans = Vec::new();
    let mut all_poison = shared_poison.clone();
    let mut all_jobs = shared_jobs.clone();
    for w in 0..8 {
        let mut batches = Vec::new();
        for b in 0..3 {
            let jobs: Vec<JobId> = (0..5).map(|_| JobId(Uuid::new_v4())).collect();
            let poison: Vec<IncomingMessage> = (0..(b + w) % 4).map(|_| poison()).collect();
            let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
            for (k, p) in poison.iter().enumerate() {
                batch.insert((k * 2) % batch.len(), p.clone());
            }
            batch.push(shared_poison[(w + b) % 8].clone());
            batch.push(shared_valid[(w * 3 + b) % 8].clone());
            all_poison.extend(poison);
            all_jobs.extend(jobs);
            batches.push(batch);
        }
        plans.push(batches);
    }
    let writers = plans.into_iter().map(|batches| {
        let h = harness(&own, CommitMode::Batch, due);
        async move {
            for batch in batches {
                let outcomes = shared_testkit::run_batch(&h, &batch).await;
                redeliver_until_acked(&h, &batch, &outcomes, 5).await;
            }
        }
    });
    tokio::time::timeout(
        Duration::from_secs(30),
        futures_util::future::join_all(writers),
    )
    .await
    .expect("eight writers finished");
    ends_well(
        pool,
        &all_poison,
        &all_jobs,
        &format!("eight writers, due {due:?}"),
    )
    .await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn eight_writers_side_by_side_without_a_due(pool: PgPool) {
    eight_writers(&pool, Duration::ZERO).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn eight_writers_side_by_side_with_a_due(pool: PgPool) {
    eight_writers(&pool, Duration::from_millis(40)).await;
}

/// A few thousand records: 24 batches of 100 (30 poison, 70 valid), four writers at once, the
/// settle lock held over the first half (so more than a round's 500 rows wait): every poison
/// message one letter, every job applied once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_few_thousand_records_in_commit_groups(pool: PgPool) {
    let own = shared_testkit::own_pool((*pool.connect_options()).clone(), 16).await;
    let held = hold_settle_lock(&pool).await;
    let mut batches = Vec::new();
    for _ in 0..24 {
        let mut batch: Vec<IncomingMessage> =
            (0..70).map(|_| valid(JobId(Uuid::new_v4()))).collect();
        for k in 0..30 {
            batch.insert(k * 3, poison());
        }
        batches.push(batch);
    }
    let run_half = |half: &[Vec<IncomingMessage>]| {
        let writers = half.chunks(3).map(|chunk| {
            let h = harness(&own, CommitMode::Batch, Duration::ZERO);
            let chunk = chunk.to_vec();
            async move {
                for batch in chunk {
                    e2e::intake_kit::run(&h, &batch).await;
                }
            }
        });
        futures_util::future::join_all(writers)
    };
    run_half(&batches[..12]).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        12 * 30,
        "the first half's poison is kept as received"
    );
    held.rollback().await.unwrap();
    run_half(&batches[12..]).await;
    settle_all(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        0
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM (SELECT message_id FROM core.dead_letters
                                    GROUP BY message_id HAVING count(*) = 1) t"
        )
        .await,
        24 * 30
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        24 * 30
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM reference.point_awards").await,
        24 * 70
    );
    e2e::promises::both_hold(&pool).await;
}

// ---------------------------------------------------------------------------------------------
// The due's clock edges.

fn micro_aligned(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap()
}

/// The harness's clock frozen, moved back, a millisecond short of the due and at it, and far
/// ahead: a writer settles when the newest letter is at least the due old or from its future,
/// leaves its rows otherwise; nothing is lost; a lone poison record with a due goes through the
/// intake.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_dues_clock_edges(pool: PgPool) {
    let due = Duration::from_secs(1);
    let t0 = micro_aligned(Utc::now());
    let clock = Arc::new(ManualClock::new(t0));
    let h = harness_on_clock(&pool, CommitMode::Batch, due, clock.clone());
    let mut all_poison = Vec::new();
    let mut all_jobs = Vec::new();
    let mut step = |settles: bool, what: &str| {
        let jobs: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
        let poison: Vec<IncomingMessage> = (0..2).map(|_| poison()).collect();
        let mut batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
        batch.insert(1, poison[0].clone());
        batch.push(poison[1].clone());
        all_poison.extend(poison);
        all_jobs.extend(jobs);
        (batch, settles, what.to_owned())
    };
    let check =
        |outcomes: &[RecordOutcome], batch: &[IncomingMessage], settles: bool, what: &str| {
            for (m, o) in batch.iter().zip(outcomes) {
                if m.body.contains("\"points\":\"x\"") {
                    assert!(is_letter(o, settles), "{what}: {o:?}");
                } else {
                    assert!(matches!(o, RecordOutcome::Processed), "{what}: {o:?}");
                }
            }
        };
    let plan = [
        (None, true, "no letter yet: settles"),
        (Some(chrono::Duration::zero()), false, "frozen: left"),
        (
            Some(chrono::Duration::milliseconds(999)),
            false,
            "999 ms: left",
        ),
        (
            Some(chrono::Duration::milliseconds(1)),
            true,
            "at the due: settles",
        ),
        (
            Some(chrono::Duration::hours(-1)),
            true,
            "moved back: settles",
        ),
        (
            Some(chrono::Duration::days(365 * 200)),
            true,
            "far ahead: settles",
        ),
        (
            Some(chrono::Duration::zero()),
            false,
            "far ahead, frozen: left",
        ),
        (
            Some(chrono::Duration::days(-365 * 200)),
            true,
            "back again: settles",
        ),
    ];
    for (by, settles, what) in plan {
        if let Some(by) = by {
            clock.advance(by);
        }
        let (batch, settles, what) = step(settles, what);
        let outcomes = e2e::intake_kit::run(&h, &batch).await;
        check(&outcomes, &batch, settles, what.as_str());
        if settles {
            assert_eq!(
                count(&pool, "SELECT count(*) FROM core.letter_intake").await,
                0,
                "{what}: the round left rows"
            );
        }
    }
    // A lone poison record per job, with a due, a letter written just now: through the intake,
    // left for the next round. (Back from far ahead, every writer settles until the clock
    // reaches the newest letter: a letter from the receiver's future tells nothing.)
    clock.advance(chrono::Duration::days(365 * 200));
    let lone = poison();
    let job = JobId(Uuid::new_v4());
    let outcomes = e2e::intake_kit::run(&h, &[lone.clone(), valid(job)]).await;
    assert!(is_letter(&outcomes[0], false), "{:?}", outcomes[0]);
    let alone = poison();
    let outcomes = e2e::intake_kit::run(&h, std::slice::from_ref(&alone)).await;
    assert!(is_letter(&outcomes[0], false), "{:?}", outcomes[0]);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        2
    );
    all_poison.extend([lone, alone]);
    all_jobs.push(job);
    ends_well(&pool, &all_poison, &all_jobs, "clock edges").await;
}
