//! An outside attack on the last three changes: a batch's poison settled *beside* its jobs
//! (89f0b32, `process_batch`), a letter keeping its body once (7b27cb6, migration 0032: payload
//! NULL, read back from `body` by `body_as_json`), and the list indexes kept only for letters
//! that have a tenant, a correlation id or a job (0033-0036). Real PostgreSQL, the real harness
//! in both commit modes, the dead-letter API in process and the local SQS API for replays.

use consumer::{AwardPoints, count_awards};
use dead_letter_api::api::{ApiResponse, Scope};
use e2e::api_client::{caller, request, with_body};
use e2e::event_source::{Queue, create_queue, sqs_client};
use e2e::operations_kit::Apis;
use futures_util::future::join_all;
use serde_json::{Value, json};
use shared::dead_letter::{
    self, DeadLetter, ListFilter, ReplayOutcome, Verdict, Withdrawal, list_letters,
};
use shared::envelope::body_as_json;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::{DeadLetterId, JobId, TenantId};
use shared::replay::letter_body;
use shared_testkit::{envelope, message_on};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use uuid::Uuid;

const ALL: &[Scope] = &[Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit];

// ---------------------------------------------------------------------------------------------
// Setup.

/// A letter's detail, as an operator with every scope reads it.
async fn letter_detail(apis: &Apis, id: DeadLetterId) -> ApiResponse {
    apis.call(request(
        "GET",
        &format!("/v1/core/dead-letters/{}", id.0),
        Some(caller("ops-1", ALL)),
    ))
    .await
}

/// A letter replayed by an operator with every scope.
async fn replay_letter(apis: &Apis, id: DeadLetterId) -> ApiResponse {
    apis.call(request(
        "POST",
        &format!("/v1/core/dead-letters/{}/replay", id.0),
        Some(caller("ops-1", ALL)),
    ))
    .await
}

/// `msgs` as one batch through `h`, every record acked, then what it left received settled.
async fn acked_then_settled(pool: &PgPool, h: &Harness<AwardPoints>, msgs: &[IncomingMessage]) {
    let o = h.process_batch(msgs, &|| true, 10).await;
    assert!(
        o.iter()
            .all(|o| o.as_ref().is_some_and(RecordOutcome::is_ack)),
        "{o:#?}"
    );
    drain_intake(pool).await;
}

async fn queue(sqs: &aws_sdk_sqs::Client, tag: &str) -> Queue {
    create_queue(
        sqs,
        &format!("{tag}-{}", &Uuid::new_v4().simple().to_string()[..12]),
        &[],
    )
    .await
}

/// Every body the queue holds, as SQS hands them out (up to `n`, waiting a little for them).
async fn drain(sqs: &aws_sdk_sqs::Client, queue: &Queue, n: usize) -> Vec<String> {
    let mut bodies = Vec::new();
    for _ in 0..20 {
        if bodies.len() >= n {
            break;
        }
        let got = sqs
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage");
        for m in got.messages.unwrap_or_default() {
            bodies.push(m.body.unwrap_or_default());
            if let Some(handle) = m.receipt_handle {
                let _ = sqs
                    .delete_message()
                    .queue_url(&queue.url)
                    .receipt_handle(handle)
                    .send()
                    .await;
            }
        }
    }
    bodies
}

fn harness(pool: &PgPool, mode: CommitMode) -> Harness<AwardPoints> {
    e2e::harness_in(pool.clone(), AwardPoints::new(e2e::consumer_name()), mode)
}

async fn awards(pool: &PgPool, job: JobId) -> i64 {
    count_awards(pool, job).await.expect("counting awards")
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn letter_of(pool: &PgPool, message_id: &str) -> Option<DeadLetter> {
    dead_letter::letter_for_message(pool, &e2e::consumer_name(), message_id)
        .await
        .expect("reading a message's letter")
}

/// Whether the row keeps a payload of its own (0032: only where the body cannot give it back).
async fn stored_payload(pool: &PgPool, id: DeadLetterId) -> Option<Value> {
    sqlx::query_scalar("SELECT payload FROM core.dead_letters WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .expect("reading a letter's stored payload")
}

async fn drain_intake(pool: &PgPool) {
    dead_letter::settle_behind(
        pool,
        &e2e::consumer_name(),
        chrono::Utc::now(),
        Duration::from_secs(10),
        50,
    )
    .await
    .expect("settling what is left in the intake");
}

fn new_job() -> (JobId, TenantId) {
    (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()))
}

fn env_raw(job: JobId, tenant: TenantId, corr: &str, payload: &str) -> String {
    format!(
        r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":"{corr}","payload":{payload}}}"#,
        job.0, tenant.0
    )
}

/// Bodies at the edges of `body_as_json` and of what SQS carries; every one is poison for the
/// award consumer (points never an integer).
fn edge_bodies() -> Vec<(&'static str, String)> {
    let env = |payload: &str| {
        let (j, t) = new_job();
        env_raw(j, t, "c-edge", payload)
    };
    let (dj, dt) = new_job();
    let deep_env = format!(
        r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":"c","payload":{}"x"{}}}"#,
        dj.0,
        dt.0,
        "{\"a\":".repeat(200),
        "}".repeat(200)
    );
    vec![
        (
            "object",
            r#"{"a":1,"b":[true,null,"x"],"c":{"d":-0.0}}"#.to_owned(),
        ),
        ("envelope", env(r#"{"account_id":"a","points":"seven"}"#)),
        (
            "big-int",
            "123456789012345678901234567890123456789012345678901234567890".to_owned(),
        ),
        (
            "env-big-int",
            env(r#"{"account_id":"a","points":"x","n":123456789012345678901234567890123456789}"#),
        ),
        (
            "huge-exponent",
            env(r#"{"account_id":"a","points":1e400000}"#),
        ),
        (
            "tiny-exponent",
            env(r#"{"account_id":"a","points":"x","n":1e-400000}"#),
        ),
        (
            "rewritten-numbers",
            env(r#"{"account_id":"a","points":1.50,"m":-0,"e":1E+2,"f":0.0e5}"#),
        ),
        (
            "deep-array",
            format!("{}{}", "[".repeat(300), "]".repeat(300)),
        ),
        ("deep-envelope", deep_env),
        (
            "duplicate-keys",
            env(r#"{"account_id":"a","points":1,"points":"two"}"#),
        ),
        (
            "escaped-nul",
            env(r#"{"account_id":"a\u0000b","points":"x"}"#),
        ),
        (
            "lone-surrogate",
            env(r#"{"account_id":"\ud800","points":"x"}"#),
        ),
        (
            "escaped-surrogate-pair",
            env(r#"{"account_id":"\ud83d\ude00","points":"x"}"#),
        ),
        ("whitespace", " \n\t \r".to_owned()),
        ("empty", String::new()),
        (
            "bom",
            format!("\u{feff}{}", env(r#"{"account_id":"a","points":"x"}"#)),
        ),
        ("json-string", r#""just text""#.to_owned()),
        ("null", "null".to_owned()),
        (
            "unicode",
            env(r#"{"account_id":"é😀 \u00e9 \u2028","points":"x"}"#),
        ),
        (
            "large",
            env(&format!(
                r#"{{"account_id":"{}","points":"x"}}"#,
                "y".repeat(250_000)
            )),
        ),
    ]
}

/// What every reader of the letter of `body` must show: `body_as_json(body)` as its payload,
/// `body` as its body and what a replay sends.
async fn assert_reads_back(pool: &PgPool, apis: &Apis, tag: &str, msg: &IncomingMessage) {
    let body = &msg.body;
    let letter = letter_of(pool, &msg.message_id)
        .await
        .unwrap_or_else(|| panic!("{tag}: no letter for its poison message"));
    assert_eq!(letter.payload, body_as_json(body), "{tag}: payload");
    assert_eq!(letter.body.as_deref(), Some(body.as_str()), "{tag}: body");
    assert_eq!(&letter_body(&letter), body, "{tag}: what a replay sends");
    let by_id = dead_letter::letter(pool, letter.id)
        .await
        .unwrap()
        .expect("the letter by id");
    assert_eq!(by_id, letter, "{tag}: by id and by message alike");
    if !body.contains('\0') {
        assert_eq!(
            stored_payload(pool, letter.id).await,
            None,
            "{tag}: a body kept once"
        );
    }
    let detail = letter_detail(apis, letter.id).await;
    assert_eq!(detail.status, 200, "{tag}: {:#}", detail.body);
    assert_eq!(
        detail.body["letter"]["payload"],
        serde_json::to_value(body_as_json(body)).unwrap(),
        "{tag}: the API's payload"
    );
    assert_eq!(
        detail.body["body"],
        Value::String(letter.body.clone().unwrap()),
        "{tag}: the API's body"
    );
    let listed = list_letters(
        pool,
        &ListFilter {
            message_id: Some(msg.message_id.clone()),
            ..ListFilter::default()
        },
        None,
        10,
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 1, "{tag}: listed by its message id");
}

// ---------------------------------------------------------------------------------------------
// Body once.

/// Each edge body, written by both writers (a batch's poison received and settled together, in
/// batch mode; a lone poison record per job), reads back the same payload everywhere, and a
/// replay of each that has a job id sends its body byte for byte.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn every_edge_body_reads_back_its_payload_and_replays_byte_for_byte_from_both_writers(
    pool: PgPool,
) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    for together in [true, false] {
        let q = queue(&sqs, if together { "edge-t" } else { "edge-a" }).await;
        let msgs: Vec<(&str, IncomingMessage)> = edge_bodies()
            .into_iter()
            .map(|(tag, body)| (tag, message_on(&q.name, &body, 1)))
            .collect();
        if together {
            let h = harness(&pool, CommitMode::Batch);
            let batch: Vec<IncomingMessage> = msgs.iter().map(|(_, m)| m.clone()).collect();
            let outcomes = h.process_batch(&batch, &|| true, 10).await;
            for ((tag, _), o) in msgs.iter().zip(&outcomes) {
                assert!(
                    matches!(o, Some(RecordOutcome::DeadLettered { .. })),
                    "{tag}: {o:?}"
                );
            }
        } else {
            let h = harness(&pool, CommitMode::PerJob);
            for (tag, m) in &msgs {
                let o = h.process_batch(std::slice::from_ref(m), &|| true, 1).await;
                assert!(
                    matches!(o[0], Some(RecordOutcome::DeadLettered { .. })),
                    "{tag}: {o:?}"
                );
            }
        }
        drain_intake(&pool).await;
        let mut replayed = Vec::new();
        let mut with_job = Vec::new();
        for (tag, m) in &msgs {
            let tag = format!("{tag} ({})", if together { "together" } else { "alone" });
            assert_reads_back(&pool, &apis, &tag, m).await;
            let letter = letter_of(&pool, &m.message_id).await.unwrap();
            if letter.job_id.is_some() {
                let r = replay_letter(&apis, letter.id).await;
                assert_eq!(r.status, 200, "{tag}: {:#}", r.body);
                assert_eq!(r.body["replay"]["sent"], true, "{tag}: {:#}", r.body);
                replayed.push(m.body.clone());
                with_job.push(tag.clone());
                // Replayed, it reads back the same.
                let after = dead_letter::letter(&pool, letter.id)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    after.payload,
                    body_as_json(&m.body),
                    "{tag}: after its replay"
                );
            }
        }
        assert!(
            replayed.len() >= 9,
            "the envelopes a job id can be read from carry one: {with_job:?}"
        );
        let mut sent = drain(&sqs, &q, replayed.len()).await;
        sent.sort();
        replayed.sort();
        assert_eq!(sent.len(), replayed.len(), "every replay reached its queue");
        for (s, r) in sent.iter().zip(&replayed) {
            assert!(
                s == r,
                "a replay sends its body byte for byte: {} vs {} bytes",
                s.len(),
                r.len()
            );
        }
    }
    e2e::promises::both_hold(&pool).await;
}

/// A body holding an actual NUL inside a JSON string: its payload is `body_as_json` of the body
/// as received (a JSON *string*, since the body is not JSON), whichever writer wrote it.
// Found a hole (fixed by migration 0037): the intake keeps a body with its NULs replaced, and a
// letter settled from it read back body_as_json of the replaced body (here an object, even a
// valid envelope) where the same body written alone read back the JSON string it is.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_nul_inside_a_json_string_reads_back_one_payload_whichever_writer_wrote_it(pool: PgPool) {
    let (j, t) = new_job();
    let bodies = [
        "{\"a\":\"x\0y\"}".to_owned(),
        "\0garbage".to_owned(),
        env_raw(j, t, "c-nul", "{\"account_id\":\"a\0b\",\"points\":1}"),
    ];
    let mut wrong = Vec::new();
    for together in [false, true] {
        let msgs: Vec<IncomingMessage> = bodies.iter().map(|b| message_on("nul-q", b, 1)).collect();
        if together {
            let o = harness(&pool, CommitMode::Batch)
                .process_batch(&msgs, &|| true, 10)
                .await;
            assert!(
                o.iter()
                    .all(|o| o.as_ref().is_some_and(RecordOutcome::is_ack))
            );
        } else {
            let h = harness(&pool, CommitMode::PerJob);
            for m in &msgs {
                assert!(h.process(m).await.is_ack());
            }
        }
        drain_intake(&pool).await;
        for m in &msgs {
            let letter = letter_of(&pool, &m.message_id)
                .await
                .expect("a letter for each NUL body");
            assert_eq!(
                letter.body.as_deref(),
                Some(m.body.replace('\0', "\u{fffd}").as_str()),
                "the stored body replaces the NUL"
            );
            if letter.payload != body_as_json(&m.body) {
                wrong.push(format!(
                    "{}: {:?} reads back {} instead of {}",
                    if together { "together" } else { "alone" },
                    m.body,
                    letter.payload,
                    body_as_json(&m.body)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "payloads not body_as_json(body received):\n{}",
        wrong.join("\n")
    );
}

/// A withdrawn replay of a letter kept once (payload NULL): the letter 0022's trigger writes back
/// to review copies payload and body as they are, and reads back the same payload and body.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_withdrawn_replay_of_a_letter_kept_once_reads_back_its_body_and_payload(pool: PgPool) {
    let (j, t) = new_job();
    let h = harness(&pool, CommitMode::PerJob);
    let bodies = [
        env_raw(j, t, "c-w", r#"{"account_id":"a","points":1.50,"k":1E+2}"#),
        format!(
            "\u{feff}{}",
            env_raw(
                JobId(Uuid::new_v4()),
                t,
                "c-w2",
                r#"{"account_id":"a","points":"x"}"#
            )
        ),
        env_raw(
            JobId(Uuid::new_v4()),
            t,
            "c-w3",
            "{\"account_id\":\"a\0\",\"points\":\"x\"}",
        ),
    ];
    for (n, body) in bodies.iter().enumerate() {
        let m = message_on("withdraw-q", body, 1);
        assert!(h.process(&m).await.is_ack());
        let letter = letter_of(&pool, &m.message_id).await.expect("its letter");
        if letter.job_id.is_none() {
            continue;
        }
        {
            let target = letter.id;
            let mut locked = dead_letter::lock_letter(&pool, target, Duration::from_secs(5))
                .await
                .unwrap()
                .expect("the letter");
            locked
                .mark(
                    &Verdict::Replayed {
                        outcome: ReplayOutcome::Queued,
                        reason: None,
                        body: None,
                    },
                    "ops-1",
                    chrono::Utc::now(),
                )
                .await
                .expect("queueing its replay");
            locked.commit().await.expect("committing");
            let w = dead_letter::withdraw_replay(
                &pool,
                target,
                "ops-1",
                "the queue is gone",
                chrono::Utc::now(),
            )
            .await
            .expect("withdrawing");
            let Withdrawal::Withdrawn(back) = w else {
                panic!("{n}: {w:?}");
            };
            let again = dead_letter::letter(&pool, back).await.unwrap().unwrap();
            assert_eq!(again.payload, letter.payload, "{n}: the payload it had");
            assert_eq!(again.body, letter.body, "{n}: the body it had");
            assert_eq!(
                letter_body(&again),
                letter_body(&letter),
                "{n}: what it replays"
            );
            assert_eq!(
                stored_payload(&pool, back).await,
                stored_payload(&pool, letter.id).await,
                "{n}: stored alike"
            );
            if !body.contains('\0') {
                assert_eq!(again.payload, body_as_json(body), "{n}");
                assert_eq!(&letter_body(&again), body, "{n}");
            }
        }
    }
    e2e::promises::both_hold(&pool).await;
}

// ---------------------------------------------------------------------------------------------
// Partial list indexes.

/// Letters with a tenant, a correlation id and a job are found by each (with an index that now
/// keeps only known values); letters without one are found by none, nor by a job filter of
/// theirs; the planner still answers `job_id = …` (a partial index must not drop rows).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn lists_by_tenant_correlation_and_job_find_their_letters_and_never_the_nulls(pool: PgPool) {
    let mut msgs = Vec::new();
    let mut known = Vec::new();
    for n in 0..4 {
        let (j, t) = new_job();
        let corr = format!("corr-{n}-{}", Uuid::new_v4().simple());
        msgs.push(message_on(
            "list-q",
            &env_raw(j, t, &corr, r#"{"account_id":"a","points":"x"}"#),
            1,
        ));
        known.push((j, t, corr));
    }
    for n in 0..3 {
        msgs.push(message_on("list-q", &format!("garbage {n}"), 1));
    }
    // A body with a job id but neither tenant nor correlation.
    let (lone_job, _) = new_job();
    msgs.push(message_on(
        "list-q",
        &format!(r#"{{"job_id":"{}","payload":{{}}}}"#, lone_job.0),
        1,
    ));
    for mode in [CommitMode::Batch, CommitMode::PerJob] {
        let o = harness(&pool, mode)
            .process_batch(&msgs, &|| true, 10)
            .await;
        assert!(
            o.iter()
                .all(|o| o.as_ref().is_some_and(RecordOutcome::is_ack))
        );
    }
    drain_intake(&pool).await;
    let list = |f: ListFilter| {
        let pool = pool.clone();
        async move { list_letters(&pool, &f, None, 100).await.unwrap() }
    };
    for (j, t, corr) in &known {
        let by_job = list(ListFilter {
            job_id: Some(*j),
            ..Default::default()
        })
        .await;
        assert_eq!(by_job.len(), 1, "by job");
        assert_eq!(by_job[0].job_id, Some(*j));
        let by_tenant = list(ListFilter {
            tenant_id: Some(*t),
            ..Default::default()
        })
        .await;
        assert_eq!(by_tenant.len(), 1, "by tenant");
        let by_corr = list(ListFilter {
            correlation_id: Some(corr.clone()),
            ..Default::default()
        })
        .await;
        assert_eq!(by_corr.len(), 1, "by correlation");
        assert_eq!(by_corr[0].id, by_job[0].id);
        let both = list(ListFilter {
            tenant_id: Some(*t),
            correlation_id: Some(corr.clone()),
            job_id: Some(*j),
            consumer: Some(e2e::consumer_name().as_str().to_owned()),
            ..Default::default()
        })
        .await;
        assert_eq!(both.len(), 1, "all three");
    }
    let lone = list(ListFilter {
        job_id: Some(lone_job),
        ..Default::default()
    })
    .await;
    assert_eq!(lone.len(), 1, "a job without tenant: {lone:#?}");
    assert_eq!(lone[0].tenant_id, None);
    assert_eq!(
        list(ListFilter {
            job_id: Some(JobId(Uuid::new_v4())),
            ..Default::default()
        })
        .await
        .len(),
        0
    );
    assert_eq!(
        list(ListFilter {
            correlation_id: Some(String::new()),
            ..Default::default()
        })
        .await
        .len(),
        0,
        "an empty correlation id matches no NULL"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters WHERE job_id IS NULL"
        )
        .await,
        3
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.dead_letters").await,
        8,
        "one letter per message, whichever mode saw it first"
    );
    // The same through a plan that must use the partial index (no sequential scan allowed).
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .unwrap();
    for (j, t, corr) in &known {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM core.dead_letters WHERE job_id = $1 AND consumer = $2",
        )
        .bind(j.0)
        .bind(e2e::consumer_name().as_str())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(n, 1);
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM core.dead_letters WHERE tenant_id = $1 OR correlation_id = $2",
        )
        .bind(t.0)
        .bind(corr)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(n, 1);
    }
    tx.rollback().await.unwrap();
    e2e::promises::both_hold(&pool).await;
}

// ---------------------------------------------------------------------------------------------
// Poison beside its jobs: identity and concurrency.

/// The same job as `envelope(job, tenant, "c", {"account_id": "a", "points": 5})`, as poison: a
/// correlation id that is no string, the job id without hyphens, the points as `5.0E0`.
fn same_job_as_poison(job: JobId, tenant: TenantId) -> String {
    format!(
        r#"{{"job_id":"{}","correlation_id":7,"tenant_id":"{}","payload":{{"account_id":"a","points":5.0E0}}}}"#,
        job.0.simple(),
        tenant.0
    )
}

fn copy(m: &IncomingMessage) -> IncomingMessage {
    IncomingMessage {
        message_id: Uuid::new_v4().to_string(),
        ..m.clone()
    }
}

/// Several batches at once sharing job ids, each job spelled valid, as its own poison, and as
/// another job's poison under its id (both orders, several copies), with a settler of the
/// intake running behind them and readers of every letter: each job applied once, the other
/// job's poison keeps exactly one pending letter, the job's own poison none pending, nothing left
/// in the intake.
async fn racing_batches_keep_both_promises(connect: PgConnectOptions, mode: CommitMode) {
    let pool = shared_testkit::own_pool(connect, 40).await;
    let harnesses: Vec<_> = (0..3).map(|_| harness(&pool, mode)).collect();
    let mut jobs = Vec::new();
    let mut firsts: Vec<Vec<IncomingMessage>> = vec![Vec::new(), Vec::new(), Vec::new()];
    let (mut same, mut other) = (Vec::new(), Vec::new());
    for n in 0..8usize {
        let (job, tenant) = new_job();
        jobs.push(job);
        let valid = message_on(
            "race-q",
            &envelope(job, tenant, "c", json!({"account_id": "a", "points": 5})),
            1,
        );
        let p_same = message_on("race-q", &same_job_as_poison(job, tenant), 1);
        let p_other = message_on(
            "race-q",
            &envelope(
                job,
                tenant,
                "c",
                json!({"account_id": "a", "points": format!("seven-{n}")}),
            ),
            1,
        );
        same.push(p_same.clone());
        other.push(p_other.clone());
        // Batch 0: poison first, then the job (so both are first in the plan: side by side).
        firsts[0].extend([p_same.clone(), p_other.clone(), valid.clone()]);
        // Batch 1: the job first, its poison later (a copy, another message id).
        let (ps, po) = (copy(&p_same), copy(&p_other));
        same.push(ps.clone());
        other.push(po.clone());
        firsts[1].extend([copy(&valid), ps, po]);
        // Batch 2: the same messages as batch 0 again (SQS handing them out twice at once).
        if n % 2 == 0 {
            firsts[2].extend([valid.clone(), p_same.clone(), p_other.clone()]);
        } else {
            firsts[2].extend([p_other.clone(), valid.clone(), p_same.clone()]);
        }
    }
    for n in 0..4 {
        firsts[n % 3].push(message_on("race-q", &format!("garbage {n}"), 1));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let settler = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = dead_letter::settle_behind(
                    &pool,
                    &e2e::consumer_name(),
                    chrono::Utc::now(),
                    Duration::from_millis(500),
                    4,
                )
                .await;
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            rounds
        })
    };
    let reader = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut bad = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let all: Vec<DeadLetter> = sqlx::query_as("SELECT * FROM core.dead_letters")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                for l in all {
                    if l.payload != body_as_json(l.body.as_deref().unwrap_or_default()) {
                        bad.push(l.id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            bad
        })
    };
    let runs = firsts.iter().enumerate().map(|(i, batch)| {
        let h = &harnesses[i];
        async move {
            let outcomes = h.process_batch(batch, &|| true, 10).await;
            batch.iter().cloned().zip(outcomes).collect::<Vec<_>>()
        }
    });
    let mut left: Vec<IncomingMessage> = join_all(runs)
        .await
        .into_iter()
        .flatten()
        .filter(|(_, o)| !o.as_ref().is_some_and(RecordOutcome::is_ack))
        .map(|(m, _)| m)
        .collect();
    for delivery in 2..8 {
        if left.is_empty() {
            break;
        }
        let mut still = Vec::new();
        for mut m in left {
            m.receive_count = delivery;
            if !harnesses[0].process(&m).await.is_ack() {
                still.push(m);
            }
        }
        left = still;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(left.is_empty(), "never acked: {left:#?}");
    stop.store(true, Ordering::Relaxed);
    settler.await.unwrap();
    let bad = reader.await.unwrap();
    assert!(bad.is_empty(), "letters read with another payload: {bad:?}");
    drain_intake(&pool).await;

    for job in &jobs {
        assert_eq!(awards(&pool, *job).await, 1, "{job} applied once");
    }
    for m in &other {
        let l = letter_of(&pool, &m.message_id)
            .await
            .unwrap_or_else(|| panic!("another job's poison kept no letter: {}", m.body));
        assert_eq!(
            l.status.as_str(),
            "pending_review",
            "another job's poison is no copy of the job that committed: {l:#?}"
        );
        assert_eq!(l.payload, body_as_json(&m.body));
    }
    for m in &same {
        if let Some(l) = letter_of(&pool, &m.message_id).await {
            assert_ne!(
                l.status.as_str(),
                "pending_review",
                "its job committed: {l:#?}"
            );
        }
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        jobs.len() as i64,
        "one fence per job, no claim left"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.letter_intake").await,
        0
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM core.dead_letters WHERE job_id IS NULL"
        )
        .await,
        4,
        "each garbage body once"
    );
    e2e::promises::both_hold(&pool).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn racing_batches_with_poison_beside_shared_jobs_keep_both_promises_in_batch_mode(
    _opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    racing_batches_keep_both_promises(connect, CommitMode::Batch).await;
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn racing_batches_with_poison_beside_shared_jobs_keep_both_promises_per_job(
    _opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    racing_batches_keep_both_promises(connect, CommitMode::PerJob).await;
}

/// Repeats inside one batch: the same poison message delivered three times in one batch beside
/// its job's valid record twice, in both modes: one letter per message id, the job once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_message_repeated_inside_a_batch_beside_its_job_is_one_letter_and_one_effect(
    pool: PgPool,
) {
    for mode in [CommitMode::Batch, CommitMode::PerJob] {
        let (job, tenant) = new_job();
        let (other_job, _) = new_job();
        let _ = &other_job;
        let p_other = message_on(
            "rep-q",
            &envelope(
                job,
                tenant,
                "c",
                json!({"account_id": "a", "points": "nine"}),
            ),
            1,
        );
        let valid = message_on(
            "rep-q",
            &envelope(job, tenant, "c", json!({"account_id": "a", "points": 5})),
            1,
        );
        let garbage = message_on("rep-q", &format!("{{\"job_id\":\"{}\"", other_job.0), 1);
        let batch = vec![
            p_other.clone(),
            garbage.clone(),
            p_other.clone(),
            valid.clone(),
            garbage.clone(),
            copy(&valid),
            p_other.clone(),
        ];
        let o = harness(&pool, mode)
            .process_batch(&batch, &|| true, 10)
            .await;
        assert!(
            o.iter()
                .all(|o| o.as_ref().is_some_and(RecordOutcome::is_ack)),
            "{mode:?}: {o:#?}"
        );
        drain_intake(&pool).await;
        assert_eq!(awards(&pool, job).await, 1, "{mode:?}");
        let mine = count(
            &pool,
            &format!(
                "SELECT count(*) FROM core.dead_letters WHERE message_id = '{}'",
                p_other.message_id
            ),
        )
        .await;
        assert_eq!(
            mine, 1,
            "{mode:?}: one letter for the repeated poison message"
        );
        let l = letter_of(&pool, &p_other.message_id).await.unwrap();
        assert_eq!(
            l.status.as_str(),
            "pending_review",
            "{mode:?}: another job's poison"
        );
        let g = letter_of(&pool, &garbage.message_id)
            .await
            .expect("garbage's letter");
        assert_eq!(g.payload, body_as_json(&garbage.body));
    }
    e2e::promises::both_hold(&pool).await;
}

/// The chain poison -> letter (kept once) -> replay (byte for byte) -> poison again (its letter
/// linked) -> edit -> valid: one effect, nothing pending, each letter's payload its body's.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn poison_to_letter_to_replay_to_edit_to_valid_applies_once_with_every_letter_read_back(
    pool: PgPool,
) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let q = queue(&sqs, "chain").await;
    for mode in [CommitMode::Batch, CommitMode::PerJob] {
        let h = harness(&pool, mode);
        let (job, tenant) = new_job();
        // Numbers jsonb would rewrite, keys out of order, a BOM-free odd spacing.
        let poison = format!(
            "{{ \"payload\" : {{\"points\": 1.50e0, \"account_id\":\"a\"}}, \"tenant_id\":\"{}\", \"correlation_id\":\"c-chain\", \"job_id\":\"{}\" }}",
            tenant.0, job.0
        );
        let first = message_on(&q.name, &poison, 1);
        let beside = message_on(&q.name, "not json at all", 1);
        acked_then_settled(&pool, &h, &[first.clone(), beside.clone()]).await;
        let l1 = letter_of(&pool, &first.message_id)
            .await
            .expect("first letter");
        assert_reads_back(&pool, &apis, "chain l1", &first).await;
        let r = replay_letter(&apis, l1.id).await;
        assert_eq!(r.status, 200, "{:#}", r.body);
        let sent = drain(&sqs, &q, 1).await;
        assert_eq!(
            sent,
            vec![poison.clone()],
            "the replay sends the body as received"
        );
        let again = IncomingMessage {
            replay_of: Some(l1.id),
            ..message_on(&q.name, &sent[0], 1)
        };
        acked_then_settled(&pool, &h, &[again.clone(), copy(&beside)]).await;
        let l2 = letter_of(&pool, &again.message_id)
            .await
            .expect("second letter");
        assert_eq!(l2.replay_of, Some(l1.id), "linked to the letter it replays");
        assert_reads_back(&pool, &apis, "chain l2", &again).await;
        let edited = envelope(
            job,
            tenant,
            "c-chain",
            json!({"account_id": "a", "points": 2}),
        );
        let e = apis
            .call(with_body(
                request(
                    "POST",
                    &format!("/v1/core/dead-letters/{}/edit", l2.id.0),
                    Some(caller("ops-1", ALL)),
                ),
                &json!({"body": serde_json::from_str::<Value>(&edited).unwrap(), "reason": "points as an integer"})
                    .to_string(),
            ))
            .await;
        assert_eq!(e.status, 200, "{:#}", e.body);
        let sent = drain(&sqs, &q, 1).await;
        assert_eq!(sent.len(), 1);
        let fixed = IncomingMessage {
            replay_of: Some(l2.id),
            ..message_on(&q.name, &sent[0], 1)
        };
        // The fix beside a late copy of the poison in one batch.
        acked_then_settled(&pool, &h, &[copy(&first), fixed, copy(&first)]).await;
        assert_eq!(awards(&pool, job).await, 1, "{mode:?}: one effect");
        let letters = e2e::letters(&pool, job).await;
        assert!(
            letters
                .iter()
                .all(|l| l.status.as_str() != "pending_review"),
            "{mode:?}: nothing pending for a job that committed: {letters:#?}"
        );
        for l in &letters {
            assert_eq!(
                l.payload,
                body_as_json(l.body.as_deref().unwrap()),
                "{mode:?}"
            );
        }
    }
    e2e::promises::both_hold(&pool).await;
}
