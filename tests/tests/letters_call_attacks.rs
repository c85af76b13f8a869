//! An outside attack on 0029 (`core.record_letters` corrected) and on migrate's rebaseline of
//! 0028's superseded content: the trigger's `core.letters_grouped` setting leaking to a later
//! insert of the same transaction, group counts after calls mixed with plain inserts carrying
//! stray group ids, the call's one lock wait, redelivered messages in a call, and the
//! rebaseline touching nothing but the one superseded checksum.

use e2e::groups::{counts_match_letters, one_open_group_per_failure};
use sqlx::{Connection, PgConnection, PgPool};
use std::time::{Duration, Instant};
use uuid::Uuid;

const CONSUMER: &str = "attack-consumer";
const QUEUE: &str = "attack-jobs";

/// One letter of a call.
#[derive(Clone)]
struct L {
    job: Option<Uuid>,
    message: String,
    error: String,
    attempts: i32,
}

fn letter(message: &str, error: &str) -> L {
    L {
        job: Some(Uuid::new_v4()),
        message: message.into(),
        error: error.into(),
        attempts: 1,
    }
}

const CALL: &str = "SELECT r.ord, r.verdict, r.letter_id, r.fresh FROM core.record_letters(
    $1, now(), $2, NULL, $3,
    $4::uuid[], array_fill(NULL::uuid, ARRAY[cardinality($5::text[])]),
    array_fill($6::text, ARRAY[cardinality($5::text[])]),
    $5::text[],
    array_fill('{}'::jsonb, ARRAY[cardinality($5::text[])]),
    array_fill('{}'::text, ARRAY[cardinality($5::text[])]),
    $7::integer[],
    array_fill('exhausted'::text, ARRAY[cardinality($5::text[])]),
    $8::text[], $8::text[],
    array_fill(NULL::text, ARRAY[cardinality($5::text[])]),
    array_fill(NULL::uuid, ARRAY[cardinality($5::text[])]),
    array_fill(NULL::bytea, ARRAY[cardinality($5::text[])]),
    array_fill(NULL::text, ARRAY[cardinality($5::text[])]),
    array_fill(NULL::text, ARRAY[cardinality($5::text[])])) r ORDER BY r.ord";

type Answer = (i32, String, Option<Uuid>, bool);

async fn call(
    conn: &mut PgConnection,
    letters: &[L],
    settle: bool,
    wait: &str,
) -> sqlx::Result<Vec<Answer>> {
    sqlx::query_as(CALL)
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
        .bind(QUEUE)
        .bind(letters.iter().map(|l| l.attempts).collect::<Vec<_>>())
        .bind(letters.iter().map(|l| l.error.clone()).collect::<Vec<_>>())
        .fetch_all(conn)
        .await
}

/// A plain insert (not the call) of one letter, with the group_id it claims.
async fn plain_insert(
    conn: &mut PgConnection,
    message: &str,
    error: &str,
    group: Option<i64>,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
             attempts, error_kind, last_error, created_at, group_id)
         VALUES (gen_random_uuid(), $1, $2, $3, '{}', '{}', 1, 'exhausted', $4, now(), $5)
         RETURNING id",
    )
    .bind(CONSUMER)
    .bind(QUEUE)
    .bind(message)
    .bind(error)
    .bind(group)
    .fetch_optional(conn)
    .await
}

async fn group_of(pool: &PgPool, letter: Uuid) -> i64 {
    sqlx::query_scalar("SELECT group_id FROM core.dead_letters WHERE id = $1")
        .bind(letter)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The group of a failure's error (the one open group of its fingerprint), if any.
async fn open_group_of_error(pool: &PgPool, error: &str) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT id FROM core.dead_letter_groups WHERE consumer = $1 AND queue = $2
            AND error_kind = 'exhausted' AND fingerprint = core.error_fingerprint('exhausted', $3)
            AND resolved_at IS NULL",
    )
    .bind(CONSUMER)
    .bind(QUEUE)
    .bind(error)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn setting(conn: &mut PgConnection) -> Option<String> {
    sqlx::query_scalar("SELECT current_setting('core.letters_grouped', true)")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn check_counts(pool: &PgPool) {
    counts_match_letters(pool).await;
    one_open_group_per_failure(pool).await;
}

const E_A: &str = "partner refused account 'acct-1' after 1 ms";
const E_B: &str = "ledger locked by batch 17";

/// A call, then a plain insert in the same transaction claiming the call's group for another
/// failure: the setting is cleared after the call, so the plain insert joins its own group.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_plain_insert_after_a_call_in_one_transaction_joins_its_own_group(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let answers = call(&mut tx, &[letter("m-1", E_A)], true, "1s")
        .await
        .unwrap();
    assert!(answers[0].3, "{answers:?}");
    let s = setting(&mut tx).await;
    assert_ne!(s.as_deref(), Some("by the call"), "cleared after the call");
    let call_group: i64 =
        sqlx::query_scalar("SELECT group_id FROM core.dead_letters WHERE id = $1")
            .bind(answers[0].2.unwrap())
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    let stray = plain_insert(&mut tx, "m-2", E_B, Some(call_group))
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    let joined = group_of(&pool, stray).await;
    assert_ne!(joined, call_group);
    assert_eq!(open_group_of_error(&pool, E_B).await, Some(joined));
    check_counts(&pool).await;
}

/// A call whose insert fails (a letter of 0 attempts breaks a CHECK) after it set the
/// setting, inside a savepoint: rolling back to the savepoint must not leave the setting on
/// for a plain insert that follows in the same transaction.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_call_that_fails_inside_a_savepoint_leaves_no_setting_behind(pool: PgPool) {
    let seed = {
        let mut c = pool.acquire().await.unwrap();
        let a = call(&mut c, &[letter("seed", E_A)], true, "1s")
            .await
            .unwrap();
        a[0].2.unwrap()
    };
    let other_group = group_of(&pool, seed).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let mut broken = letter("m-broken", E_B);
    broken.attempts = 0;
    {
        let mut sp = tx.begin().await.unwrap();
        let failed = call(&mut sp, &[letter("m-ok", E_B), broken], true, "1s").await;
        let err = failed.expect_err("the CHECK on attempts refuses the insert");
        assert!(err.to_string().contains("check"), "{err}");
        sp.rollback().await.unwrap();
    }
    let s = setting(&mut tx).await;
    assert_ne!(
        s.as_deref(),
        Some("by the call"),
        "rolled back with the savepoint"
    );
    let stray = plain_insert(&mut tx, "m-after", E_B, Some(other_group))
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    assert_ne!(group_of(&pool, stray).await, other_group);
    let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        letters, 2,
        "the seed and the plain insert; the failed call wrote none"
    );
    check_counts(&pool).await;
}

/// The same failure caught by a PL/pgSQL exception block (a subtransaction), the plain insert
/// in the same block's function afterwards.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_call_failing_in_an_exception_block_leaves_no_setting_behind(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let seed = call(&mut conn, &[letter("seed", E_A)], true, "1s")
        .await
        .unwrap()[0]
        .2
        .unwrap();
    let other_group = group_of(&pool, seed).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DO $do$
         BEGIN
           BEGIN
             PERFORM core.record_letters('{CONSUMER}', now(), '1s', NULL, true,
               ARRAY[gen_random_uuid()], ARRAY[NULL::uuid], ARRAY['{QUEUE}'], ARRAY['m-broken'],
               ARRAY['{{}}'::jsonb], ARRAY['{{}}'], ARRAY[0], ARRAY['exhausted'], ARRAY['boom'],
               ARRAY['boom'], ARRAY[NULL::text], ARRAY[NULL::uuid], ARRAY[NULL::bytea],
               ARRAY[NULL::text], ARRAY[NULL::text]);
           EXCEPTION WHEN check_violation THEN NULL;
           END;
           INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
               attempts, error_kind, last_error, created_at, group_id)
           VALUES (gen_random_uuid(), '{CONSUMER}', '{QUEUE}', 'm-after', '{{}}', '{{}}', 1,
                   'exhausted', 'ledger locked by batch 17', now(), {other_group});
         END
         $do$"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let stray: Uuid =
        sqlx::query_scalar("SELECT id FROM core.dead_letters WHERE message_id = 'm-after'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(group_of(&pool, stray).await, other_group);
    let broken: i64 =
        sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE message_id = 'm-broken'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(broken, 0, "the call failed (its CHECK), and was caught");
    check_counts(&pool).await;
}

/// Calls mixed with plain inserts carrying a nonexistent group id, a resolved group's id, and
/// another open failure's group id: every count stays exact, one open group per failure.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn calls_mixed_with_plain_inserts_of_stray_group_ids_keep_counts_exact(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let first = call(
        &mut conn,
        &[letter("a-1", E_A), letter("b-1", E_B)],
        true,
        "1s",
    )
    .await
    .unwrap();
    let group_a = group_of(&pool, first[0].2.unwrap()).await;
    let group_b = group_of(&pool, first[1].2.unwrap()).await;
    // Resolve B: discard its only letter.
    sqlx::query(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'attack',
             reviewed_by = 'tester', reviewed_at = now() WHERE id = $1",
    )
    .bind(first[1].2.unwrap())
    .execute(&pool)
    .await
    .unwrap();
    check_counts(&pool).await;
    let mut tx = conn.begin().await.unwrap();
    // Nonexistent.
    plain_insert(&mut tx, "a-2", E_A, Some(987_654_321))
        .await
        .unwrap();
    // Resolved group of the same failure.
    plain_insert(&mut tx, "b-2", E_B, Some(group_b))
        .await
        .unwrap();
    call(
        &mut tx,
        &[letter("a-3", E_A), letter("b-3", E_B)],
        true,
        "1s",
    )
    .await
    .unwrap();
    // Another failure's open group, after a call in the same transaction.
    plain_insert(&mut tx, "b-4", E_B, Some(group_a))
        .await
        .unwrap();
    // A redelivered message by plain insert with a group id: skipped.
    let again = plain_insert(&mut tx, "a-1", E_A, Some(group_b))
        .await
        .unwrap();
    assert_eq!(again, None, "a message's second letter is not written");
    call(
        &mut tx,
        &[letter("a-5", E_A), letter("b-2", E_B), letter("b-5", E_B)],
        true,
        "1s",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    check_counts(&pool).await;
    let (a_letters, b_letters): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM core.dead_letters WHERE group_id = $1),
                (SELECT count(*) FROM core.dead_letters d JOIN core.dead_letter_groups g
                   ON g.id = d.group_id WHERE g.id <> $2 AND g.resolved_at IS NULL
                    AND d.last_error = $3)",
    )
    .bind(group_a)
    .bind(group_b)
    .bind(E_B)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(a_letters, 4, "a-1, a-2, a-3, a-5");
    assert_eq!(b_letters, 4, "b-2, b-3, b-4, b-5 in a new open group");
    let resolved_b: i64 =
        sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE group_id = $1")
            .bind(group_b)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(resolved_b, 1, "nothing joins a resolved group");
}

/// A redelivered message in a call (lettered before, by a call and by a plain insert), beside
/// new ones: answered with its letter, not fresh, counted once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn redelivered_messages_in_a_call_keep_their_letters_and_counts(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let first = letter("r-1", E_A);
    let a = call(&mut conn, std::slice::from_ref(&first), true, "1s")
        .await
        .unwrap();
    let plain = plain_insert(&mut conn, "r-2", E_A, None)
        .await
        .unwrap()
        .unwrap();
    // The same job redelivered (its fence gone with the first letter), and one under a new
    // job id (a copy).
    let b = call(
        &mut conn,
        &[
            first.clone(),
            letter("r-2", E_B),
            letter("r-3", E_A),
            letter("r-1", E_B),
        ],
        true,
        "1s",
    )
    .await
    .unwrap();
    assert_eq!(b[0].2, a[0].2, "{b:?}");
    assert!(!b[0].3);
    assert_eq!(b[1].2, Some(plain));
    assert!(!b[1].3);
    assert!(b[2].3);
    assert_eq!(b[3].2, a[0].2);
    assert!(!b[3].3);
    let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(letters, 3);
    assert_eq!(
        open_group_of_error(&pool, E_B).await,
        None,
        "no group opened for letters never written"
    );
    check_counts(&pool).await;
}

/// Holds `job`'s fence in an open transaction on its own connection.
async fn hold(pool: &PgPool, job: Uuid) -> PgConnection {
    let mut c = PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
    sqlx::query(
        "SELECT core.claim_job_fence($1, $2, $3, now(), now() + interval '1 hour', '1s', NULL)",
    )
    .bind(job)
    .bind(CONSUMER)
    .bind(Uuid::nil())
    .execute(&mut c)
    .await
    .unwrap();
    c
}

/// p_settle false with p_wait '0ms': no claim, so a job whose fence another transaction holds
/// does not hold up the call; it writes at once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn unsettled_with_no_wait_writes_at_once_past_a_held_fence(pool: PgPool) {
    let l = letter("u-1", E_A);
    let mut held = hold(&pool, l.job.unwrap()).await;
    let mut conn = pool.acquire().await.unwrap();
    let started = Instant::now();
    let a = call(&mut conn, &[l.clone(), letter("u-2", E_A)], false, "0ms")
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    sqlx::raw_sql("ROLLBACK").execute(&mut held).await.unwrap();
    check_counts(&pool).await;
}

/// p_settle true with p_wait '0ms': every claim still gets a millisecond (a lock_timeout of 0
/// would wait for ever), so uncontended claims all succeed, and a contended one gives up
/// rather than waiting for ever.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn settled_with_no_wait_claims_uncontended_jobs_and_gives_up_on_a_held_one(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let letters: Vec<L> = (0..5).map(|n| letter(&format!("z-{n}"), E_A)).collect();
    let a = call(&mut conn, &letters, true, "0ms").await.unwrap();
    assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
    let l = letter("z-held", E_A);
    let mut held = hold(&pool, l.job.unwrap()).await;
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        call(&mut conn, &[letter("z-free", E_A), l], true, "0ms"),
    )
    .await
    .expect("gives up, not waits for ever");
    assert!(answer.is_err(), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    sqlx::raw_sql("ROLLBACK").execute(&mut held).await.unwrap();
    let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(letters, 5, "the call that gave up wrote none");
    check_counts(&pool).await;
}

/// The first claims wait out most of the call's wait, one after another; a later job's fence
/// is held past the deadline: the claim that meets the deadline gets only what is left, so the
/// call gives up within about one wait (under two), not a wait per claim (0028: 0.6 + 0.6 +
/// 0.6 + 1 s = 2.8 s).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_deadline_spent_by_the_first_claim_leaves_the_second_only_the_rest(pool: PgPool) {
    let mut ls: Vec<L> = (0..4).map(|n| letter(&format!("d-{n}"), E_A)).collect();
    ls.sort_by_key(|l| l.job);
    let mut held = Vec::new();
    for l in &ls {
        held.push(hold(&pool, l.job.unwrap()).await);
    }
    let ending = tokio::spawn(async move {
        for mut c in held {
            tokio::time::sleep(Duration::from_millis(600)).await;
            sqlx::raw_sql("ROLLBACK").execute(&mut c).await.unwrap();
        }
    });
    let mut conn = pool.acquire().await.unwrap();
    let started = Instant::now();
    let answer = call(&mut conn, &ls, true, "1s").await;
    let waited = started.elapsed();
    assert!(answer.is_err(), "after {waited:?}: {answer:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    ending.await.unwrap();
    // And with the deadline spent exactly on the first claim but the second job free, the
    // call succeeds: the second claim still gets its millisecond.
    let mut ls = vec![letter("e-1", E_A), letter("e-2", E_A)];
    ls.sort_by_key(|l| l.job);
    let mut first = hold(&pool, ls[0].job.unwrap()).await;
    let ending = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(450)).await;
        sqlx::raw_sql("ROLLBACK").execute(&mut first).await.unwrap();
    });
    let answer = call(&mut conn, &ls, true, "500ms").await;
    ending.await.unwrap();
    // Either the first claim got in before its 500 ms, and then both are recorded, or it did
    // not and the call gave up: never a partial write.
    let letters: i64 =
        sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE message_id LIKE 'e-%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    match answer {
        Ok(a) => {
            assert!(a.iter().all(|x| x.1 == "recorded" && x.3), "{a:?}");
            assert_eq!(letters, 2);
        }
        Err(_) => assert_eq!(letters, 0),
    }
    check_counts(&pool).await;
}

// The rebaseline.

async fn fresh_schema(pool: &PgPool) -> PgConnection {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    migrate::schema::apply(&mut conn).await.unwrap();
    conn
}

async fn checksum(conn: &mut PgConnection, version: i64) -> Vec<u8> {
    sqlx::query_scalar("SELECT checksum FROM core._sqlx_migrations WHERE version = $1")
        .bind(version)
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn set_checksum(conn: &mut PgConnection, version: i64, hex: &str) {
    sqlx::query("UPDATE core._sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = $2")
        .bind(hex)
        .bind(version)
        .execute(conn)
        .await
        .unwrap();
}

/// Another checksum of 0028 (not the superseded one) is still refused, and left as it was.
#[sqlx::test(migrations = false)]
async fn another_checksum_of_the_superseded_migration_is_still_refused(pool: PgPool) {
    let mut conn = fresh_schema(&pool).await;
    let old = &migrate::schema::SUPERSEDED[0];
    let mut other = old.checksum.to_string();
    other.replace_range(0..2, if &other[0..2] == "00" { "01" } else { "00" });
    set_checksum(&mut conn, old.version, &other).await;
    let refused = migrate::schema::apply(&mut conn).await;
    assert!(
        matches!(&refused, Err(e) if matches!(e.error,
            sqlx::migrate::MigrateError::VersionMismatch(v) if v == old.version)),
        "{refused:?}"
    );
    assert_eq!(
        hex(&checksum(&mut conn, old.version).await),
        other,
        "left as it was"
    );
}

/// The superseded checksum recorded under another version is refused, not rewritten.
#[sqlx::test(migrations = false)]
async fn the_superseded_checksum_under_another_version_is_refused(pool: PgPool) {
    let mut conn = fresh_schema(&pool).await;
    let old = &migrate::schema::SUPERSEDED[0];
    let version = old.by;
    set_checksum(&mut conn, version, old.checksum).await;
    let refused = migrate::schema::apply(&mut conn).await;
    assert!(
        matches!(&refused, Err(e) if matches!(e.error,
            sqlx::migrate::MigrateError::VersionMismatch(v) if v == version)),
        "{refused:?}"
    );
    assert_eq!(hex(&checksum(&mut conn, version).await), old.checksum);
}

/// The superseded checksum is rewritten once, every other version untouched, and a rerun is a
/// no-op.
#[sqlx::test(migrations = false)]
async fn the_rebaseline_touches_only_its_version_and_is_idempotent(pool: PgPool) {
    let mut conn = fresh_schema(&pool).await;
    let old = &migrate::schema::SUPERSEDED[0];
    let before: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM core._sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    set_checksum(&mut conn, old.version, old.checksum).await;
    let report = migrate::schema::apply(&mut conn).await.unwrap();
    assert_eq!(report.rebaselined.len(), 1, "{report:?}");
    assert!(report.applied.is_empty(), "{report:?}");
    let after: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM core._sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(before, after);
    let again = migrate::schema::apply(&mut conn).await.unwrap();
    assert!(again.rebaselined.is_empty(), "{again:?}");
    assert!(again.applied.is_empty(), "{again:?}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A plain insert of a letter already reviewed (discarded) that claims another failure's open
/// group: it is resolved at birth in a group of its own, and the open group's counts are
/// untouched. (A reviewed letter of the open group's own failure joins it, counted as not
/// pending: the trigger's design since 0009.)
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_reviewed_letter_inserted_with_an_open_groups_id_does_not_count_in_it(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let a = call(&mut conn, &[letter("o-1", E_A)], true, "1s")
        .await
        .unwrap();
    let open = group_of(&pool, a[0].2.unwrap()).await;
    let stray: Uuid = sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
             attempts, error_kind, last_error, created_at, group_id, status, discard_reason,
             reviewed_by, reviewed_at)
         VALUES (gen_random_uuid(), $1, $2, 'o-2', '{}', '{}', 1, 'exhausted', $3, now(), $4,
                 'discarded', 'attack', 'tester', now())
         RETURNING id",
    )
    .bind(CONSUMER)
    .bind(QUEUE)
    .bind(E_B)
    .bind(open)
    .fetch_one(&pool)
    .await
    .unwrap();
    let own = group_of(&pool, stray).await;
    assert_ne!(own, open);
    let resolved: bool = sqlx::query_scalar(
        "SELECT resolved_at IS NOT NULL FROM core.dead_letter_groups WHERE id = $1",
    )
    .bind(own)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(resolved, "resolved at birth");
    let (letters, pending): (i64, i64) = sqlx::query_as(
        "SELECT letter_count, pending_count FROM core.dead_letter_groups_counted WHERE id = $1",
    )
    .bind(open)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((letters, pending), (1, 1));
    check_counts(&pool).await;
}

/// One statement that both calls record_letters and inserts letters of its own (one per
/// letter of the call) claiming another failure's group: the call is done (its setting
/// cleared) before the outer insert's rows reach the trigger, so they join their own
/// failure's group.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_insert_fed_by_a_call_in_the_same_statement_joins_its_own_groups(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let seed = call(&mut conn, &[letter("s-seed", E_A)], true, "1s")
        .await
        .unwrap();
    let group_a = group_of(&pool, seed[0].2.unwrap()).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH c AS (
           SELECT r.letter_id FROM core.record_letters('{CONSUMER}', now(), '1s', NULL, true,
               ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY[NULL::uuid, NULL],
               ARRAY['{QUEUE}', '{QUEUE}'], ARRAY['s-1', 's-2'],
               ARRAY['{{}}'::jsonb, '{{}}'], ARRAY['{{}}', '{{}}'], ARRAY[1, 1],
               ARRAY['exhausted', 'exhausted'], ARRAY[$1, $1], ARRAY[$1, $1],
               ARRAY[NULL::text, NULL], ARRAY[NULL::uuid, NULL], ARRAY[NULL::bytea, NULL],
               ARRAY[NULL::text, NULL], ARRAY[NULL::text, NULL]) r)
         INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
             attempts, error_kind, last_error, created_at, group_id)
         SELECT gen_random_uuid(), '{CONSUMER}', '{QUEUE}', 'copy-' || c.letter_id, '{{}}', '{{}}',
                1, 'exhausted', $2, now(), $3
           FROM c"
    )))
    .bind(E_A)
    .bind(E_B)
    .bind(group_a)
    .execute(&mut *conn)
    .await
    .unwrap();
    let copies: Vec<(String, i64)> = sqlx::query_as(
        "SELECT message_id, group_id FROM core.dead_letters WHERE message_id LIKE 'copy-%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(copies.len(), 2, "one copy per letter of the call");
    let b = open_group_of_error(&pool, E_B).await;
    assert!(b.is_some());
    for (m, g) in &copies {
        assert_eq!(Some(*g), b, "{m} in E_B's group");
    }
    check_counts(&pool).await;
}

/// Calls and plain inserts with stray group ids at once, in many transactions, over shared
/// messages and failures: every count exact, one open group per failure, one letter per
/// message.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn concurrent_calls_and_stray_plain_inserts_keep_counts_exact(pool: PgPool) {
    let mut seed = pool.acquire().await.unwrap();
    let s = call(&mut seed, &[letter("x-seed", E_A)], true, "1s")
        .await
        .unwrap();
    let group_a = group_of(&pool, s[0].2.unwrap()).await;
    drop(seed);
    let others = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let others = others.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..5u32 {
                let mut tx = others.begin().await.unwrap();
                let shared = format!("x-shared-{round}");
                let mine = format!("x-{t}-{round}");
                let (e1, e2) = if t % 2 == 0 { (E_A, E_B) } else { (E_B, E_A) };
                call(
                    &mut tx,
                    &[letter(&shared, e1), letter(&mine, e2)],
                    true,
                    "5s",
                )
                .await
                .unwrap();
                let stray = if t % 3 == 0 { 987_654_321 } else { group_a };
                plain_insert(&mut tx, &format!("x-plain-{t}-{round}"), E_B, Some(stray))
                    .await
                    .unwrap();
                plain_insert(&mut tx, &shared, E_B, Some(group_a))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    check_counts(&pool).await;
    let (letters, messages): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT message_id) FROM core.dead_letters")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(letters, messages);
    assert_eq!(letters, 1 + 5 + 8 * 5 * 2);
    let in_a_wrongly: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE group_id = $1 AND last_error <> $2",
    )
    .bind(group_a)
    .bind(E_A)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(in_a_wrongly, 0);
}
