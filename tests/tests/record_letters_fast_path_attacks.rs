//! An outside attack on 0039 (`core.record_letters` per round): the call's fences claimed in one
//! statement under a 1 ms lock_timeout in a subtransaction, with the one-by-one claims of 0029
//! as its fall back; error fingerprints memoised over runs of one error; the messages probed in
//! one statement; the written letters found by one hash join. Real PostgreSQL, real
//! concurrency: fences held uncommitted by other connections and ended at chosen moments, calls
//! racing over shared jobs and messages, 2,000 letters in one call, and the 0029 function
//! (installed beside it under another name in each test's own database) as the oracle for
//! seeded random calls.

use e2e::groups::{counts_match_letters, one_open_group_per_failure};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use uuid::Uuid;

const CONSUMER: &str = "fast-path-consumer";
const QUEUE: &str = "fast-path-jobs";
const NEW: &str = "record_letters";
const OLD: &str = "record_letters_0029";

const E_A: &str = "partner refused account 'acct-1' after 31 ms";
/// A's failure with other values: the same fingerprint, another text.
const E_A2: &str = "partner refused account 'acct-2' after 7 ms";
const E_B: &str = "ledger locked by batch 17";
const E_C: &str = "partner answered status 503";
const E_D: &str = "partner answered status 504";

const D1: &[u8] = b"\x01digest-one";
const D2: &[u8] = b"\x02digest-two";
const D3: &[u8] = b"\x03digest-three";

/// One letter of a call.
#[derive(Clone, Debug)]
struct L {
    job: Option<Uuid>,
    message: String,
    queue: String,
    kind: String,
    error: String,
    digest: Option<Vec<u8>>,
}

fn l(job: Option<Uuid>, message: &str, kind: &str, error: &str, digest: Option<&[u8]>) -> L {
    L {
        job,
        message: message.into(),
        queue: QUEUE.into(),
        kind: kind.into(),
        error: error.into(),
        digest: digest.map(<[u8]>::to_vec),
    }
}

/// An exhausted letter of a new job, digest D1.
fn fresh(message: &str, error: &str) -> L {
    l(Some(Uuid::new_v4()), message, "exhausted", error, Some(D1))
}

fn conflict_error(error: &str) -> String {
    format!("another job committed under this id; this job's own failure: {error}")
}

fn call_sql(func: &str) -> String {
    format!(
        "SELECT r.ord, r.verdict, r.letter_id, r.fresh FROM core.{func}(
            $1, now(), $2, NULL, $3,
            $4::uuid[], array_fill(NULL::uuid, ARRAY[cardinality($5::text[])]),
            $6::text[], $5::text[],
            array_fill('{{}}'::jsonb, ARRAY[cardinality($5::text[])]),
            array_fill('{{}}'::text, ARRAY[cardinality($5::text[])]),
            array_fill(1, ARRAY[cardinality($5::text[])]),
            $7::text[], $8::text[], $9::text[],
            array_fill(NULL::text, ARRAY[cardinality($5::text[])]),
            array_fill(NULL::uuid, ARRAY[cardinality($5::text[])]),
            $10::bytea[],
            array_fill(NULL::text, ARRAY[cardinality($5::text[])]),
            array_fill(NULL::text, ARRAY[cardinality($5::text[])])) r ORDER BY r.ord"
    )
}

/// (ord, verdict, letter_id, fresh)
type Answer = (i32, String, Option<Uuid>, bool);

async fn call_fn(
    conn: &mut PgConnection,
    func: &str,
    letters: &[L],
    settle: bool,
    wait: &str,
) -> sqlx::Result<Vec<Answer>> {
    sqlx::query_as(sqlx::AssertSqlSafe(call_sql(func)))
        .bind(CONSUMER)
        .bind(wait)
        .bind(settle)
        .bind(letters.iter().map(|l| l.job).collect::<Vec<_>>())
        .bind(
            letters
                .iter()
                .map(|l| l.message.clone())
                .collect::<Vec<_>>(),
        )
        .bind(letters.iter().map(|l| l.queue.clone()).collect::<Vec<_>>())
        .bind(letters.iter().map(|l| l.kind.clone()).collect::<Vec<_>>())
        .bind(letters.iter().map(|l| l.error.clone()).collect::<Vec<_>>())
        .bind(
            letters
                .iter()
                .map(|l| conflict_error(&l.error))
                .collect::<Vec<_>>(),
        )
        .bind(letters.iter().map(|l| l.digest.clone()).collect::<Vec<_>>())
        .fetch_all(conn)
        .await
}

async fn call(
    conn: &mut PgConnection,
    letters: &[L],
    settle: bool,
    wait: &str,
) -> sqlx::Result<Vec<Answer>> {
    call_fn(conn, NEW, letters, settle, wait).await
}

async fn connect(pool: &PgPool) -> PgConnection {
    PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap()
}

async fn exec(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn insert_fence(conn: &mut PgConnection, job: Uuid, digest: Option<&[u8]>) {
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at,
             payload_digest)
         VALUES ($1, $2, $3, now(), now() + interval '1 day', $4)",
    )
    .bind(job)
    .bind(CONSUMER)
    .bind(Uuid::nil())
    .bind(digest)
    .execute(conn)
    .await
    .unwrap();
}

/// The job's fence, committed (its work done), with `digest`.
async fn commit_fence(pool: &PgPool, job: Uuid, digest: Option<&[u8]>) {
    let mut c = pool.acquire().await.unwrap();
    insert_fence(&mut c, job, digest).await;
}

/// The job's fence inserted in a transaction left open on its own connection: a copy of the
/// job in flight.
async fn hold_fence(pool: &PgPool, job: Uuid, digest: Option<&[u8]>) -> PgConnection {
    let mut c = connect(pool).await;
    exec(&mut c, "BEGIN").await;
    insert_fence(&mut c, job, digest).await;
    c
}

/// Ends a holder's transaction after `after`.
fn end_after(mut c: PgConnection, after: Duration, commit: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        exec(&mut c, if commit { "COMMIT" } else { "ROLLBACK" }).await;
    })
}

async fn lock_timeout(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SELECT current_setting('lock_timeout')")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// The consumer's fences, by job.
async fn fences(pool: &PgPool) -> BTreeMap<Uuid, Option<Vec<u8>>> {
    sqlx::query_as::<_, (Uuid, Option<Vec<u8>>)>(
        "SELECT job_id, payload_digest FROM core.processed_jobs WHERE consumer = $1",
    )
    .bind(CONSUMER)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// A letter as read back: (id, job, kind, error, digest, group).
type Row = (Uuid, Option<Uuid>, String, String, Option<Vec<u8>>, i64);

/// The consumer's letters, by message.
async fn letters_on(conn: &mut PgConnection) -> BTreeMap<String, Row> {
    sqlx::query_as::<
        _,
        (
            String,
            Uuid,
            Option<Uuid>,
            String,
            String,
            Option<Vec<u8>>,
            i64,
        ),
    >(
        "SELECT message_id, id, job_id, error_kind, last_error, job_digest, group_id
           FROM core.dead_letters WHERE consumer = $1",
    )
    .bind(CONSUMER)
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .map(|(m, id, j, k, e, d, g)| (m, (id, j, k, e, d, g)))
    .collect()
}

async fn letters(pool: &PgPool) -> BTreeMap<String, Row> {
    let mut c = pool.acquire().await.unwrap();
    letters_on(&mut c).await
}

/// Every group check: counts as read equal the letters counted, one open group per failure,
/// and every letter in the group of its own queue, kind and fingerprint (the fingerprint
/// computed alone from the letter's own kind and error).
async fn groups_hold(pool: &PgPool) {
    counts_match_letters(pool).await;
    one_open_group_per_failure(pool).await;
    let strays: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT d.message_id, d.error_kind, d.last_error, g.fingerprint
           FROM core.dead_letters d JOIN core.dead_letter_groups g ON g.id = d.group_id
          WHERE g.consumer <> d.consumer OR g.queue <> d.queue OR g.error_kind <> d.error_kind
             OR g.fingerprint <> core.error_fingerprint(d.error_kind, d.last_error)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        strays.is_empty(),
        "letters in another failure's group: {strays:?}"
    );
    let ungrouped: i64 =
        sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE group_id IS NULL")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(ungrouped, 0, "a letter in no group");
}

/// How many claims this transaction made one by one (`core.claim_job_fence`, 0029's way and
/// 0039's fall back), counted by track_functions set for the transaction: none on the fast path.
async fn one_by_one_claims(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
          WHERE schemaname = 'core' AND funcname = 'claim_job_fence'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

fn sorted_jobs(n: usize) -> Vec<Uuid> {
    let mut jobs: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    jobs.sort();
    jobs
}

fn code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

// Identity: jobs and messages named twice, conflicts, poison.

/// A job named twice in one call (equal digests, then different ones) is claimed once, by its
/// first letter, for both; with its fence committed, each letter is answered by its own digest
/// (equal: no letter; other: a conflict letter; unknown: no letter), and the committed fence
/// outlives the call.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_twice_in_a_call_is_claimed_once_and_answered_per_letter(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let jobs = sorted_jobs(3);
    let a = call(
        &mut conn,
        &[
            l(Some(jobs[1]), "t-1", "exhausted", E_A, Some(D1)),
            l(Some(jobs[0]), "t-2", "exhausted", E_B, Some(D1)),
            l(Some(jobs[1]), "t-3", "permanent", E_A, Some(D2)),
            l(Some(jobs[0]), "t-4", "exhausted", E_B, Some(D1)),
        ],
        true,
        "1s",
    )
    .await
    .unwrap();
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    assert!(fences(&pool).await.is_empty(), "the claims went");

    commit_fence(&pool, jobs[2], Some(D1)).await;
    let b = call(
        &mut conn,
        &[
            l(Some(jobs[2]), "u-1", "exhausted", E_A, Some(D1)),
            l(Some(jobs[2]), "u-2", "exhausted", E_A, Some(D2)),
            l(Some(jobs[2]), "u-3", "exhausted", E_A, None),
            l(Some(jobs[2]), "u-4", "permanent", E_B, Some(D3)),
            l(Some(jobs[2]), "u-5", "exhausted", E_A, Some(D1)),
        ],
        true,
        "1s",
    )
    .await
    .unwrap();
    let verdicts: Vec<&str> = b.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(
        verdicts,
        [
            "already_processed",
            "conflict",
            "already_processed",
            "conflict",
            "already_processed"
        ],
        "{b:?}"
    );
    for x in &b {
        assert_eq!(x.3, x.1 == "conflict", "{x:?}");
        assert_eq!(x.2.is_some(), x.1 == "conflict", "{x:?}");
    }
    let ls = letters(&pool).await;
    assert!(!ls.contains_key("u-1") && !ls.contains_key("u-3") && !ls.contains_key("u-5"));
    assert_eq!(ls["u-2"].2, "conflict");
    assert_eq!(ls["u-2"].3, conflict_error(E_A));
    assert_eq!(ls["u-4"].2, "conflict");
    assert_eq!(ls["u-4"].3, conflict_error(E_B));
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(jobs[2], Some(D1.to_vec()))]),
        "the committed fence is not a claim of the call: it stays"
    );
    groups_hold(&pool).await;
}

/// A conflict between claimed jobs in job id order, poison without job ids (twice with one
/// error, and first in the call), and an unknown-digest letter of a committed job: each
/// answered on its own, the claims gone, the committed fences kept.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_conflict_beside_claimed_jobs_and_poison_without_ids(pool: PgPool) {
    let jobs = sorted_jobs(5);
    commit_fence(&pool, jobs[2], Some(D2)).await;
    commit_fence(&pool, jobs[4], None).await;
    let call_letters = [
        l(None, "p-1", "poison", E_B, None),
        l(Some(jobs[3]), "p-2", "exhausted", E_A, Some(D1)),
        l(Some(jobs[2]), "p-3", "exhausted", E_A, Some(D1)),
        l(None, "p-4", "poison", E_B, None),
        l(Some(jobs[0]), "p-5", "crashed", E_C, Some(D1)),
        l(Some(jobs[4]), "p-6", "exhausted", E_A, Some(D3)),
        l(Some(jobs[1]), "p-7", "exhausted", E_A, Some(D1)),
    ];
    let mut conn = pool.acquire().await.unwrap();
    let a = call(&mut conn, &call_letters, true, "1s").await.unwrap();
    let verdicts: Vec<&str> = a.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(
        verdicts,
        [
            "recorded",
            "recorded",
            "conflict",
            "recorded",
            "recorded",
            "already_processed",
            "recorded"
        ],
        "{a:?}"
    );
    let ls = letters(&pool).await;
    assert_eq!(ls.len(), 6, "{ls:?}");
    for (x, sent) in a.iter().zip(&call_letters) {
        if let Some(id) = x.2 {
            assert!(x.3, "{x:?}");
            let row = &ls[&sent.message];
            assert_eq!(row.0, id);
            assert_eq!(row.1, sent.job);
        }
    }
    assert_eq!(ls["p-3"].2, "conflict");
    assert_eq!(ls["p-1"].5, ls["p-4"].5, "one poison failure, one group");
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(jobs[2], Some(D2.to_vec())), (jobs[4], None)])
    );
    groups_hold(&pool).await;
}

/// A message twice in a call under other errors and kinds: one letter, its first copy's, and
/// no group for the second copy's failure; a first copy answered `already_processed` leaves the
/// letter to the next copy; a message lettered before keeps its letter for every copy.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_message_twice_in_a_call_has_one_letter(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let before = call(&mut conn, &[fresh("old", E_D)], true, "1s")
        .await
        .unwrap();
    let old_letter = before[0].2.unwrap();
    let done = Uuid::new_v4();
    commit_fence(&pool, done, Some(D1)).await;
    let a = call(
        &mut conn,
        &[
            fresh("m-1", E_A),
            l(Some(Uuid::new_v4()), "m-1", "permanent", E_B, Some(D1)),
            l(Some(done), "m-2", "exhausted", E_C, Some(D1)),
            l(Some(Uuid::new_v4()), "m-2", "permanent", E_A, Some(D1)),
            l(Some(Uuid::new_v4()), "m-2", "crashed", E_C, Some(D1)),
            l(Some(Uuid::new_v4()), "old", "permanent", E_C, Some(D1)),
            l(None, "old", "poison", E_C, None),
            l(None, "m-1", "poison", E_C, None),
        ],
        true,
        "1s",
    )
    .await
    .unwrap();
    let ls = letters(&pool).await;
    assert_eq!(ls.len(), 3, "{ls:?}");
    assert!(a[0].3 && a[0].2 == Some(ls["m-1"].0), "{a:?}");
    assert!(!a[1].3 && a[1].2 == Some(ls["m-1"].0), "{a:?}");
    assert!(!a[7].3 && a[7].2 == Some(ls["m-1"].0), "{a:?}");
    assert_eq!(a[2].1, "already_processed");
    assert_eq!(a[2].2, None);
    assert!(a[3].3 && a[3].2 == Some(ls["m-2"].0), "{a:?}");
    assert!(!a[4].3 && a[4].2 == Some(ls["m-2"].0), "{a:?}");
    assert!(!a[5].3 && a[5].2 == Some(old_letter), "{a:?}");
    assert!(!a[6].3 && a[6].2 == Some(old_letter), "{a:?}");
    assert_eq!(ls["m-1"].2, "exhausted");
    assert_eq!(ls["m-1"].3, E_A);
    assert_eq!(ls["m-2"].2, "permanent");
    let mut groups: Vec<(String, String)> =
        sqlx::query_as("SELECT error_kind, sample_error FROM core.dead_letter_groups")
            .fetch_all(&pool)
            .await
            .unwrap();
    groups.sort();
    let mut expected: Vec<(String, String)> =
        [("exhausted", E_D), ("exhausted", E_A), ("permanent", E_A)]
            .iter()
            .map(|(k, e)| ((*k).to_owned(), (*e).to_owned()))
            .collect();
    expected.sort();
    assert_eq!(groups, expected, "groups only of letters written");
    groups_hold(&pool).await;
}

// p_settle.

/// p_settle false: no claim at all, so neither a committed fence nor a held one stops a letter,
/// no fence is written or removed, and the held fence does not hold up the call.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn unsettled_calls_claim_nothing_and_wait_for_nothing(pool: PgPool) {
    let jobs = sorted_jobs(3);
    commit_fence(&pool, jobs[0], Some(D1)).await;
    let held = hold_fence(&pool, jobs[1], Some(D1)).await;
    let mut conn = pool.acquire().await.unwrap();
    exec(&mut conn, "SET lock_timeout = '7s'").await;
    let started = Instant::now();
    let a = call(
        &mut conn,
        &[
            l(Some(jobs[0]), "s-1", "exhausted", E_A, Some(D1)),
            l(Some(jobs[1]), "s-2", "exhausted", E_A, Some(D1)),
            l(Some(jobs[0]), "s-3", "exhausted", E_A, Some(D2)),
            l(Some(jobs[2]), "s-4", "exhausted", E_A, Some(D1)),
        ],
        false,
        "5s",
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    assert_eq!(lock_timeout(&mut conn).await, "7s");
    end_after(held, Duration::ZERO, true).await.unwrap();
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(jobs[0], Some(D1.to_vec())), (jobs[1], Some(D1.to_vec()))])
    );
    assert_eq!(letters(&pool).await.len(), 4);
    groups_hold(&pool).await;
}

/// The same letters settled and unsettled in one transaction: the unsettled call after a
/// settled one of the same job writes no claim and keeps no stale answer.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn settled_then_unsettled_in_one_transaction(pool: PgPool) {
    let job = Uuid::new_v4();
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let a = call(
        &mut tx,
        &[l(Some(job), "x-1", "exhausted", E_A, Some(D1))],
        true,
        "1s",
    )
    .await
    .unwrap();
    let b = call(
        &mut tx,
        &[
            l(Some(job), "x-1", "exhausted", E_B, Some(D2)),
            l(Some(job), "x-2", "exhausted", E_B, Some(D2)),
        ],
        false,
        "1s",
    )
    .await
    .unwrap();
    let c = call(
        &mut tx,
        &[l(Some(job), "x-3", "exhausted", E_B, Some(D2))],
        true,
        "1s",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(a[0].3);
    assert!(!b[0].3 && b[0].2 == a[0].2, "{b:?}");
    assert!(b[1].3, "{b:?}");
    assert!(c[0].3 && c[0].1 == "recorded", "{c:?}");
    assert!(fences(&pool).await.is_empty());
    groups_hold(&pool).await;
}

// The fall back: fences held uncommitted by other connections.

/// The fast path leaves the session's lock_timeout as it was: set for the session, set local
/// to the transaction, and the default.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_fast_path_leaves_lock_timeout_as_it_was(pool: PgPool) {
    let mut conn = connect(&pool).await;
    let before = lock_timeout(&mut conn).await;
    call(&mut conn, &[fresh("g-0", E_A)], true, "1s")
        .await
        .unwrap();
    assert_eq!(lock_timeout(&mut conn).await, before);
    exec(&mut conn, "SET lock_timeout = '7s'").await;
    call(
        &mut conn,
        &[fresh("g-1", E_A), fresh("g-2", E_B)],
        true,
        "1s",
    )
    .await
    .unwrap();
    assert_eq!(lock_timeout(&mut conn).await, "7s");
    exec(
        &mut conn,
        "BEGIN; SET LOCAL lock_timeout = '3s'; SET LOCAL track_functions = 'pl'",
    )
    .await;
    call(
        &mut conn,
        &[fresh("g-3", E_A), fresh("g-5", E_C), fresh("g-6", E_A)],
        true,
        "250ms",
    )
    .await
    .unwrap();
    assert_eq!(lock_timeout(&mut conn).await, "3s");
    assert_eq!(
        one_by_one_claims(&mut conn).await,
        0,
        "nothing waited: the fast path"
    );
    call(&mut conn, &[fresh("g-4", E_A)], false, "250ms")
        .await
        .unwrap();
    assert_eq!(lock_timeout(&mut conn).await, "3s");
    exec(&mut conn, "COMMIT").await;
    assert_eq!(lock_timeout(&mut conn).await, "7s");
    assert!(fences(&pool).await.is_empty());
    groups_hold(&pool).await;
}

/// One fence held by a copy in flight that commits (the same job) 300 ms into the call: the
/// call falls back, waits for it, answers `already_processed` for it and writes the others,
/// within its p_wait; the session's lock_timeout is as it was, no claim left.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_held_fence_committed_mid_call_is_waited_for(pool: PgPool) {
    let jobs = sorted_jobs(5);
    let holder = hold_fence(&pool, jobs[2], Some(D1)).await;
    let mut conn = connect(&pool).await;
    exec(&mut conn, "SET lock_timeout = '7s'").await;
    let ls: Vec<L> = jobs
        .iter()
        .enumerate()
        .map(|(n, j)| l(Some(*j), &format!("h-{n}"), "exhausted", E_A, Some(D1)))
        .collect();
    let ending = end_after(holder, Duration::from_millis(300), true);
    exec(&mut conn, "BEGIN; SET LOCAL track_functions = 'pl'").await;
    let started = Instant::now();
    let a = call(&mut conn, &ls, true, "3s").await.unwrap();
    let waited = started.elapsed();
    ending.await.unwrap();
    assert_eq!(
        one_by_one_claims(&mut conn).await,
        5,
        "the held fence made the call claim one by one"
    );
    exec(&mut conn, "COMMIT").await;
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    for (n, x) in a.iter().enumerate() {
        if n == 2 {
            assert_eq!((x.1.as_str(), x.2, x.3), ("already_processed", None, false));
        } else {
            assert!(x.1 == "recorded" && x.3, "{x:?}");
        }
    }
    assert_eq!(lock_timeout(&mut conn).await, "7s");
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(jobs[2], Some(D1.to_vec()))])
    );
    let written = letters(&pool).await;
    assert_eq!(written.len(), 4);
    assert!(!written.contains_key("h-2"));
    groups_hold(&pool).await;
}

/// The same held fence rolled back mid-call: the call claims it after all and writes every
/// letter once; nothing of the fast path's rolled-back claims is left.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_held_fence_rolled_back_mid_call_is_claimed_after_all(pool: PgPool) {
    let jobs = sorted_jobs(5);
    let holder = hold_fence(&pool, jobs[3], Some(D2)).await;
    let mut conn = connect(&pool).await;
    let before = lock_timeout(&mut conn).await;
    let ls: Vec<L> = jobs
        .iter()
        .enumerate()
        .map(|(n, j)| l(Some(*j), &format!("r-{n}"), "exhausted", E_A, Some(D1)))
        .collect();
    let ending = end_after(holder, Duration::from_millis(300), false);
    let a = call(&mut conn, &ls, true, "3s").await.unwrap();
    ending.await.unwrap();
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    assert_eq!(lock_timeout(&mut conn).await, before);
    assert!(fences(&pool).await.is_empty());
    assert_eq!(letters(&pool).await.len(), 5);
    groups_hold(&pool).await;
}

/// Several held fences in the middle of the job order, ended at different moments (the same
/// job commits, another job commits, a copy rolls back), among free jobs and poison: each
/// answered as its holder ended, every claim within one p_wait, nothing doubled.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn several_held_fences_ended_at_different_moments(pool: PgPool) {
    let jobs = sorted_jobs(7);
    let same = hold_fence(&pool, jobs[1], Some(D1)).await;
    let other = hold_fence(&pool, jobs[3], Some(D2)).await;
    let gone = hold_fence(&pool, jobs[5], Some(D1)).await;
    let mut ls: Vec<L> = jobs
        .iter()
        .enumerate()
        .map(|(n, j)| l(Some(*j), &format!("v-{n}"), "exhausted", E_A, Some(D1)))
        .collect();
    ls.push(l(None, "v-poison", "poison", E_B, None));
    // The other job's second letter, and the same job's redelivered message.
    ls.push(l(Some(jobs[3]), "v-3b", "exhausted", E_B, Some(D1)));
    ls.push(l(Some(jobs[1]), "v-1", "exhausted", E_A, Some(D2)));
    let mut conn = connect(&pool).await;
    exec(&mut conn, "SET lock_timeout = '9s'").await;
    let endings = [
        end_after(same, Duration::from_millis(150), true),
        end_after(other, Duration::from_millis(300), true),
        end_after(gone, Duration::from_millis(450), false),
    ];
    let started = Instant::now();
    let a = call(&mut conn, &ls, true, "2s").await.unwrap();
    let waited = started.elapsed();
    for e in endings {
        e.await.unwrap();
    }
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    let verdicts: Vec<&str> = a.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(
        verdicts,
        [
            "recorded",
            "already_processed",
            "recorded",
            "conflict",
            "recorded",
            "recorded",
            "recorded",
            "recorded",
            "conflict",
            "conflict"
        ],
        "{a:?}"
    );
    // v-1's second copy: a conflict (its own digest), the message not lettered before.
    let written = letters(&pool).await;
    assert_eq!(written.len(), 9, "{written:?}");
    assert_eq!(written["v-1"].2, "conflict");
    assert_eq!(written["v-1"].4.as_deref(), Some(D2));
    assert_eq!(written["v-3"].2, "conflict");
    assert_eq!(written["v-3b"].2, "conflict");
    assert_eq!(lock_timeout(&mut conn).await, "9s");
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(jobs[1], Some(D1.to_vec())), (jobs[3], Some(D2.to_vec()))])
    );
    groups_hold(&pool).await;
}

/// Held fences that are never released within the call's p_wait: the call fails with a lock
/// timeout after about one p_wait (not one per held job, not the fast path's 1 ms), writes
/// nothing, and after the savepoint's rollback the transaction's lock_timeout is as it was;
/// the same transaction then calls again once the holders are gone.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn held_fences_never_released_fail_the_call_within_one_wait(pool: PgPool) {
    let jobs = sorted_jobs(6);
    let mut holders = Vec::new();
    for j in &jobs[2..5] {
        holders.push(hold_fence(&pool, *j, Some(D1)).await);
    }
    let ls: Vec<L> = jobs
        .iter()
        .enumerate()
        .map(|(n, j)| l(Some(*j), &format!("w-{n}"), "exhausted", E_A, Some(D1)))
        .collect();
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    exec(&mut tx, "SET LOCAL lock_timeout = '4s'").await;
    let started = Instant::now();
    let failed = {
        let mut sp = tx.begin().await.unwrap();
        let failed = call(&mut sp, &ls, true, "600ms").await;
        sp.rollback().await.unwrap();
        failed
    };
    let waited = started.elapsed();
    let err = failed.expect_err("the held fences are never released");
    assert_eq!(code(&err).as_deref(), Some("55P03"), "{err}");
    assert!(waited >= Duration::from_millis(550), "{waited:?}");
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    assert_eq!(lock_timeout(&mut tx).await, "4s");
    for h in holders {
        end_after(h, Duration::ZERO, false).await.unwrap();
    }
    let a = call(&mut tx, &ls, true, "600ms").await.unwrap();
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    assert_eq!(lock_timeout(&mut tx).await, "4s");
    tx.commit().await.unwrap();
    assert!(fences(&pool).await.is_empty());
    assert_eq!(letters(&pool).await.len(), 6);
    groups_hold(&pool).await;
}

/// Holders that end one after another, each before the call's p_wait but together after it:
/// the call's claims share one p_wait (it fails within about that), and with a p_wait long
/// enough for all of them it succeeds.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn held_fences_ending_one_after_another_share_one_wait(pool: PgPool) {
    for (round, wait, ok) in [(0, "700ms", false), (1, "2s", true)] {
        let jobs = sorted_jobs(4);
        let mut endings = Vec::new();
        for (n, j) in jobs[1..].iter().enumerate() {
            let h = hold_fence(&pool, *j, Some(D1)).await;
            endings.push(end_after(
                h,
                Duration::from_millis(300 * (n as u64 + 1)),
                false,
            ));
        }
        let ls: Vec<L> = jobs
            .iter()
            .enumerate()
            .map(|(n, j)| {
                l(
                    Some(*j),
                    &format!("o-{round}-{n}"),
                    "exhausted",
                    E_A,
                    Some(D1),
                )
            })
            .collect();
        let mut conn = pool.acquire().await.unwrap();
        let started = Instant::now();
        let answer = call(&mut conn, &ls, true, wait).await;
        let waited = started.elapsed();
        for e in endings {
            e.await.unwrap();
        }
        if ok {
            let a = answer.unwrap();
            assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
            assert!(waited >= Duration::from_millis(850), "{waited:?}");
        } else {
            let err = answer.expect_err("900 ms of holders in a 700 ms wait");
            assert_eq!(code(&err).as_deref(), Some("55P03"), "{err}");
            assert!(waited < Duration::from_millis(1100), "{waited:?}");
        }
    }
    assert!(fences(&pool).await.is_empty());
    assert_eq!(letters(&pool).await.len(), 4);
    groups_hold(&pool).await;
}

/// The caller's own transaction holds a job's fence (its copy ran in it): the call's claim
/// finds it, answers each letter by its digest, and leaves the caller's fence in place.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_fence_of_the_callers_own_transaction_survives_the_call(pool: PgPool) {
    let job = Uuid::new_v4();
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    insert_fence(&mut tx, job, Some(D1)).await;
    let a = call(
        &mut tx,
        &[
            l(Some(job), "own-1", "exhausted", E_A, Some(D1)),
            l(Some(job), "own-2", "exhausted", E_A, Some(D2)),
            fresh("own-3", E_A),
        ],
        true,
        "1s",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let verdicts: Vec<&str> = a.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(verdicts, ["already_processed", "conflict", "recorded"]);
    assert_eq!(
        fences(&pool).await,
        BTreeMap::from([(job, Some(D1.to_vec()))])
    );
    groups_hold(&pool).await;
}

/// A committed fence that a sweeper is deleting, uncommitted: the call waits for the sweeper;
/// deleted, the job is claimed (recorded); the sweep rolled back, it is the job's
/// (already_processed).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweepers_uncommitted_delete_of_a_fence_is_waited_for(pool: PgPool) {
    for (round, commit, verdict) in [(0, true, "recorded"), (1, false, "already_processed")] {
        let job = Uuid::new_v4();
        commit_fence(&pool, job, Some(D1)).await;
        let mut sweeper = connect(&pool).await;
        exec(&mut sweeper, "BEGIN").await;
        sqlx::query("DELETE FROM core.processed_jobs WHERE job_id = $1")
            .bind(job)
            .execute(&mut sweeper)
            .await
            .unwrap();
        let ending = end_after(sweeper, Duration::from_millis(200), commit);
        let mut conn = pool.acquire().await.unwrap();
        let a = call(
            &mut conn,
            &[
                fresh(&format!("sw-{round}-a"), E_A),
                l(
                    Some(job),
                    &format!("sw-{round}"),
                    "exhausted",
                    E_A,
                    Some(D1),
                ),
            ],
            true,
            "3s",
        )
        .await
        .unwrap();
        ending.await.unwrap();
        assert_eq!(a[1].1, verdict, "{a:?}");
        assert!(a[0].3);
        let left = fences(&pool).await;
        assert_eq!(left.contains_key(&job), !commit, "{left:?}");
    }
    groups_hold(&pool).await;
}

// The errors' memo.

/// Letters whose kinds and errors alternate (A B A B), run (A A B B), share a fingerprint under
/// other texts (A, A2), share a text under other kinds, change queue, are turned into conflicts
/// between two of one error, and are skipped (a message's second copy) between runs: every
/// letter is in the group of its own (queue, kind, fingerprint), computed alone.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_letter_joins_the_group_of_its_own_error_whatever_its_neighbours(pool: PgPool) {
    let taken = sorted_jobs(2);
    commit_fence(&pool, taken[0], Some(D2)).await;
    commit_fence(&pool, taken[1], Some(D2)).await;
    let mut ls = Vec::new();
    let mut n = 0;
    let mut push = |ls: &mut Vec<L>, mut letter: L| {
        n += 1;
        letter.message = format!("e-{n:03}");
        ls.push(letter);
    };
    for e in [E_A, E_B, E_A, E_B, E_A, E_A, E_B, E_B, E_C, E_D, E_C, E_D] {
        push(&mut ls, fresh("", e));
    }
    for k in ["exhausted", "permanent", "exhausted", "crashed", "crashed"] {
        push(&mut ls, l(Some(Uuid::new_v4()), "", k, E_C, Some(D1)));
    }
    push(&mut ls, fresh("", E_A2));
    push(&mut ls, fresh("", E_A));
    push(&mut ls, fresh("", E_A2));
    // A conflict between two letters of one error.
    push(&mut ls, fresh("", E_C));
    push(&mut ls, l(Some(taken[0]), "", "exhausted", E_C, Some(D1)));
    push(&mut ls, fresh("", E_C));
    push(&mut ls, l(Some(taken[1]), "", "exhausted", E_D, Some(D1)));
    push(&mut ls, l(None, "", "poison", E_D, None));
    // Another queue, same kind and error.
    let mut elsewhere = fresh("", E_B);
    elsewhere.queue = "fast-path-other-jobs".into();
    push(&mut ls, elsewhere.clone());
    push(&mut ls, fresh("", E_B));
    push(&mut ls, elsewhere);
    let mut conn = pool.acquire().await.unwrap();
    // A message's second copy (not written) between two runs of errors.
    ls.insert(
        3,
        l(Some(Uuid::new_v4()), "e-001", "permanent", E_D, Some(D1)),
    );
    let a = call(&mut conn, &ls, true, "1s").await.unwrap();
    assert_eq!(a.len(), ls.len());
    assert!(!a[3].3, "a message's second copy: {:?}", a[3]);
    let written = letters(&pool).await;
    let mut by_failure: BTreeMap<(String, String, String), BTreeSet<i64>> = BTreeMap::new();
    for (x, sent) in a.iter().zip(&ls) {
        if !x.3 {
            continue;
        }
        let row = &written[&sent.message];
        let print: String = sqlx::query_scalar("SELECT core.error_fingerprint($1, $2)")
            .bind(&row.2)
            .bind(&row.3)
            .fetch_one(&pool)
            .await
            .unwrap();
        let (queue, kind, fp): (String, String, String) = sqlx::query_as(
            "SELECT queue, error_kind, fingerprint FROM core.dead_letter_groups WHERE id = $1",
        )
        .bind(row.5)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (queue.as_str(), kind.as_str(), fp.as_str()),
            (sent.queue.as_str(), row.2.as_str(), print.as_str()),
            "letter {} ({} {:?}) in another failure's group",
            sent.message,
            row.2,
            row.3
        );
        by_failure
            .entry((queue, kind, fp))
            .or_default()
            .insert(row.5);
    }
    for (failure, gs) in &by_failure {
        assert_eq!(gs.len(), 1, "{failure:?} in groups {gs:?}");
    }
    let groups: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letter_groups")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(groups as usize, by_failure.len());
    assert_eq!(written["e-022"].2, "conflict");
    assert_eq!(written["e-024"].2, "conflict");
    groups_hold(&pool).await;
}

// Concurrency.

/// Eight connections calling at once, eight rounds each, over 40 jobs and 60 messages they
/// share: 5 jobs committed before, 5 whose copies in flight commit mid-way (the same job), 5
/// whose copies roll back mid-way; a quarter of the calls rolled back by their caller. After:
/// no letter of a committed job, every answer of a message naming its one letter, one fresh
/// answer per letter, no claim left, every group's count exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn concurrent_calls_over_shared_jobs_and_messages_keep_every_promise(pool: PgPool) {
    let jobs = sorted_jobs(40);
    let committed: BTreeSet<Uuid> = jobs[..5].iter().copied().collect();
    let committing: BTreeSet<Uuid> = jobs[5..10].iter().copied().collect();
    for j in &committed {
        commit_fence(&pool, *j, Some(D1)).await;
    }
    let mut endings = Vec::new();
    for (n, j) in jobs[5..15].iter().enumerate() {
        let h = hold_fence(&pool, *j, Some(D1)).await;
        endings.push(end_after(
            h,
            Duration::from_millis(100 + 40 * n as u64),
            n < 5,
        ));
    }
    let others = PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let others = others.clone();
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(0xfa57 + t);
            let mut done = Vec::new();
            for round in 0..8 {
                let ls: Vec<L> = (0..10)
                    .map(|_| {
                        let message = format!("c-{}", rng.random_range(0..60));
                        let error = [E_A, E_B, E_C][rng.random_range(0..3)];
                        if rng.random_range(0..10) == 0 {
                            l(None, &message, "poison", error, None)
                        } else {
                            let kind = ["exhausted", "permanent"][rng.random_range(0..2)];
                            let job = jobs[rng.random_range(0..jobs.len())];
                            l(Some(job), &message, kind, error, Some(D1))
                        }
                    })
                    .collect();
                let kept = round % 4 != 3;
                let mut conn = others.acquire().await.unwrap();
                let mut tx = conn.begin().await.unwrap();
                let a = call(&mut tx, &ls, true, "5s")
                    .await
                    .unwrap_or_else(|e| panic!("task {t} round {round}: {e}"));
                if kept {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                done.push((ls, a, kept));
            }
            done
        }));
    }
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(t.await.unwrap());
    }
    for e in endings {
        e.await.unwrap();
    }
    let written = letters(&pool).await;
    let mut fresh_answers: BTreeMap<String, usize> = BTreeMap::new();
    for (ls, a, kept) in &calls {
        assert_eq!(ls.len(), a.len());
        for (sent, x) in ls.iter().zip(a) {
            if sent
                .job
                .is_some_and(|j| committed.contains(&j) || committing.contains(&j))
            {
                assert_eq!(
                    (x.1.as_str(), x.2, x.3),
                    ("already_processed", None, false),
                    "a letter of a committed job: {sent:?}"
                );
                continue;
            }
            assert_eq!(x.1, "recorded", "{sent:?} {x:?}");
            if !kept {
                continue;
            }
            let row = written
                .get(&sent.message)
                .unwrap_or_else(|| panic!("{sent:?} answered {x:?}, no letter"));
            assert_eq!(x.2, Some(row.0), "{sent:?}: the message's one letter");
            if x.3 {
                *fresh_answers.entry(sent.message.clone()).or_default() += 1;
            }
        }
    }
    for (m, row) in &written {
        assert!(
            !row.1
                .is_some_and(|j| committed.contains(&j) || committing.contains(&j)),
            "{m}: a letter of a committed job"
        );
        assert_eq!(
            fresh_answers.get(m).copied().unwrap_or(0),
            1,
            "{m}: one answer wrote it"
        );
    }
    assert_eq!(
        fences(&pool).await.keys().copied().collect::<BTreeSet<_>>(),
        committed.union(&committing).copied().collect(),
        "only the committed fences: no claim left behind"
    );
    groups_hold(&pool).await;
}

// Volume.

/// Calls of no letter and of one, settled and not.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn calls_of_zero_and_one_letter(pool: PgPool) {
    let mut conn = connect(&pool).await;
    exec(&mut conn, "SET lock_timeout = '7s'").await;
    for settle in [true, false] {
        let a = call(&mut conn, &[], settle, "1s").await.unwrap();
        assert!(a.is_empty(), "{a:?}");
    }
    let job = Uuid::new_v4();
    let a = call(
        &mut conn,
        &[l(Some(job), "one", "exhausted", E_A, Some(D1))],
        true,
        "1s",
    )
    .await
    .unwrap();
    assert_eq!(a.len(), 1);
    assert!(a[0].0 == 1 && a[0].1 == "recorded" && a[0].3, "{a:?}");
    let b = call(
        &mut conn,
        &[l(None, "one-p", "poison", E_B, None)],
        false,
        "1s",
    )
    .await
    .unwrap();
    assert!(b[0].3, "{b:?}");
    commit_fence(&pool, job, Some(D1)).await;
    let c = call(
        &mut conn,
        &[l(Some(job), "one-again", "exhausted", E_A, Some(D1))],
        true,
        "1s",
    )
    .await
    .unwrap();
    assert_eq!(c, [(1, "already_processed".to_owned(), None, false)]);
    assert_eq!(lock_timeout(&mut conn).await, "7s");
    assert_eq!(fences(&pool).await.len(), 1);
    assert_eq!(letters(&pool).await.len(), 2);
    groups_hold(&pool).await;
}

/// Installs 0029's function beside 0039's, as `core.record_letters_0029`: the oracle.
async fn install_0029(pool: &PgPool) {
    let text = include_str!("../../migrations/20261206000029_core_letters_call_corrected.sql");
    let start = text
        .find("CREATE OR REPLACE FUNCTION core.record_letters(")
        .expect("0029 defines the function");
    let end = start + text[start..].find("\n$$;").expect("its body ends") + "\n$$;".len();
    let body = text[start..end].replacen("core.record_letters(", &format!("core.{OLD}("), 1);
    let mut c = pool.acquire().await.unwrap();
    exec(&mut c, &body).await;
}

/// What a call did, without its random ids: each answer (verdict, fresh, the message of the
/// letter it names), and the consumer's letters, fences and groups after it. The held job's
/// fence is left out: its holder commits or rolls back 60 ms in, whenever the calls happen to
/// be read (on a loaded machine, after it; CI once), so it says nothing of the calls.
async fn outcome(conn: &mut PgConnection, answers: &[Answer], held: Option<Uuid>) -> String {
    let ls = letters_on(conn).await;
    let message_of: BTreeMap<Uuid, &String> = ls.iter().map(|(m, r)| (r.0, m)).collect();
    let answered: Vec<(i32, &str, bool, Option<&String>)> = answers
        .iter()
        .map(|x| {
            (
                x.0,
                x.1.as_str(),
                x.3,
                x.2.map(|id| *message_of.get(&id).expect("an answer names a letter")),
            )
        })
        .collect();
    let state: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' | ', d.message_id, d.job_id, d.error_kind, d.last_error,
                          encode(d.job_digest, 'hex'), d.status, d.queue, g.queue, g.error_kind,
                          g.fingerprint = core.error_fingerprint(d.error_kind, d.last_error),
                          g.letter_count, g.pending_count, g.sample_error, g.last_error,
                          g.resolved_at IS NULL,
                          (SELECT s.message_id FROM core.dead_letters s WHERE s.id = g.sample_letter_id))
           FROM core.dead_letters d JOIN core.dead_letter_groups_counted g ON g.id = d.group_id
          WHERE d.consumer = $1 ORDER BY d.message_id",
    )
    .bind(CONSUMER)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let fence_rows: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' | ', job_id, encode(payload_digest, 'hex'))
           FROM core.processed_jobs WHERE consumer = $1 AND job_id IS DISTINCT FROM $2
          ORDER BY job_id",
    )
    .bind(CONSUMER)
    .bind(held)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let group_count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM core.dead_letter_groups WHERE consumer = $1")
            .bind(CONSUMER)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    format!(
        "answers {answered:#?}\nletters {state:#?}\nfences {fence_rows:#?}\ngroups {group_count}"
    )
}

/// One random scenario: what was there before (committed in the caller's transaction: fences
/// with digests, letters of messages), one or two calls, maybe a fence held by another
/// connection that ends 60 ms in.
struct Scenario {
    fences: Vec<(Uuid, Option<Vec<u8>>)>,
    lettered: Vec<(String, String)>,
    calls: Vec<(Vec<L>, bool)>,
    held: Option<(Uuid, Option<Vec<u8>>, bool)>,
}

fn scenario(seed: u64) -> Scenario {
    let mut rng = StdRng::seed_from_u64(seed);
    let jobs: Vec<Uuid> = (1..=8u128)
        .map(|k| Uuid::from_u128(((seed as u128) << 64) | k))
        .collect();
    let digests: [Option<Vec<u8>>; 3] = [Some(D1.to_vec()), Some(D2.to_vec()), None];
    let errors = [E_A, E_A2, E_B, E_C, E_D, "took 31 ms", "took 32 ms"];
    let kinds = ["exhausted", "permanent", "poison", "crashed"];
    let mut fences = Vec::new();
    for j in &jobs[..rng.random_range(0..5)] {
        fences.push((*j, digests[rng.random_range(0..3)].clone()));
    }
    let lettered = (0..rng.random_range(0..4))
        .map(|_| {
            (
                format!("m{}", rng.random_range(0..10)),
                errors[rng.random_range(0..errors.len())].to_owned(),
            )
        })
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect();
    let held = (rng.random_range(0..3) == 0).then(|| {
        (
            jobs[rng.random_range(5..8)],
            digests[rng.random_range(0..3)].clone(),
            rng.random_range(0..2) == 0,
        )
    });
    let mut calls = Vec::new();
    for _ in 0..rng.random_range(1..3) {
        let n = rng.random_range(0..14);
        // Runs of one error as often as changes.
        let mut error = errors[0];
        let ls = (0..n)
            .map(|_| {
                if rng.random_range(0..2) == 0 {
                    error = errors[rng.random_range(0..errors.len())];
                }
                let kind = kinds[rng.random_range(0..kinds.len())];
                let job = if kind == "poison" && rng.random_range(0..3) == 0 {
                    None
                } else {
                    Some(jobs[rng.random_range(0..jobs.len())])
                };
                let mut letter = l(
                    job,
                    &format!("m{}", rng.random_range(0..10)),
                    kind,
                    error,
                    None,
                );
                letter.digest = digests[rng.random_range(0..3)].clone();
                if rng.random_range(0..6) == 0 {
                    letter.queue = "fast-path-other-jobs".into();
                }
                letter
            })
            .collect();
        calls.push((ls, rng.random_range(0..6) != 0));
    }
    Scenario {
        fences,
        lettered,
        calls,
        held,
    }
}

/// Runs `s` with `func` in a transaction it rolls back (or commits, when asked); the outcome.
async fn run_scenario(pool: &PgPool, func: &str, s: &Scenario, keep: bool) -> String {
    let mut holder = None;
    if let Some((job, digest, _)) = &s.held {
        holder = Some(hold_fence(pool, *job, digest.as_deref()).await);
    }
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    for (job, digest) in &s.fences {
        insert_fence(&mut tx, *job, digest.as_deref()).await;
    }
    for (n, (m, e)) in s.lettered.iter().enumerate() {
        sqlx::query(
            "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
                 attempts, error_kind, last_error, created_at)
             VALUES ($1, $2, $3, $4, '{}', '{}', 1, 'exhausted', $5, now())",
        )
        .bind(Uuid::from_u128(0xbef0_u128 << 16 | n as u128))
        .bind(CONSUMER)
        .bind(QUEUE)
        .bind(m)
        .bind(e)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    let ending = holder.map(|h| {
        end_after(
            h,
            Duration::from_millis(60),
            s.held.as_ref().is_some_and(|x| x.2),
        )
    });
    let mut out = String::new();
    for (ls, settle) in &s.calls {
        let a = call_fn(&mut tx, func, ls, *settle, "5s")
            .await
            .unwrap_or_else(|e| panic!("{func}: {e}"));
        out.push_str(&outcome(&mut tx, &a, s.held.as_ref().map(|h| h.0)).await);
        out.push('\n');
    }
    if let Some(e) = ending {
        e.await.unwrap();
    }
    if keep {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    if let Some((job, _, true)) = &s.held {
        sqlx::query("DELETE FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2")
            .bind(job)
            .bind(CONSUMER)
            .execute(pool)
            .await
            .unwrap();
    }
    out
}

/// Seeded random calls (jobs and messages named twice, committed fences of equal, other and
/// unknown digests, messages lettered before, poison without ids, runs and changes of errors,
/// two queues, settled or not, two calls in one transaction, a third of them falling back on a
/// held fence that commits or rolls back 60 ms in): 0039 answers and writes exactly what 0029
/// does.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn random_calls_answer_and_write_as_0029_did(pool: PgPool) {
    install_0029(&pool).await;
    for seed in 0..160 {
        let s = scenario(seed);
        let old = run_scenario(&pool, OLD, &s, false).await;
        let new = run_scenario(&pool, NEW, &s, false).await;
        assert_eq!(
            new, old,
            "seed {seed}: 0039 differs from 0029; calls {:#?}, fences before {:?}, lettered {:?}, held {:?}",
            s.calls, s.fences, s.lettered, s.held
        );
    }
    assert!(fences(&pool).await.is_empty());
    assert!(letters(&pool).await.is_empty());
}

/// 2,000 letters in one call: 1,500 jobs, 250 of them named twice (one with another digest),
/// 200 poison without ids, 100 messages named twice, 40 messages lettered before, 10 jobs
/// committed with the same digest and 10 with another, errors in runs and alternations. 0039
/// answers and writes as 0029 did; a fence held in the middle of the job order (rolled back
/// 100 ms in) makes the call fall back, with the same outcome; the counts are exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn two_thousand_letters_in_one_call(pool: PgPool) {
    install_0029(&pool).await;
    let jobs = sorted_jobs(1_500);
    let errors = [E_A, E_B, E_C, E_D, E_A2, "took 31 ms", "disk full"];
    for j in &jobs[100..110] {
        commit_fence(&pool, *j, Some(D1)).await;
    }
    for j in &jobs[200..210] {
        commit_fence(&pool, *j, Some(D2)).await;
    }
    let mut conn = pool.acquire().await.unwrap();
    let before: Vec<L> = (0..40)
        .map(|n| fresh(&format!("big-{}", n * 37), E_B))
        .collect();
    call(&mut conn, &before, true, "5s").await.unwrap();
    let mut rng = StdRng::seed_from_u64(2_000);
    let mut ls = Vec::with_capacity(2_000);
    for n in 0..2_000usize {
        let error = if n % 100 < 50 {
            errors[(n / 7) % errors.len()]
        } else {
            errors[n % 3]
        };
        let message = if n % 20 == 19 {
            format!("big-{}", rng.random_range(0..n))
        } else {
            format!("big-{n}")
        };
        let letter = if n % 10 == 5 {
            l(None, &message, "poison", error, None)
        } else if n >= 1_750 {
            let j = jobs[rng.random_range(0..jobs.len())];
            let d = if n % 2 == 0 { D1 } else { D3 };
            l(Some(j), &message, "permanent", error, Some(d))
        } else {
            l(
                Some(jobs[n % jobs.len()]),
                &message,
                "exhausted",
                error,
                Some(D1),
            )
        };
        ls.push(letter);
    }
    assert_eq!(ls.len(), 2_000);
    let s = Scenario {
        fences: Vec::new(),
        lettered: Vec::new(),
        calls: vec![(ls.clone(), true)],
        held: None,
    };
    let started = Instant::now();
    let old = run_scenario(&pool, OLD, &s, false).await;
    let old_took = started.elapsed();
    let started = Instant::now();
    let new = run_scenario(&pool, NEW, &s, false).await;
    let new_took = started.elapsed();
    eprintln!("2,000 letters: 0029 {old_took:?}, 0039 {new_took:?} (with the reads after)");
    assert_eq!(new, old, "0039 differs from 0029 on 2,000 letters");
    let fallen = Scenario {
        held: Some((jobs[750], Some(D2.to_vec()), false)),
        ..s
    };
    let started = Instant::now();
    let fell = run_scenario(&pool, NEW, &fallen, true).await;
    eprintln!("2,000 letters falling back: {:?}", started.elapsed());
    assert_eq!(fell, old, "the fall back answers as the fast path");
    let written = letters(&pool).await;
    let expected_fences: BTreeSet<Uuid> = jobs[100..110]
        .iter()
        .chain(&jobs[200..210])
        .copied()
        .collect();
    assert_eq!(
        fences(&pool).await.keys().copied().collect::<BTreeSet<_>>(),
        expected_fences
    );
    assert!(written.len() > 1_500, "{}", written.len());
    groups_hold(&pool).await;
    assert!(new_took < Duration::from_secs(60), "{new_took:?}");
}
