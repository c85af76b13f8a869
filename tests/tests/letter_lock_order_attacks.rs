//! Attacks on the order in which concurrent paths lock letters (rows of `core.dead_letters`),
//! from outside, after the fix of `record_replays_sent` (two senders of one bulk replay recorded
//! the same replays in crossed orders and deadlocked). Each test sets two or more ordinary
//! actions that lock several letters (or letters and operation, fence or group rows) against
//! each other, on connections of their own, in rounds, and fails if any of them dies of a
//! deadlock (40P01): a failing test names a hole.
//!
//! The paths: a bulk operation's chunk (`discard_chunk`, `lock_chunk` + `mark_replayed`: its
//! letters locked newest first), a commit group's and a single job's commit closing their jobs'
//! pending letters (`shared::fence::close_jobs` / `close_job`: `core.close_letters`, one UPDATE
//! by `id = ANY(…)`), the senders' records (`record_replays_sent`, `record_replay_sent`), and
//! withdrawals (`withdraw_replay`).
//!
//! Letters are written one at a time through the store as failures arrive (`record_letter`), so
//! the table holds them oldest first, as production does, beside a background of other letters
//! and statistics (`ANALYZE`), as any table that has run a while has.

use chrono::{DateTime, Utc};
use e2e::event_source::sqs_client;
use e2e::groups::{counts_match_letters, one_open_group_per_failure};
use e2e::operations_kit::{Apis, queue, scalar, seed, tools};
use rand::RngExt;
use rand::seq::{IndexedRandom, SliceRandom};
use serde_json::json;
use shared::dead_letter::{
    Chunk, ErrorKind, ListFilter, discard_chunk, lock_chunk, mark_replayed, record_replay_sent,
    record_replays_sent, withdraw_replay,
};
use shared::envelope::JobDigest;
use shared::fence::{
    CheckFailed, CloseError, FenceClaim, close_job, close_jobs, open_job, open_jobs,
};
use shared::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use shared::operations;
use shared_testkit::{TestLetter, record_letter};
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres, Transaction};
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use uuid::Uuid;

const CONSUMER: &str = "award-points";
const TENANT: &str = "00000000-0000-0000-0000-000000000001";
/// Three failures, so a round's letters span three failure groups (the review trigger takes each
/// group's lock).
const ERRORS: [&str; 3] = [
    "ledger timed out",
    "partner answered 503",
    "connection reset by peer",
];
const FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3_600);
/// The harness's wait for a fence (its `lock_timeout` setting's default order of magnitude).
const FENCE_WAIT: Duration = Duration::from_secs(2);
const REASON: &str = "partner back after INC-42";
const ACTOR: &str = "oncall@example.com";

fn consumer() -> ConsumerName {
    ConsumerName::new(CONSUMER).unwrap()
}

fn tenant() -> TenantId {
    TenantId(TENANT.parse().unwrap())
}

/// A pool with room for every party of a round (the test's own pool has five connections).
async fn wide_pool(pool: &PgPool, connections: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// Other letters, as a table that has run a while holds, and its statistics.
async fn background(pool: &PgPool) {
    seed(
        pool,
        "background-q",
        2_000,
        "exhausted",
        true,
        "ledger timed out",
    )
    .await;
    sqlx::query("ANALYZE core.dead_letters")
        .execute(pool)
        .await
        .unwrap();
}

/// A letter as written: its id, its job, and the job's digest as the letter keeps it.
#[derive(Debug, Clone, Copy)]
struct Arrived {
    id: Uuid,
    job: JobId,
    digest: Option<JobDigest>,
}

/// Letters of `jobs` (in that order) on `queue`, written one at a time through the store as the
/// consumer writes them, each newer than the one before.
async fn arrive(pool: &PgPool, queue: &str, jobs: &[JobId]) -> Vec<Arrived> {
    let mut out = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let body = json!({"job_id": job, "tenant_id": TENANT,
            "payload": {"account_id": "a", "points": i + 1}})
        .to_string();
        let letter = TestLetter {
            kind: ErrorKind::Exhausted,
            last_error: ERRORS[i % ERRORS.len()].to_owned(),
            tenant_id: Some(tenant()),
            ..TestLetter::new(Some(*job), &consumer(), queue, &body)
        };
        let id = record_letter(pool, &letter, Utc::now()).await.0;
        let digest: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT job_digest FROM core.dead_letters WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
        out.push(Arrived {
            id,
            job: *job,
            digest: digest.map(|d| JobDigest(d.try_into().expect("a digest of 32 bytes"))),
        });
    }
    out
}

/// A database error as a finding names it: its message and SQLSTATE, and where PostgreSQL
/// says it happened (the statement inside a function), whitespace collapsed.
fn describe(e: &sqlx::Error) -> String {
    let Some(db) = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
    else {
        return e.to_string();
    };
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = format!("{} [{}]", db.message(), db.code());
    if let Some(detail) = db.detail() {
        out.push_str(&format!("; detail: {}", squeeze(detail)));
    }
    if let Some(place) = db.r#where() {
        let place: String = squeeze(place).chars().take(260).collect();
        out.push_str(&format!("; where: {place}"));
    }
    out
}

/// [`describe`] for the error of a commit's check and `COMMIT`.
fn describe_close(e: &CloseError) -> String {
    match e {
        CloseError::Check(
            CheckFailed::NotOwn(e) | CheckFailed::LetterLocked(e) | CheckFailed::Aborted(e),
        )
        | CloseError::Commit(e) => describe(e),
    }
}

fn new_jobs(n: usize) -> Vec<JobId> {
    (0..n).map(|_| JobId(Uuid::new_v4())).collect()
}

/// Ends whatever transaction a failed commit left open on `conn` (a check that refused leaves
/// it open; `ROLLBACK` outside one only warns).
async fn roll_back(conn: &mut sqlx::PgConnection) {
    let _ = sqlx::raw_sql("ROLLBACK").execute(conn).await;
}

/// A commit group whose fences its transaction claimed (`open_jobs`, as the harness opens one),
/// its work done: what is left is the harness's check and `COMMIT` (`close_jobs`).
struct Group {
    conn: PoolConnection<Postgres>,
    jobs: Vec<(JobId, Option<JobDigest>)>,
}

async fn claim_group(pool: &PgPool, letters: &[Arrived]) -> Group {
    let mut conn = pool.acquire().await.unwrap();
    let fences: Vec<_> = letters
        .iter()
        .map(|l| (l.job, tenant(), l.digest))
        .collect();
    let claimed = open_jobs(
        &mut conn,
        &consumer(),
        &fences,
        Utc::now(),
        FENCE_TTL,
        FENCE_WAIT,
    )
    .await
    .expect("claiming the group's fences");
    assert_eq!(claimed.len(), letters.len(), "the group claims every fence");
    Group {
        conn,
        jobs: letters.iter().map(|l| (l.job, l.digest)).collect(),
    }
}

/// The group's check and `COMMIT` (`core.finish_jobs_of`, closing its jobs' pending letters).
async fn commit_group(mut group: Group) -> Result<(), String> {
    let closed = close_jobs(&mut group.conn, &consumer(), &group.jobs, Utc::now()).await;
    match closed {
        Ok(()) => Ok(()),
        Err(e) => {
            roll_back(&mut group.conn).await;
            Err(format!("commit group: {}", describe_close(&e)))
        }
    }
}

/// One job's transaction whose fence it claimed (`open_job`, per-job mode), its work done.
struct OneJob {
    conn: PoolConnection<Postgres>,
    job: JobId,
    digest: Option<JobDigest>,
}

async fn claim_job(pool: &PgPool, job: JobId, digest: Option<JobDigest>) -> OneJob {
    let mut conn = pool.acquire().await.unwrap();
    let claim = open_job(
        &mut conn,
        job,
        &consumer(),
        tenant(),
        digest.as_ref(),
        Utc::now(),
        FENCE_TTL,
        FENCE_WAIT,
    )
    .await
    .expect("claiming the job's fence");
    assert_eq!(claim, FenceClaim::Claimed);
    OneJob { conn, job, digest }
}

/// The job's check and `COMMIT` (`core.finish_job_of`, closing the job's pending letters).
async fn commit_job(mut one: OneJob) -> Result<(), String> {
    let closed = close_job(
        &mut one.conn,
        one.job,
        &consumer(),
        "m-the-copy-that-ran",
        one.digest.as_ref(),
        Utc::now(),
    )
    .await;
    match closed {
        Ok(()) => Ok(()),
        Err(e) => {
            roll_back(&mut one.conn).await;
            Err(format!("one job's commit: {}", describe_close(&e)))
        }
    }
}

/// A chunk's transaction up to its letters, as the operations worker opens it (`work_chunk`):
/// its lock wait, and the operation's row held to the commit. Returns the operation's `through`.
async fn begin_chunk(
    pool: &PgPool,
    op: Uuid,
) -> sqlx::Result<(Transaction<'static, Postgres>, DateTime<Utc>)> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT set_config('lock_timeout', '5s', true)")
        .execute(&mut *tx)
        .await?;
    let through: DateTime<Utc> = sqlx::query_scalar(
        "SELECT through FROM core.dead_letter_operations
         WHERE id = $1 AND status = 'running' FOR UPDATE",
    )
    .bind(op)
    .fetch_one(&mut *tx)
    .await?;
    Ok((tx, through))
}

/// The discard chunk's statement and the commit, in the transaction `begin_chunk` opened.
async fn discard_in(
    mut tx: Transaction<'static, Postgres>,
    op: Uuid,
    filter: &ListFilter,
    through: DateTime<Utc>,
) -> Result<i64, String> {
    let chunk = Chunk {
        filter,
        through,
        after: None,
        limit: 1_000,
    };
    let run = async {
        let done = discard_chunk(&mut tx, chunk, REASON, ACTOR, op, Utc::now()).await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(done.reviewed)
    };
    run.await
        .map_err(|e| format!("discard chunk: {}", describe(&e)))
}

/// The replay chunk's statements (`lock_chunk`, then `mark_replayed`: queued, or already
/// processed where the job's fence exists) and the commit, as the worker's `replay_chunk` runs
/// them for replayable letters.
async fn replay_in(
    mut tx: Transaction<'static, Postgres>,
    op: Uuid,
    filter: &ListFilter,
    through: DateTime<Utc>,
) -> Result<u64, String> {
    let chunk = Chunk {
        filter,
        through,
        after: None,
        limit: 200,
    };
    let run = async {
        let letters = lock_chunk(&mut tx, chunk).await?;
        let ids: Vec<Uuid> = letters.iter().map(|l| l.letter.id.0).collect();
        let outcomes: Vec<&str> = letters
            .iter()
            .map(|l| match l.fence_exists {
                true => "already_processed",
                false => "queued",
            })
            .collect();
        let marked = if ids.is_empty() {
            0
        } else {
            mark_replayed(&mut tx, &ids, &outcomes, REASON, ACTOR, op, Utc::now()).await?
        };
        tx.commit().await?;
        Ok::<_, sqlx::Error>(marked)
    };
    run.await
        .map_err(|e| format!("replay chunk: {}", describe(&e)))
}

fn queue_filter(queue: &str) -> ListFilter {
    ListFilter {
        queue: Some(queue.to_owned()),
        ..ListFilter::default()
    }
}

/// Letters of `ids` still pending.
async fn still_pending(pool: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM core.dead_letters WHERE id = ANY($1) AND status = 'pending_review'",
    )
    .bind(ids)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Fails on any error of a race's actions (an operation's recorded `last_error` included),
/// naming the deadlocks (40P01, or an operation's 'deadlock detected') first and counting the
/// lock waits that ran out behind them (55P03).
fn assert_all_committed(race: &str, errors: &[String]) {
    let deadlock = |e: &&String| e.contains("40P01") || e.contains("deadlock detected");
    let deadlocks: Vec<&String> = errors.iter().filter(deadlock).collect();
    let timeouts = errors.iter().filter(|e| e.contains("55P03")).count();
    let rest: Vec<&String> = errors.iter().filter(|e| !deadlock(e)).take(3).collect();
    assert!(
        errors.is_empty(),
        "{race}: {} actions died of a deadlock (40P01), {timeouts} waited past their lock \
         timeout (55P03), {} failed in all.\nthe deadlocks: {deadlocks:#?}\nthe first others: \
         {rest:#?}",
        deadlocks.len(),
        errors.len()
    );
}

/// Waits until `n` backends of this database wait on a lock.
async fn until_waiting(pool: &PgPool, n: i64) {
    let start = Instant::now();
    loop {
        let waiting = scalar(
            pool,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await;
        if waiting >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{n} backends never waited on a lock ({waiting} did)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The plan of the statement `core.close_letters` runs, for `letters`.
async fn close_letters_plan(pool: &PgPool, letters: &[Uuid]) -> String {
    let ids: Vec<String> = letters.iter().map(Uuid::to_string).collect();
    let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN UPDATE core.dead_letters
            SET status = 'discarded', discard_reason = 'x', reviewed_by = 'harness',
                reviewed_at = now()
          WHERE id = ANY ('{{{}}}'::uuid[]) AND status = 'pending_review'",
        ids.join(",")
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n")
}

// ---------------------------------------------------------------------------------------------
// A commit closing its jobs' letters against a bulk chunk over the same letters.

/// The smallest case, made certain: two letters of one queue, `a` written before `b`, a commit
/// group of their two jobs, and a discard operation's chunk over the queue. A one-letter review
/// holds `b` (the lock `lock_letter` takes) while the chunk arrives (it locks newest first: `b`,
/// and waits) and then the group's commit (it closes its letters with one UPDATE by id, which
/// locks them in the table's order, oldest first: `a`, then waits for `b`). The review then ends
/// without a verdict (a refused replay, an edit's dry run: its transaction rolls back). Both
/// the chunk and the commit must go through, one of them closing each letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_group_and_a_discard_chunk_over_two_letters_both_commit(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 8).await;
    let letters = arrive(&pool, "two-letters-q", &new_jobs(2)).await;
    let (a, b) = (letters[0], letters[1]);
    println!(
        "the commit's UPDATE (core.close_letters) plan:\n{}",
        close_letters_plan(&pool, &[a.id, b.id]).await
    );
    let op = apis
        .start("discard", json!({"queue": "two-letters-q"}))
        .await;
    // The review's lock on `b`: `lock_letter`'s statement, in a transaction the test ends.
    let mut review = wide.begin().await.unwrap();
    sqlx::query("SELECT id FROM core.dead_letters WHERE id = $1 FOR UPDATE")
        .bind(b.id)
        .fetch_one(&mut *review)
        .await
        .unwrap();
    let filter = queue_filter("two-letters-q");
    let (tx, through) = begin_chunk(&wide, op).await.unwrap();
    let group = claim_group(&wide, &letters).await;
    let chunk = discard_in(tx, op, &filter, through);
    let commit = commit_group(group);
    let ended = async {
        until_waiting(&pool, 1).await; // the chunk, on `b`
        tokio::time::sleep(Duration::from_millis(100)).await;
        until_waiting(&pool, 2).await; // the commit, on `b` (it holds `a`)
        tokio::time::sleep(Duration::from_millis(100)).await;
        review.rollback().await.unwrap();
    };
    // The chunk's statement is sent first, then the commit's: the lock waits order them.
    let (chunk, commit, ()) = tokio::join!(
        chunk,
        async {
            until_waiting(&pool, 1).await;
            commit.await
        },
        ended
    );
    println!("chunk: {chunk:?}\ncommit: {commit:?}");
    let errors: Vec<String> = [chunk.err(), commit.err()].into_iter().flatten().collect();
    assert_all_committed(
        "a commit group and a discard chunk over two letters",
        &errors,
    );
    assert_eq!(still_pending(&pool, &[a.id, b.id]).await, 0);
    counts_match_letters(&pool).await;
}

/// A discard chunk of operation `op` over queue `q`, begun (its operation's row held), and
/// `commits`, all let go at once, each commit after 0 to 2 ms: the errors of any of them. If
/// none failed, no letter of `ids` is left pending.
async fn race_a_discard_chunk(
    pool: &PgPool,
    wide: &PgPool,
    op: Uuid,
    q: &str,
    ids: &[Uuid],
    commits: Vec<impl Future<Output = Result<(), String>>>,
    rng: &mut impl rand::Rng,
) -> Vec<String> {
    let delays: Vec<u64> = (0..commits.len()).map(|_| rng.random_range(0..3)).collect();
    let filter = queue_filter(q);
    let (tx, through) = begin_chunk(wide, op).await.unwrap();
    let barrier = Barrier::new(commits.len() + 1);
    let barrier = &barrier;
    let chunk = async {
        barrier.wait().await;
        discard_in(tx, op, &filter, through).await.map(drop)
    };
    let commits = futures_util::future::join_all(commits.into_iter().zip(delays).map(
        |(commit, delay)| async move {
            barrier.wait().await;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            commit.await
        },
    ));
    let (chunk, commits) = tokio::join!(chunk, commits);
    let errors: Vec<String> = std::iter::once(chunk)
        .chain(commits)
        .filter_map(Result::err)
        .collect();
    if errors.is_empty() {
        assert_eq!(still_pending(pool, ids).await, 0);
    }
    errors
}

/// Commit groups (ten jobs each, as one SQS batch) and a discard operation's chunk over the same
/// letters, all let go at once: each group's jobs' letters are shuffled across the queue's
/// newest-first order, so the chunk (newest first) and each commit (one UPDATE by id: the
/// table's order, oldest first) cross. Five rounds of 160 letters and 16 groups.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn commit_groups_racing_a_discard_chunk_over_their_letters_never_deadlock(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 24).await;
    let mut rng = rand::rng();
    let mut errors = Vec::new();
    for round in 0..5 {
        let q = format!("groups-vs-discard-{round}");
        let mut letters = arrive(&pool, &q, &new_jobs(160)).await;
        let ids: Vec<Uuid> = letters.iter().map(|l| l.id).collect();
        let op = apis.start("discard", json!({"queue": q})).await;
        letters.shuffle(&mut rng);
        let mut groups = Vec::new();
        for members in letters.chunks(10) {
            groups.push(claim_group(&wide, members).await);
        }
        let commits = groups.into_iter().map(commit_group).collect();
        let race = race_a_discard_chunk(&pool, &wide, op, &q, &ids, commits, &mut rng).await;
        errors.extend(race.into_iter().map(|e| format!("round {round}: {e}")));
    }
    counts_match_letters(&pool).await;
    one_open_group_per_failure(&pool).await;
    assert_all_committed("commit groups against a discard chunk", &errors);
}

/// One job's commit (per-job mode: `close_job`) closing the two letters its job has (two copies
/// of the job each ran out of attempts: two messages, one job id), against a discard chunk over
/// the queue. The first copies' letters are all written before the second copies', so each job's
/// two letters lie far apart in the chunk's newest-first order. 24 jobs at once, five rounds.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn single_job_commits_closing_two_letters_racing_a_discard_chunk_never_deadlock(
    pool: PgPool,
) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 28).await;
    let mut rng = rand::rng();
    let mut errors = Vec::new();
    for round in 0..5 {
        let q = format!("two-copies-{round}");
        let jobs = new_jobs(24);
        let first = arrive(&pool, &q, &jobs).await;
        let second = arrive(&pool, &q, &jobs).await;
        let ids: Vec<Uuid> = first.iter().chain(&second).map(|l| l.id).collect();
        let op = apis.start("discard", json!({"queue": q})).await;
        let mut claimed = Vec::new();
        for l in &first {
            claimed.push(claim_job(&wide, l.job, l.digest).await);
        }
        claimed.shuffle(&mut rng);
        let commits = claimed.into_iter().map(commit_job).collect();
        let race = race_a_discard_chunk(&pool, &wide, op, &q, &ids, commits, &mut rng).await;
        errors.extend(race.into_iter().map(|e| format!("round {round}: {e}")));
    }
    counts_match_letters(&pool).await;
    assert_all_committed("one-job commits against a discard chunk", &errors);
}

/// The real worker (`shared::operations::work`, in process) works a replay operation over a
/// queue (a chunk of 200: `lock_chunk`, newest first) while the consumer commits batches of
/// those letters' jobs (commit groups of ten, let go a few milliseconds apart). Five rounds. The
/// operation must record no failure (`last_error`) and no commit may fail.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_operation_worked_beside_commit_groups_records_no_deadlock(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let tools = tools(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 24).await;
    let mut rng = rand::rng();
    let mut errors = Vec::new();
    for round in 0..5 {
        let q = queue(&sqs).await;
        let mut letters = arrive(&pool, &q.name, &new_jobs(200)).await;
        let ids: Vec<Uuid> = letters.iter().map(|l| l.id).collect();
        let op = apis.start("replay", json!({"queue": q.name})).await;
        letters.shuffle(&mut rng);
        let mut groups = Vec::new();
        for members in letters.chunks(10) {
            groups.push(claim_group(&wide, members).await);
        }
        let delays: Vec<u64> = (0..groups.len()).map(|_| rng.random_range(0..12)).collect();
        let commits = futures_util::future::join_all(groups.into_iter().zip(delays).map(
            |(group, delay)| async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                commit_group(group).await
            },
        ));
        let worker = async {
            let mut failures = Vec::new();
            for _ in 0..20 {
                let until = tokio::time::Instant::now() + Duration::from_secs(6);
                let worked = operations::work(&tools, until, 1).await.unwrap();
                if worked.failed > 0 {
                    let last: Option<String> = sqlx::query_scalar(
                        "SELECT last_error FROM core.dead_letter_operations WHERE id = $1",
                    )
                    .bind(op)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    failures.push(format!("replay operation: {last:?}"));
                    // Due again now, not after its backoff: the round goes on.
                    sqlx::query(
                        "UPDATE core.dead_letter_operations SET next_attempt_at = now() WHERE id = $1",
                    )
                    .bind(op)
                    .execute(&pool)
                    .await
                    .unwrap();
                }
                let running = scalar(
                    &pool,
                    &format!(
                        "SELECT count(*) FROM core.dead_letter_operations
                         WHERE id = '{op}' AND status = 'running'"
                    ),
                )
                .await;
                if running == 0 {
                    break;
                }
            }
            failures
        };
        let (commits, failures) = tokio::join!(commits, worker);
        let round_errors: Vec<String> = commits
            .into_iter()
            .filter_map(Result::err)
            .chain(failures)
            .map(|e| format!("round {round}: {e}"))
            .collect();
        assert_eq!(still_pending(&pool, &ids).await, 0, "round {round}");
        errors.extend(round_errors);
    }
    counts_match_letters(&pool).await;
    assert_all_committed(
        "commit groups against the replay operation's worker",
        &errors,
    );
}

// ---------------------------------------------------------------------------------------------
// Chunks against chunks, and the senders' records against chunks and withdrawals.

/// A discard operation selecting by queue and a replay operation selecting by consumer (another
/// index, another plan) over the same letters, their chunks let go at once, with one-letter
/// reviews' statements (one letter each) in between. Six rounds.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_discard_and_a_replay_chunk_over_overlapping_selections_never_deadlock(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 16).await;
    let mut rng = rand::rng();
    let mut errors = Vec::new();
    for round in 0..6 {
        let q = format!("two-ops-{round}");
        let letters = arrive(&pool, &q, &new_jobs(150)).await;
        let ids: Vec<Uuid> = letters.iter().map(|l| l.id).collect();
        let by_queue = queue_filter(&q);
        let by_consumer = ListFilter {
            consumer: Some(CONSUMER.to_owned()),
            created_from: Some(Utc::now() - chrono::Duration::seconds(30)),
            ..ListFilter::default()
        };
        let discard = apis.start("discard", json!({"queue": q})).await;
        let replay = apis
            .start("replay", serde_json::to_value(&by_consumer).unwrap())
            .await;
        let (discard_tx, discard_through) = begin_chunk(&wide, discard).await.unwrap();
        let (replay_tx, replay_through) = begin_chunk(&wide, replay).await.unwrap();
        let mut people: Vec<Uuid> = ids.clone();
        people.shuffle(&mut rng);
        people.truncate(8);
        let barrier = Barrier::new(2 + people.len());
        let barrier = &barrier;
        let wide = &wide;
        let reviews = futures_util::future::join_all(people.into_iter().map(|id| async move {
            barrier.wait().await;
            sqlx::query(
                "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'by hand',
                     reviewed_by = 'person@example.com', reviewed_at = now()
                  WHERE id = $1 AND status = 'pending_review'",
            )
            .bind(id)
            .execute(wide)
            .await
            .map(drop)
            .map_err(|e| format!("one-letter review: {}", describe(&e)))
        }));
        let (d, r, reviews) = tokio::join!(
            async {
                barrier.wait().await;
                discard_in(discard_tx, discard, &by_queue, discard_through)
                    .await
                    .map(drop)
            },
            async {
                barrier.wait().await;
                replay_in(replay_tx, replay, &by_consumer, replay_through)
                    .await
                    .map(drop)
            },
            reviews
        );
        let round_errors: Vec<String> = [d, r]
            .into_iter()
            .chain(reviews)
            .filter_map(Result::err)
            .map(|e| format!("round {round}: {e}"))
            .collect();
        if round_errors.is_empty() {
            assert_eq!(still_pending(&pool, &ids).await, 0, "round {round}");
        }
        errors.extend(round_errors);
        // Neither operation is worked further: end them, so the next round's replay
        // selection is the next round's letters only.
        for id in [discard, replay] {
            apis.cancel(id).await;
        }
    }
    counts_match_letters(&pool).await;
    one_open_group_per_failure(&pool).await;
    assert_all_committed("a discard and a replay chunk", &errors);
}

/// Replays queued by an operation, recorded at once by: bulk senders (`record_replays_sent` in
/// shuffled orders, each with the operation's `sent` count in the same statement, as the
/// worker records a call), the scheduled run's one-letter sender (`record_replay_sent`),
/// withdrawals (`withdraw_replay`: the letter, a placeholder fence, a new pending letter), and
/// the same operation's next chunk (its row held, then its pending letters locked and marked).
/// Six rounds of 60 queued replays.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn senders_withdrawals_and_the_next_chunk_over_queued_replays_never_deadlock(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    background(&pool).await;
    let wide = wide_pool(&pool, 24).await;
    let mut rng = rand::rng();
    let mut errors = Vec::new();
    for round in 0..6 {
        let q = format!("sends-{round}");
        // 60 replays to record, then 60 letters left pending for the operation's next chunk.
        let queued: Vec<Uuid> = arrive(&pool, &q, &new_jobs(60))
            .await
            .iter()
            .map(|l| l.id)
            .collect();
        let pending: Vec<Uuid> = arrive(&pool, &q, &new_jobs(60))
            .await
            .iter()
            .map(|l| l.id)
            .collect();
        let op = apis.start("replay", json!({"queue": q})).await;
        let mut conn = pool.acquire().await.unwrap();
        let marked = mark_replayed(
            &mut conn,
            &queued,
            &vec!["queued"; queued.len()],
            REASON,
            ACTOR,
            op,
            Utc::now(),
        )
        .await
        .unwrap();
        assert_eq!(marked, 60);
        drop(conn);
        let filter = queue_filter(&q);
        let (chunk_tx, through) = begin_chunk(&wide, op).await.unwrap();
        let mut bulk = Vec::new();
        for sender in 0..4 {
            let mut order = queued.clone();
            order.shuffle(&mut rng);
            order.truncate(40);
            let messages: Vec<String> = order.iter().map(|id| format!("m-{sender}-{id}")).collect();
            bulk.push((order, messages));
        }
        let singles: Vec<Uuid> = queued.sample(&mut rng, 10).copied().collect();
        let withdrawn: Vec<Uuid> = queued.sample(&mut rng, 6).copied().collect();
        let barrier = Barrier::new(1 + bulk.len() + singles.len() + withdrawn.len());
        let (barrier, wide) = (&barrier, &wide);
        let bulk =
            futures_util::future::join_all(bulk.into_iter().map(|(order, messages)| async move {
                barrier.wait().await;
                record_replays_sent(wide, &order, &messages, Utc::now(), op)
                    .await
                    .map(drop)
                    .map_err(|e| format!("bulk sender: {}", describe(&e)))
            }));
        let singles = futures_util::future::join_all(singles.into_iter().map(|id| async move {
            barrier.wait().await;
            record_replay_sent(wide, DeadLetterId(id), &format!("m-one-{id}"), Utc::now())
                .await
                .map(drop)
                .map_err(|e| format!("one-letter sender: {}", describe(&e)))
        }));
        let withdrawals =
            futures_util::future::join_all(withdrawn.into_iter().map(|id| async move {
                barrier.wait().await;
                withdraw_replay(wide, DeadLetterId(id), ACTOR, "queue deleted", Utc::now())
                    .await
                    .map(drop)
                    .map_err(|e| format!("withdrawal: {}", describe(&e)))
            }));
        let chunk = async {
            barrier.wait().await;
            replay_in(chunk_tx, op, &filter, through).await.map(drop)
        };
        let (bulk, singles, withdrawals, chunk) = tokio::join!(bulk, singles, withdrawals, chunk);
        let round_errors: Vec<String> = bulk
            .into_iter()
            .chain(singles)
            .chain(withdrawals)
            .chain([chunk])
            .filter_map(Result::err)
            .map(|e| format!("round {round}: {e}"))
            .collect();
        if round_errors.is_empty() {
            assert_eq!(still_pending(&pool, &pending).await, 0, "round {round}");
        }
        errors.extend(round_errors);
        apis.cancel(op).await;
    }
    counts_match_letters(&pool).await;
    one_open_group_per_failure(&pool).await;
    assert_all_committed("senders, withdrawals and the next chunk", &errors);
}
