//! Attacks on 0040 (a commit closes its jobs' pending letters by a probe per job, one UPDATE per
//! letter): which letters a commit closes, a review racing the commit, copies of one job racing,
//! two commits whose letters share failure groups, the group tallies after each, and a commit
//! beside a storm planned on an empty table. Real PostgreSQL, real concurrency.

use e2e::groups::{counts_match_letters, one_open_group_per_failure};
use sqlx::{PgPool, Postgres, Transaction};
use std::time::{Duration, Instant};
use uuid::Uuid;

const CONSUMER: &str = "close-attacks";
const OTHER_CONSUMER: &str = "close-attacks-other";
const QUEUE: &str = "close-jobs";
const TENANT: &str = "00000000-0000-0000-0000-000000000001";

fn digest(n: u8) -> Vec<u8> {
    vec![n; 32]
}

/// Writes a pending letter `id` of `job` (a poison letter when `job` is None) for `consumer`,
/// failing with `error`, of a body whose digest is `digest`.
async fn letter(
    pool: &PgPool,
    job: Option<Uuid>,
    consumer: &str,
    error: &str,
    digest: Option<Vec<u8>>,
) -> Uuid {
    letter_with_id(pool, Uuid::new_v4(), job, consumer, error, digest).await
}

async fn letter_with_id(
    pool: &PgPool,
    id: Uuid,
    job: Option<Uuid>,
    consumer: &str,
    error: &str,
    digest: Option<Vec<u8>>,
) -> Uuid {
    sqlx::query(
        "INSERT INTO core.dead_letters (id, job_id, consumer, queue, message_id, body, attempts,
                                        error_kind, last_error, created_at, job_digest)
         VALUES ($1, $2, $3, $4, $1::text, '{}', 5,
                 CASE WHEN $2::uuid IS NULL THEN 'poison' ELSE 'exhausted' END, $5, now(), $6)",
    )
    .bind(id)
    .bind(job)
    .bind(consumer)
    .bind(QUEUE)
    .bind(error)
    .bind(digest)
    .execute(pool)
    .await
    .expect("writing a letter");
    id
}

/// An operator's discard, as a statement of its own.
async fn operator_discard(pool: &PgPool, id: Uuid) {
    sqlx::query(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'operator',
             reviewed_by = 'tester', reviewed_at = now()
          WHERE id = $1 AND status = 'pending_review'",
    )
    .bind(id)
    .execute(pool)
    .await
    .expect("discarding");
}

/// An operator's edited replay of `id` (an edge of its job's family: `from` -> `to`).
async fn edited_replay(pool: &PgPool, id: Uuid, to: Vec<u8>) {
    sqlx::query(
        "UPDATE core.dead_letters SET status = 'replayed', replay_reason = 'fixed the amount',
             replay_body = '{\"edited\":true}', replay_digest = $2,
             reviewed_by = 'tester', reviewed_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(to)
    .execute(pool)
    .await
    .expect("replaying an edit");
}

async fn state(pool: &PgPool, id: Uuid) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, reviewed_by FROM core.dead_letters WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reading a letter")
}

fn pending() -> (String, Option<String>) {
    ("pending_review".into(), None)
}

fn closed_by(who: &str) -> (String, Option<String>) {
    ("discarded".into(), Some(who.into()))
}

/// Opens the fences of `jobs` (digests beside them) in `tx`, as a commit group claims them.
async fn open_fences(tx: &mut sqlx::PgConnection, jobs: &[Uuid], digests: &[Option<Vec<u8>>]) {
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at, payload_digest)
         SELECT j, $3, $4::uuid, now(), now() + interval '7 days', d
           FROM unnest($1::uuid[], $2::bytea[]) AS x (j, d)",
    )
    .bind(jobs)
    .bind(digests)
    .bind(CONSUMER)
    .bind(TENANT)
    .execute(&mut *tx)
    .await
    .expect("opening fences");
}

async fn finish_group(
    tx: &mut Transaction<'static, Postgres>,
    jobs: &[Uuid],
    digests: &[Option<Vec<u8>>],
) -> sqlx::Result<i32> {
    sqlx::query_scalar("SELECT core.finish_jobs_of($1::uuid[], $2, now(), $3::bytea[])")
        .bind(jobs)
        .bind(CONSUMER)
        .bind(digests)
        .fetch_one(&mut **tx)
        .await
}

async fn close_job(
    tx: &mut Transaction<'static, Postgres>,
    job: Uuid,
    digest: Option<Vec<u8>>,
) -> sqlx::Result<()> {
    sqlx::query("SELECT core.close_job($1, $2, 'm-1', now(), $3)")
        .bind(job)
        .bind(CONSUMER)
        .bind(digest)
        .execute(&mut **tx)
        .await
        .map(|_| ())
}

async fn backend_pid(tx: &mut Transaction<'static, Postgres>) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut **tx)
        .await
        .unwrap()
}

async fn is_waiting(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until backend `pid` waits on a lock.
async fn until_waiting(pool: &PgPool, pid: i32) {
    let start = Instant::now();
    loop {
        if is_waiting(pool, pid).await {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "backend {pid} never waited on a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn code(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// A commit group of ten jobs closes the pending letters of its jobs (same digest, digest
/// unknown on either side, one family of edits), and nothing else: another job under the id,
/// another consumer's letter, letters already reviewed, a poison letter with no job.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_group_closes_exactly_its_jobs_letters(pool: PgPool) {
    let jobs: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
    let mut digests: Vec<Option<Vec<u8>>> = (0..10u8).map(|i| Some(digest(i + 1))).collect();
    digests[7] = None; // a job whose digest the commit does not know
    let e = "partner refused";
    // 0: same digest; 1: letter's digest unknown; 2: another job under the id.
    let same = letter(&pool, Some(jobs[0]), CONSUMER, e, Some(digest(1))).await;
    let unknown = letter(&pool, Some(jobs[1]), CONSUMER, e, None).await;
    let another = letter(&pool, Some(jobs[2]), CONSUMER, e, Some(digest(99))).await;
    // 3: a family: the body 4 was edited into 104 (a replayed letter), a copy of 104 failed.
    let edge = letter(&pool, Some(jobs[3]), CONSUMER, e, Some(digest(104))).await;
    edited_replay(&pool, edge, digest(4)).await;
    let sibling = letter(&pool, Some(jobs[3]), CONSUMER, "timeout", Some(digest(104))).await;
    // 4: three letters, two of the job and one of another job.
    let four_same = letter(&pool, Some(jobs[4]), CONSUMER, e, Some(digest(5))).await;
    let four_null = letter(&pool, Some(jobs[4]), CONSUMER, "timeout", None).await;
    let four_other = letter(&pool, Some(jobs[4]), CONSUMER, e, Some(digest(77))).await;
    // 5: another consumer's letter of the same job id and digest.
    let foreign = letter(&pool, Some(jobs[5]), OTHER_CONSUMER, e, Some(digest(6))).await;
    // 6: a letter an operator already discarded.
    let reviewed = letter(&pool, Some(jobs[6]), CONSUMER, e, Some(digest(7))).await;
    operator_discard(&pool, reviewed).await;
    // 7: the commit's digest unknown, the letter's known.
    let commit_unknown = letter(&pool, Some(jobs[7]), CONSUMER, e, Some(digest(55))).await;
    // A poison letter of no job.
    let poison = letter(&pool, None, CONSUMER, e, None).await;
    let edge_before: serde_json::Value =
        sqlx::query_scalar("SELECT to_jsonb(d) FROM core.dead_letters d WHERE id = $1")
            .bind(edge)
            .fetch_one(&pool)
            .await
            .unwrap();

    // A job repeated in the array: the group is not whole, as before 0040.
    let mut tx = pool.begin().await.unwrap();
    open_fences(&mut tx, &jobs, &digests).await;
    let mut doubled = jobs.clone();
    doubled.push(jobs[0]);
    let mut doubled_digests = digests.clone();
    doubled_digests.push(digests[0].clone());
    let err = finish_group(&mut tx, &doubled, &doubled_digests)
        .await
        .expect_err("a job twice in a group");
    assert_eq!(code(&err).as_deref(), Some("25000"), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(
        state(&pool, same).await,
        pending(),
        "a rolled-back group closes nothing"
    );

    let mut tx = pool.begin().await.unwrap();
    open_fences(&mut tx, &jobs, &digests).await;
    assert_eq!(finish_group(&mut tx, &jobs, &digests).await.unwrap(), 10);
    tx.commit().await.unwrap();

    for (name, id) in [
        ("same digest", same),
        ("letter's digest unknown", unknown),
        ("a sibling in the family of edits", sibling),
        ("the job's second letter", four_same),
        ("the job's third letter", four_null),
        ("commit's digest unknown", commit_unknown),
    ] {
        assert_eq!(state(&pool, id).await, closed_by("harness"), "{name}");
    }
    for (name, id) in [
        ("another job under the id", another),
        (
            "another job under the id, beside the job's letters",
            four_other,
        ),
        ("another consumer's letter", foreign),
        ("a poison letter of no job", poison),
    ] {
        assert_eq!(state(&pool, id).await, pending(), "{name}");
    }
    assert_eq!(state(&pool, reviewed).await, closed_by("tester"));
    let edge_after: serde_json::Value =
        sqlx::query_scalar("SELECT to_jsonb(d) FROM core.dead_letters d WHERE id = $1")
            .bind(edge)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(edge_before, edge_after, "a replayed letter stays as it was");
    counts_match_letters(&pool).await;
    one_open_group_per_failure(&pool).await;

    // A job's commit alone (core.close_job) closes the same way.
    let job = Uuid::new_v4();
    let mine = letter(&pool, Some(job), CONSUMER, e, Some(digest(200))).await;
    let mine_null = letter(&pool, Some(job), CONSUMER, "timeout", None).await;
    let not_mine = letter(&pool, Some(job), CONSUMER, e, Some(digest(201))).await;
    let foreign = letter(&pool, Some(job), OTHER_CONSUMER, e, Some(digest(200))).await;
    let mut tx = pool.begin().await.unwrap();
    open_fences(&mut tx, &[job], &[Some(digest(200))]).await;
    close_job(&mut tx, job, Some(digest(200))).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state(&pool, mine).await, closed_by("harness"));
    assert_eq!(state(&pool, mine_null).await, closed_by("harness"));
    assert_eq!(state(&pool, not_mine).await, pending());
    assert_eq!(state(&pool, foreign).await, pending());
    counts_match_letters(&pool).await;
}

/// Tallies after a commit that closes no letter, one, and every pending letter of a group
/// (which resolves it).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn tallies_are_exact_after_a_commit_closes_none_one_or_many(pool: PgPool) {
    let e = "partner answered 503";
    for n in [0usize, 1, 7] {
        let jobs: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
        let digests: Vec<Option<Vec<u8>>> = vec![None; 8];
        let error = format!("{e} ({n} letters)");
        let letters: Vec<Uuid> = {
            let mut v = Vec::new();
            for job in &jobs[..n] {
                v.push(letter(&pool, Some(*job), CONSUMER, &error, None).await);
            }
            v
        };
        let mut tx = pool.begin().await.unwrap();
        open_fences(&mut tx, &jobs, &digests).await;
        finish_group(&mut tx, &jobs, &digests).await.unwrap();
        tx.commit().await.unwrap();
        for id in &letters {
            assert_eq!(state(&pool, *id).await, closed_by("harness"));
        }
        counts_match_letters(&pool).await;
        if n > 0 {
            let open: bool = sqlx::query_scalar(
                "SELECT g.resolved_at IS NULL FROM core.dead_letter_groups g
                   JOIN core.dead_letters d ON d.group_id = g.id WHERE d.id = $1",
            )
            .bind(letters[0])
            .fetch_one(&pool)
            .await
            .unwrap();
            assert!(!open, "a group whose every letter was closed is resolved");
        }
    }
    one_open_group_per_failure(&pool).await;
}

#[derive(Clone, Copy, Debug)]
enum Review {
    DiscardCommitted,
    ReplayCommitted,
    RolledBack,
    HeldPastTheLockTimeout,
}

/// An operator reviews a letter in an open transaction (locking it, as
/// `shared::dead_letter::review` does) while the job's commit runs its finisher: the letter ends
/// in exactly one of the two states, the commit fails only by its 2 s lock timeout, and the
/// tallies stay exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_review_racing_a_commit_leaves_one_state_and_exact_tallies(pool: PgPool) {
    for (round, review) in [
        Review::DiscardCommitted,
        Review::ReplayCommitted,
        Review::RolledBack,
        Review::HeldPastTheLockTimeout,
    ]
    .into_iter()
    .enumerate()
    {
        for group in [true, false] {
            let job = Uuid::new_v4();
            let d = Some(digest(round as u8));
            let target = letter(&pool, Some(job), CONSUMER, "racing review", d.clone()).await;
            let beside = letter(&pool, Some(job), CONSUMER, "racing review", None).await;
            // The review locks the letter and marks it, its transaction open.
            let mut review_tx = pool.begin().await.unwrap();
            sqlx::query("SELECT 1 FROM core.dead_letters WHERE id = $1 FOR UPDATE")
                .bind(target)
                .execute(&mut *review_tx)
                .await
                .unwrap();
            let mark = match review {
                Review::ReplayCommitted => {
                    "UPDATE core.dead_letters SET status = 'replayed', reviewed_by = 'tester',
                         reviewed_at = now() WHERE id = $1"
                }
                _ => {
                    "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'operator',
                         reviewed_by = 'tester', reviewed_at = now() WHERE id = $1"
                }
            };
            sqlx::query(mark)
                .bind(target)
                .execute(&mut *review_tx)
                .await
                .unwrap();
            // The commit.
            let mut tx = pool.begin().await.unwrap();
            let pid = backend_pid(&mut tx).await;
            open_fences(&mut tx, &[job], std::slice::from_ref(&d)).await;
            let dd = d.clone();
            let commit = tokio::spawn(async move {
                let finished = if group {
                    finish_group(&mut tx, &[job], &[dd]).await.map(|_| ())
                } else {
                    close_job(&mut tx, job, dd).await
                };
                match finished {
                    Ok(()) => tx.commit().await,
                    Err(e) => {
                        let _ = tx.rollback().await;
                        Err(e)
                    }
                }
            });
            until_waiting(&pool, pid).await;
            match review {
                Review::HeldPastTheLockTimeout => {
                    let outcome = commit.await.unwrap();
                    let err = outcome.expect_err("a commit past its lock timeout");
                    assert_eq!(code(&err).as_deref(), Some("55P03"), "{review:?}: {err}");
                    review_tx.commit().await.unwrap();
                    assert_eq!(state(&pool, target).await, closed_by("tester"));
                    assert_eq!(
                        state(&pool, beside).await,
                        pending(),
                        "its commit rolled back"
                    );
                }
                Review::RolledBack => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    review_tx.rollback().await.unwrap();
                    commit
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{review:?} group={group}: {e}"));
                    assert_eq!(state(&pool, target).await, closed_by("harness"));
                    assert_eq!(state(&pool, beside).await, closed_by("harness"));
                }
                Review::DiscardCommitted | Review::ReplayCommitted => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    review_tx.commit().await.unwrap();
                    commit
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{review:?} group={group}: {e}"));
                    let expected = match review {
                        Review::ReplayCommitted => {
                            ("replayed".to_owned(), Some("tester".to_owned()))
                        }
                        _ => closed_by("tester"),
                    };
                    assert_eq!(
                        state(&pool, target).await,
                        expected,
                        "{review:?} group={group}"
                    );
                    assert_eq!(state(&pool, beside).await, closed_by("harness"));
                }
            }
            counts_match_letters(&pool).await;
        }
    }
    one_open_group_per_failure(&pool).await;
}

/// Two copies of one job commit at once: one fence commits, the other copy finds it (a
/// duplicate), and the job's letter is closed once, by the copy that committed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn two_copies_of_a_job_racing_close_its_letter_once(pool: PgPool) {
    for round in 0..5u8 {
        let job = Uuid::new_v4();
        let d = digest(round + 1);
        let l = letter(&pool, Some(job), CONSUMER, "copies", Some(d.clone())).await;
        let mut handles = Vec::new();
        for _ in 0..2 {
            let pool = pool.clone();
            let d = d.clone();
            handles.push(tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let verdict: String = sqlx::query_scalar(
                    "SELECT core.claim_job_fence($1, $2, $3::uuid, now(), now() + interval '7 days', '5s', $4)",
                )
                .bind(job)
                .bind(CONSUMER)
                .bind(TENANT)
                .bind(&d)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                if verdict == "claimed" {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    finish_group(&mut tx, &[job], &[Some(d)]).await.unwrap();
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                verdict
            }));
        }
        let mut verdicts = Vec::new();
        for h in handles {
            verdicts.push(h.await.unwrap());
        }
        verdicts.sort();
        assert_eq!(verdicts, ["claimed", "duplicate"]);
        assert_eq!(state(&pool, l).await, closed_by("harness"));
        counts_match_letters(&pool).await;
    }
}

/// Two commit groups of different jobs, whose letters share two failure groups in crossed
/// order (job A's first letter, by id, in the later group; job B's in the earlier), finish at
/// once while a review holds one of A's letters and then lets it go. Before 0040 each finisher
/// left its groups in one statement, in group order; both commits must still commit.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn commits_whose_letters_share_groups_in_crossed_order_both_commit(pool: PgPool) {
    crossed_commits(&pool).await;
}

/// The control: the same race with 0021's `core.finish_jobs_of` (one UPDATE, its groups left
/// in group order by its one statement) restored in this test's database: both commit.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn control_the_same_race_under_0021s_finisher_commits_both(pool: PgPool) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(finish_jobs_of_0021()))
        .execute(&pool)
        .await
        .unwrap();
    crossed_commits(&pool).await;
}

/// `core.finish_jobs_of` as migrations/20261204000021_core_job_families.sql wrote it.
fn finish_jobs_of_0021() -> String {
    let text = include_str!("../../migrations/20261204000021_core_job_families.sql");
    let start = text
        .find("CREATE OR REPLACE FUNCTION core.finish_jobs_of(")
        .expect("0021 defines the finisher");
    let end = start + text[start..].find("\n$$;").expect("its body ends") + "\n$$;".len();
    text[start..end].to_owned()
}

async fn crossed_commits(pool: &PgPool) {
    let pool = pool.clone();
    // Two failure groups, kept open by a letter of another job each.
    let alpha = letter(&pool, Some(Uuid::new_v4()), CONSUMER, "alpha refused", None).await;
    let beta = letter(&pool, Some(Uuid::new_v4()), CONSUMER, "beta refused", None).await;
    let group_of = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT group_id FROM core.dead_letters WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let (ga, gb) = (group_of(alpha).await, group_of(beta).await);
    let (low, high) = if ga < gb {
        ("alpha refused", "beta refused")
    } else {
        ("beta refused", "alpha refused")
    };
    let (job_a, job_b) = (Uuid::new_v4(), Uuid::new_v4());
    let id = |n: u128| Uuid::from_u128(n);
    let a1 = letter_with_id(&pool, id(1), Some(job_a), CONSUMER, high, None).await;
    let a2 = letter_with_id(&pool, id(2), Some(job_a), CONSUMER, low, None).await;
    let b1 = letter_with_id(&pool, id(3), Some(job_b), CONSUMER, low, None).await;
    let b2 = letter_with_id(&pool, id(4), Some(job_b), CONSUMER, high, None).await;

    // A review locks a2 (and will roll back).
    let mut review = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM core.dead_letters WHERE id = $1 FOR UPDATE")
        .bind(a2)
        .execute(&mut *review)
        .await
        .unwrap();
    let start = |job: Uuid| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let pid = backend_pid(&mut tx).await;
            open_fences(&mut tx, &[job], &[None]).await;
            let handle = tokio::spawn(async move {
                let finished = finish_group(&mut tx, &[job], &[None]).await;
                match finished {
                    Ok(_) => tx.commit().await,
                    Err(e) => {
                        let _ = tx.rollback().await;
                        Err(e)
                    }
                }
            });
            (pid, handle)
        }
    };
    let (pid_a, commit_a) = start(job_a).await;
    until_waiting(&pool, pid_a).await; // a1 closed, waiting on a2
    let (pid_b, commit_b) = start(job_b).await;
    // b1 closed, waiting on a1's group (0040); or done already (0021: its one statement left
    // both groups before A's statement reached its trigger).
    let start_b = Instant::now();
    while !commit_b.is_finished() && !is_waiting(&pool, pid_b).await {
        assert!(
            start_b.elapsed() < Duration::from_secs(10),
            "B neither waited nor finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    review.rollback().await.unwrap();
    let (ra, rb) = (commit_a.await.unwrap(), commit_b.await.unwrap());
    assert!(
        ra.is_ok() && rb.is_ok(),
        "both commits commit: A {:?}, B {:?}",
        ra.as_ref().err().map(|e| (code(e), e.to_string())),
        rb.as_ref().err().map(|e| (code(e), e.to_string())),
    );
    for l in [a1, a2, b1, b2] {
        assert_eq!(state(&pool, l).await, closed_by("harness"));
    }
    counts_match_letters(&pool).await;
}

/// Commit groups over overlapping jobs with letters, in opposite orders, at once: whatever
/// fails, fails on its fences (never half-closed letters), and the tallies stay exact.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn commit_groups_over_overlapping_jobs_in_opposite_orders(pool: PgPool) {
    for round in 0..4 {
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        let mut letters = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let error = if i % 2 == 0 {
                "even refused"
            } else {
                "odd refused"
            };
            letters.push(letter(&pool, Some(*job), CONSUMER, error, None).await);
            letters.push(letter(&pool, Some(*job), CONSUMER, "timeout", None).await);
        }
        let forward = jobs.clone();
        let mut backward = jobs.clone();
        backward.reverse();
        let mut handles = Vec::new();
        for order in [forward, backward] {
            let pool = pool.clone();
            handles.push(tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let mut claimed = Vec::new();
                for job in &order {
                    let verdict: String = sqlx::query_scalar(
                        "SELECT core.claim_job_fence($1, $2, $3::uuid, now(), now() + interval '7 days', '2s', NULL)",
                    )
                    .bind(job)
                    .bind(CONSUMER)
                    .bind(TENANT)
                    .fetch_one(&mut *tx)
                    .await?;
                    if verdict == "claimed" {
                        claimed.push(*job);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let digests: Vec<Option<Vec<u8>>> = vec![None; claimed.len()];
                if !claimed.is_empty() {
                    finish_group(&mut tx, &claimed, &digests).await?;
                }
                tx.commit().await?;
                Ok::<Vec<Uuid>, sqlx::Error>(claimed)
            }));
        }
        let mut committed = Vec::new();
        for h in handles {
            match h.await.unwrap() {
                Ok(jobs) => committed.extend(jobs),
                Err(e) => {
                    let c = code(&e);
                    assert!(
                        matches!(c.as_deref(), Some("40P01") | Some("55P03")),
                        "round {round}: a group failed otherwise than waiting on fences: {e}"
                    );
                }
            }
        }
        for (i, l) in letters.iter().enumerate() {
            let expected = if committed.contains(&jobs[i / 2]) {
                closed_by("harness")
            } else {
                pending()
            };
            assert_eq!(state(&pool, *l).await, expected, "round {round} letter {i}");
        }
        counts_match_letters(&pool).await;
    }
}

/// Reads of `core.dead_letters` by a commit group (plans made on an empty table, generic) of
/// `jobs`, committed; the number of letters it read.
async fn committed_group_reads(conn: &mut sqlx::PgConnection, jobs: &[Uuid], commit: bool) -> i64 {
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    open_fences(&mut tx, jobs, &vec![None; jobs.len()]).await;
    sqlx::query(
        "SELECT core.finish_jobs_of($1, $2, now(), array_fill(NULL::bytea, ARRAY[cardinality($1)]))",
    )
    .bind(jobs)
    .bind(CONSUMER)
    .execute(&mut *tx)
    .await
    .unwrap();
    let read = e2e::groups::letters_read(&mut tx).await;
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    read
}

/// 5,000 pending letters of the consumer, a commit group (planned generically on an empty
/// table) that closes 3 of them reads only its own jobs' letters, and closes exactly those 3.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_closing_three_of_five_thousand_letters_reads_only_its_own(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let batch = |n: usize| (0..n).map(|_| Uuid::new_v4()).collect::<Vec<_>>();
    for _ in 0..6 {
        assert_eq!(committed_group_reads(&mut conn, &batch(10), false).await, 0);
    }
    let jobs = batch(10);
    sqlx::query(
        "INSERT INTO core.dead_letters (id, job_id, consumer, queue, message_id, body, attempts,
                                        error_kind, last_error, created_at)
         SELECT gen_random_uuid(), CASE WHEN i <= 3 THEN ($3::uuid[])[i] ELSE gen_random_uuid() END,
                $1, $2, 'storm-' || i, '{}', 5, 'exhausted', 'partner answered 503 after 31 s', now()
           FROM generate_series(1, 5000) AS i",
    )
    .bind(CONSUMER)
    .bind(QUEUE)
    .bind(&jobs)
    .execute(&pool)
    .await
    .unwrap();
    let read = committed_group_reads(&mut conn, &jobs, true).await;
    assert!(
        read <= 12,
        "a group closing 3 letters read {read} of the storm's"
    );
    let closed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE consumer = $1 AND status = 'discarded'",
    )
    .bind(CONSUMER)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(closed, 3);
    let mine: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE job_id = ANY ($1) AND status = 'discarded'
            AND reviewed_by = 'harness'",
    )
    .bind(&jobs)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(mine, 3);
    counts_match_letters(&pool).await;
}
