//! Attacks on the fix of ffab1a8 (`shared::db::begin` and `shared::db::acquire`), from outside:
//! every public call of `shared` that takes a pool is cut off (its future dropped, as a timeout
//! or an aborted task drops it) at each answer of the server in turn, and after each cut the
//! promise is read back: no connection of the pool is left inside a transaction (none `idle in
//! transaction` in `pg_stat_activity`, and the pool's next write is seen from another
//! connection), and nothing half-done was committed (each call's own exactly-once rule).
//!
//! How a cut is made deterministic: the pool reaches PostgreSQL through a proxy (a [`Gate`])
//! that lets the server's first `n` messages through and holds every later one; the call runs
//! until it waits for a held message, and is dropped there. `n` counts up from 0 until a call
//! finishes without being held: so each test cuts its call at every message the server sends
//! it (every `recv` of sqlx), a `BEGIN`'s and a `COMMIT`'s answers included (the migrate
//! function's test, whose run is long, counts whole answers only). One test cuts by poll count
//! instead (the model's way), with the gate open. A failing test names a hole.
//!
//! Holes found: `record_all_unless_processed` of letters digested over different fields (a
//! batch straddling a change of a consumer's `JOB_FIELDS`) writes them in one statement per set
//! of fields, each committed alone, on a held connection but outside any transaction: cut
//! between its statements, or failing in a later one, it leaves the earlier sets' letters
//! written, where its contract says "any failure writes none of them"
//! (`letters_recorded_together_*`, both red on the tree they attacked). Fixed: such a call's
//! statements share one transaction (`write_letters`).

use chrono::Utc;
use e2e::intake_kit::{copy_inside_its_transaction, harness_waiting};
use e2e::operations_kit::{queue, seed};
use serde_json::json;
use shared::clock::{ManualClock, SystemClock};
use shared::config::DatabaseConfig;
use shared::db::Database;
use shared::dead_letter::{
    ErrorKind, ListFilter, NewDeadLetter, ReviewStatus, Verdict, lock_letter, receive_letters,
    record_all_unless_processed, settle_behind,
};
use shared::envelope::JobDigest;
use shared::fence::FenceError;
use shared::harness::{CommitMode, HarnessSettings, IncomingMessage};
use shared::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use shared::operations::{self, Action, OperationTools, Request, Status};
use shared::replay::Replayer;
use shared::upkeep::sweep::{SweepSettings, sweep};
use shared_testkit::{TestLetter, envelope, message_on, record_letter};
use sqlx::PgPool;
use sqlx::postgres::{PgPoolOptions, PgSslMode};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;
use uuid::Uuid;

/// The `application_name` of every connection through the gate: the backends a check reads.
const APP: &str = "cut-off-attack";
/// The longest any one step may take before a test calls it hung.
const HUNG: Duration = Duration::from_secs(5);
/// A call still unfinished after this many of the server's messages is a test gone wrong.
const MOST_ANSWERS: i64 = 600;
const ACTOR: &str = "oncall@example.com";
const REASON: &str = "partner back after INC-42";
const TENANT: &str = "00000000-0000-0000-0000-000000000001";

// ---------------------------------------------------------------------------------------------
// The gate: a proxy that holds the server's answers after a budget of messages.

/// The budget of a gate let open.
const OPEN: i64 = i64::MAX;

/// A TCP proxy to PostgreSQL that passes what the client sends as it comes, and the server's
/// messages (each whole: type byte, length, body) only while its budget lasts: armed with `n`,
/// it lets `n` messages through (over all its connections) and holds every later one, on every
/// connection, until it is opened again.
struct Gate {
    port: u16,
    budget: Arc<AtomicI64>,
    /// Whether the budget counts only `ReadyForQuery` messages (whole answers) instead of
    /// every message.
    answers_only: Arc<AtomicBool>,
    holding: Arc<AtomicBool>,
}

impl Gate {
    async fn start(server: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let budget = Arc::new(AtomicI64::new(OPEN));
        let answers_only = Arc::new(AtomicBool::new(false));
        let holding = Arc::new(AtomicBool::new(false));
        let (b, a, h) = (budget.clone(), answers_only.clone(), holding.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = tokio::net::TcpStream::connect(&server).await else {
                    continue;
                };
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                let (mut client_read, client_write) = client.into_split();
                let (server_read, mut server_write) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                });
                let gate = (b.clone(), a.clone(), h.clone());
                tokio::spawn(answers(server_read, client_write, gate));
            }
        });
        Self {
            port,
            budget,
            answers_only,
            holding,
        }
    }

    /// From now on, `n` more of the server's messages pass, and then none.
    fn arm(&self, n: i64) {
        self.holding.store(false, Ordering::SeqCst);
        self.budget.store(n, Ordering::SeqCst);
    }

    /// From now on the budget counts whole answers (`ReadyForQuery` messages): a cut falls
    /// only where the client waits for an answer's first message.
    fn count_answers_only(&self) {
        self.answers_only.store(true, Ordering::SeqCst);
    }

    /// Everything held goes on, and everything after it.
    fn open(&self) {
        self.budget.store(OPEN, Ordering::SeqCst);
    }

    /// Returns once a message of the server is held.
    async fn held(&self) {
        while !self.holding.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Whether the budget lets one more message through (and spends it, if it counts).
fn pass(budget: &AtomicI64, counts: bool) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| match b {
            OPEN => Some(OPEN),
            0 => None,
            b if counts => Some(b - 1),
            b => Some(b),
        })
        .is_ok()
}

/// A gate's state, as each connection's pump shares it: its budget, whether it counts only
/// `ReadyForQuery` messages, whether a message is held.
type GateState = (Arc<AtomicI64>, Arc<AtomicBool>, Arc<AtomicBool>);

/// The server's side of one connection: its messages forwarded whole while the budget lasts.
/// (The client asks for no TLS, so the server's first byte starts a message.)
async fn answers(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, gate: GateState) {
    let (budget, answers_only, holding) = gate;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    'read: loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        // `passed`: the bytes of whole messages let through, not yet written.
        let mut passed = 0;
        loop {
            let rest = &pending[passed..];
            if rest.len() < 5 {
                break;
            }
            let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
            if rest.len() < 1 + len {
                break;
            }
            let counts = rest[0] == b'Z' || !answers_only.load(Ordering::SeqCst);
            while !pass(&budget, counts) {
                if passed > 0 {
                    if to.write_all(&pending[..passed]).await.is_err() {
                        break 'read;
                    }
                    pending.drain(..passed);
                    passed = 0;
                }
                holding.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            passed += 1 + len;
        }
        if passed > 0 {
            if to.write_all(&pending[..passed]).await.is_err() {
                break;
            }
            pending.drain(..passed);
        }
    }
    let _ = to.shutdown().await;
}

/// Runs `call` with `gate` armed for `n` of the server's messages: its output if it finished,
/// `None` if it waited for a held message and was cut off there (dropped before the gate opens).
async fn cut<F: Future>(gate: &Gate, n: i64, call: F) -> Option<F::Output> {
    gate.arm(n);
    let mut call = Box::pin(call);
    let ran = tokio::select! {
        biased;
        out = &mut call => Some(out),
        () = gate.held() => None,
        () = tokio::time::sleep(HUNG) => {
            panic!("a call through the gate (armed for {n} messages) neither finished nor \
                    waited for a held message within {HUNG:?}")
        }
    };
    drop(call);
    gate.open();
    ran
}

// ---------------------------------------------------------------------------------------------
// The bench: the test's own pool (to set up and observe) and a pool through the gate.

struct Bench {
    /// The test's pool: setup and observation, never through the gate.
    direct: PgPool,
    gate: Gate,
    /// The pool the calls run on, through the gate, as a function's (no test before acquire).
    pool: PgPool,
    /// Its URL, for a [`Database`] of its own.
    url: String,
}

impl Bench {
    async fn new(direct: &PgPool, connections: u32) -> Self {
        sqlx::query("CREATE TABLE IF NOT EXISTS public.cut_probe (what text NOT NULL)")
            .execute(direct)
            .await
            .unwrap();
        let options = (*direct.connect_options()).clone();
        let gate = Gate::start(format!("{}:{}", options.get_host(), options.get_port())).await;
        let url = format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=disable&application_name={APP}",
            options.get_username(),
            gate.port,
            options.get_database().expect("the test's database"),
        );
        let gated = options
            .host("127.0.0.1")
            .port(gate.port)
            .ssl_mode(PgSslMode::Disable)
            .application_name(APP);
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(HUNG)
            .test_before_acquire(false)
            .connect_with(gated)
            .await
            .unwrap();
        Self {
            direct: direct.clone(),
            gate,
            pool,
            url,
        }
    }

    /// The gated pool with a connection open and idle, nothing of it in flight: the same start
    /// for every cut.
    async fn ready(&self) {
        sqlx::query("SELECT 1").execute(&self.pool).await.unwrap();
        quiet(&self.pool).await;
    }

    /// [`no_transaction_left_on`] the bench's pool.
    async fn no_transaction_left(&self, what: &str) {
        no_transaction_left_on(&self.direct, &self.pool, what).await;
    }

    async fn close(self) {
        self.pool.close().await;
    }
}

/// Waits until every connection of `pool` is idle in it (none held, returning or closing).
async fn quiet(pool: &PgPool) {
    let deadline = Instant::now() + HUNG;
    while pool.num_idle() < pool.size() as usize {
        assert!(
            Instant::now() < deadline,
            "the pool's connections never came back ({} of {} idle)",
            pool.num_idle(),
            pool.size()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// After a cut: `pool`'s next write is seen from outside (from `direct`), and no backend
/// through the gate is left inside a transaction (`idle in transaction`, aborted or not).
async fn no_transaction_left_on(direct: &PgPool, pool: &PgPool, what: &str) {
    let pid: i32 = tokio::time::timeout(
        HUNG,
        sqlx::query_scalar("INSERT INTO cut_probe (what) VALUES ($1) RETURNING pg_backend_pid()")
            .bind(what)
            .fetch_one(pool),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the pool's next write waited {HUNG:?}"))
    .unwrap_or_else(|e| panic!("{what}: the pool's next write failed: {e}"));
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM cut_probe WHERE what = $1")
        .bind(what)
        .fetch_one(direct)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stuck: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT pid, state, left(query, 160) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND application_name = $1 AND state LIKE 'idle in transaction%'",
        )
        .bind(APP)
        .fetch_all(direct)
        .await
        .unwrap();
        if seen == 1 && stuck.is_empty() {
            return;
        }
        if seen != 1 || Instant::now() >= deadline {
            panic!(
                "{what}: the pool's next write (backend {pid}) was seen {seen} times from \
                 outside; backends of the pool inside a transaction (pid, state, last \
                 statement): {stuck:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// No backend through the gate holds an advisory lock (a cut connection's backend, still
/// ending, is given two seconds to end).
async fn no_advisory_lock_left(direct: &PgPool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let held: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT a.pid, a.state, left(a.query, 160)
               FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()
                AND a.application_name = $1",
        )
        .bind(APP)
        .fetch_all(direct)
        .await
        .unwrap();
        if held.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: backends of the pool hold an advisory lock (pid, state, last statement): \
             {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn consumer() -> ConsumerName {
    e2e::consumer_name()
}

fn tenant() -> TenantId {
    TenantId(TENANT.parse().unwrap())
}

/// Every group's counts against its letters, and one open group per failure.
async fn groups_exact(pool: &PgPool) {
    e2e::groups::counts_match_letters(pool).await;
    e2e::groups::one_open_group_per_failure(pool).await;
}

// ---------------------------------------------------------------------------------------------
// One letter's review (`lock_letter`, `LockedLetter::mark`, `LockedLetter::commit`).

/// A pending letter of a new job on `queue`.
async fn pending_letter(pool: &PgPool, queue: &str) -> DeadLetterId {
    let job = JobId(Uuid::new_v4());
    let body = json!({"job_id": job, "tenant_id": TENANT,
        "payload": {"account_id": "a", "points": 5}})
    .to_string();
    let letter = TestLetter {
        tenant_id: Some(tenant()),
        last_error: "ledger timed out".into(),
        ..TestLetter::new(Some(job), &consumer(), queue, &body)
    };
    record_letter(pool, &letter, Utc::now()).await
}

fn discard() -> Verdict {
    Verdict::Discarded {
        reason: REASON.into(),
    }
}

/// An operator's discard of letter `id`, as the API runs one: locked, marked unless reviewed
/// already, committed. Whether it reviewed the letter.
async fn review(pool: &PgPool, id: DeadLetterId) -> sqlx::Result<bool> {
    let mut locked = lock_letter(pool, id, Duration::from_secs(1))
        .await?
        .expect("the letter exists");
    if locked.status() != ReviewStatus::PendingReview {
        return Ok(false);
    }
    locked.mark(&discard(), ACTOR, Utc::now()).await?;
    locked.commit().await?;
    Ok(true)
}

/// Letter `id`'s status and reviewer.
async fn reviewed(pool: &PgPool, id: DeadLetterId) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, reviewed_by FROM core.dead_letters WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A review cut at every answer of the server (its `BEGIN`'s, its lock's, its mark's, its
/// `COMMIT`'s): the pool is left with no transaction, the letter is either untouched or
/// discarded by the operator (never half-marked), the next review finds its row free (its lock
/// wait is one second: a lock left behind fails it) and reviews it only if it is still pending.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_review_cut_at_any_answer_leaves_no_transaction_and_reviews_its_letter_once(
    direct: PgPool,
) {
    let bench = Bench::new(&direct, 1).await;
    for n in 0.. {
        let id = pending_letter(&direct, "review-q").await;
        bench.ready().await;
        let finished = cut(&bench.gate, n, review(&bench.pool, id)).await;
        let what = format!("a review cut after {n} messages");
        bench.no_transaction_left(&what).await;
        let (status, by) = reviewed(&direct, id).await;
        assert!(
            matches!(
                (status.as_str(), by.as_deref()),
                ("pending_review", None) | ("discarded", Some(ACTOR))
            ),
            "{what}: the letter reads {status} by {by:?}"
        );
        let again = review(&bench.pool, id)
            .await
            .unwrap_or_else(|e| panic!("{what}: the next review failed: {e}"));
        assert_eq!(
            again,
            status == "pending_review",
            "{what}: the next review reviewed again a letter reading {status}"
        );
        assert_eq!(
            reviewed(&direct, id).await,
            ("discarded".to_owned(), Some(ACTOR.to_owned())),
            "{what}"
        );
        if let Some(result) = finished {
            assert!(result.unwrap(), "the uncut review reviewed");
            break;
        }
        assert!(n < MOST_ANSWERS, "the review never finished");
    }
    groups_exact(&direct).await;
    bench.close().await;
}

/// A `LockedLetter` dropped after its mark (an API handler that returns early, or is cut off
/// between its awaits): nothing of the mark commits, and its connection goes back clean.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_locked_letter_dropped_after_its_mark_commits_nothing(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let id = pending_letter(&direct, "review-q").await;
    bench.ready().await;
    let mut locked = lock_letter(&bench.pool, id, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    locked.mark(&discard(), ACTOR, Utc::now()).await.unwrap();
    drop(locked);
    bench
        .no_transaction_left("a locked letter dropped after its mark")
        .await;
    assert_eq!(
        reviewed(&direct, id).await,
        ("pending_review".to_owned(), None)
    );
    assert!(review(&bench.pool, id).await.unwrap());
    groups_exact(&direct).await;
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// Bulk operations: the worker (`operations::work`: the lease driver's claim on a held
// connection, each chunk's transaction begun through `shared::db::begin`, the replays' records).

/// An operation of `action` on the letters of `queue` (three seeded there), started now.
async fn operation_on(pool: &PgPool, queue: &str, action: Action) -> Uuid {
    seed(pool, queue, 3, "exhausted", true, "ledger timed out").await;
    let selection = ListFilter {
        queue: Some(queue.to_owned()),
        ..ListFilter::default()
    };
    let request = Request {
        action,
        selection: &selection,
        reason: REASON,
        actor: ACTOR,
    };
    operations::start(pool, &request, Utc::now())
        .await
        .unwrap()
        .id
}

/// One round of the worker.
async fn work_once(tools: &OperationTools) -> sqlx::Result<operations::Round> {
    operations::work(tools, Instant::now() + Duration::from_secs(30), 10).await
}

/// The operation's progress as its letters read it: (replayed, sent, discarded) on the
/// operation's row and counted on the letters that carry its id.
async fn progress_and_letters(pool: &PgPool, id: Uuid) -> ((i64, i64, i64), (i64, i64, i64)) {
    let op = operations::get(pool, id).await.unwrap().unwrap();
    let p = op.progress;
    let letters = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'replayed'
                                  AND replay_outcome <> 'already_processed'),
                count(*) FILTER (WHERE replay_outcome = 'sent'),
                count(*) FILTER (WHERE status = 'discarded')
           FROM core.dead_letters WHERE operation_id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    ((p.replayed, p.sent, p.discarded), letters)
}

/// A worker killed leaves its claim until its lease ends: ended here at once, as the next
/// round after the lease would find it.
async fn end_leases(pool: &PgPool) {
    sqlx::query(
        "UPDATE core.dead_letter_operations SET claimed_until = NULL, next_attempt_at = now()
          WHERE status = 'running'",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Works every running operation to its end.
async fn work_to_the_end(tools: &OperationTools, what: &str) {
    for _ in 0..20 {
        let round = work_once(tools)
            .await
            .unwrap_or_else(|e| panic!("{what}: a round after the cut failed: {e}"));
        if round.failed > 0 {
            let errors: Vec<Option<String>> =
                sqlx::query_scalar("SELECT last_error FROM core.dead_letter_operations")
                    .fetch_all(&tools.pool)
                    .await
                    .unwrap();
            panic!("{what}: a round after the cut failed: {errors:?}");
        }
        if round.operations == 0 {
            return;
        }
    }
    panic!("{what}: the operation never ended");
}

/// After a cut worker: the pool is clean, the operation's counts are its letters at once
/// (chunks commit whole), and worked to its end every letter is reviewed once and counted once.
async fn operation_ends_exactly(bench: &Bench, tools: &OperationTools, id: Uuid, what: &str) {
    bench.no_transaction_left(what).await;
    let (counted, letters) = progress_and_letters(&bench.direct, id).await;
    assert_eq!(
        counted, letters,
        "{what}: the operation's (replayed, sent, discarded) against its letters"
    );
    end_leases(&bench.direct).await;
    work_to_the_end(tools, what).await;
    let op = operations::get(&bench.direct, id).await.unwrap().unwrap();
    assert_eq!(op.status, Status::Done, "{what}: {op:?}");
    let (counted, letters) = progress_and_letters(&bench.direct, id).await;
    assert_eq!(counted, letters, "{what}: at its end");
    let expected = match op.action {
        Action::Discard => (0, 0, 3),
        Action::Replay => (3, 3, 0),
    };
    assert_eq!(counted, expected, "{what}: every letter worked once");
}

/// A discard operation's worker cut at every answer of the server.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_discard_worker_cut_at_any_answer_leaves_no_transaction_and_counts_each_letter_once(
    direct: PgPool,
) {
    let bench = Bench::new(&direct, 1).await;
    let tools = OperationTools {
        pool: bench.pool.clone(),
        clock: Arc::new(SystemClock),
        replayer: None,
    };
    for n in 0.. {
        let id = operation_on(&direct, &format!("discard-q-{n}"), Action::Discard).await;
        bench.ready().await;
        let finished = cut(&bench.gate, n, work_once(&tools)).await;
        let what = format!("a discard worker cut after {n} messages");
        operation_ends_exactly(&bench, &tools, id, &what).await;
        if let Some(round) = finished {
            assert_eq!(round.unwrap().failed, 0);
            break;
        }
        assert!(n < MOST_ANSWERS, "the worker never finished");
    }
    groups_exact(&direct).await;
    bench.close().await;
}

/// A replay operation's worker (the local SQS API for its sends) cut at every answer of the
/// server: its chunk's verdicts, its sends' records (`record_replays_sent`, counted on the
/// operation in the same statement) and its leftovers' resend.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_worker_cut_at_any_answer_leaves_no_transaction_and_counts_each_send_once(
    direct: PgPool,
) {
    let sqs = e2e::event_source::sqs_client().await;
    let target = queue(&sqs).await;
    let bench = Bench::new(&direct, 1).await;
    let tools = OperationTools {
        pool: bench.pool.clone(),
        clock: Arc::new(SystemClock),
        replayer: Some(Replayer::new(sqs.clone())),
    };
    for n in 0.. {
        // One queue for all: each operation selects the letters pending there (the earlier
        // operations' are reviewed).
        let id = operation_on(&direct, &target.name, Action::Replay).await;
        bench.ready().await;
        let finished = cut(&bench.gate, n, work_once(&tools)).await;
        let what = format!("a replay worker cut after {n} messages");
        operation_ends_exactly(&bench, &tools, id, &what).await;
        if let Some(round) = finished {
            assert_eq!(round.unwrap().failed, 0);
            break;
        }
        assert!(n < MOST_ANSWERS, "the worker never finished");
    }
    groups_exact(&direct).await;
    bench.close().await;
}

/// A discard operation's worker cut by poll count (polled `n` times, then dropped, for `n` up
/// to 50), the model's way, on an open gate.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_worker_cut_after_any_poll_leaves_no_transaction_and_counts_each_letter_once(
    direct: PgPool,
) {
    let bench = Bench::new(&direct, 1).await;
    let tools = OperationTools {
        pool: bench.pool.clone(),
        clock: Arc::new(SystemClock),
        replayer: None,
    };
    for polls in 1..=50 {
        let id = operation_on(&direct, &format!("polled-q-{polls}"), Action::Discard).await;
        bench.ready().await;
        let finished = shared_testkit::cut_after_polls(work_once(&tools), polls).await;
        let what = format!("a discard worker cut after {polls} polls");
        operation_ends_exactly(&bench, &tools, id, &what).await;
        if finished.is_some() {
            break;
        }
    }
    groups_exact(&direct).await;
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// The letters' intake: settle rounds (`settle_behind`: `core.settle_intake` on a held
// connection, and its fallback one by one inside a transaction with savepoints).

/// A poison letter of `job` for the reference consumer.
fn poison(job: JobId) -> TestLetter {
    let body = envelope(
        job,
        tenant(),
        "c",
        json!({"account_id": "a", "points": "x"}),
    );
    TestLetter {
        kind: ErrorKind::Poison,
        attempts: 1,
        tenant_id: Some(tenant()),
        last_error: "points is not a number".into(),
        ..TestLetter::new(Some(job), &consumer(), "jobs", &body)
    }
}

/// Receives letters of `jobs` into the intake; their message ids.
async fn receive(pool: &PgPool, jobs: &[JobId]) -> Vec<String> {
    let letters: Vec<TestLetter> = jobs.iter().map(|j| poison(*j)).collect();
    let new: Vec<(NewDeadLetter<'_>, Option<&JobDigest>)> =
        letters.iter().map(|l| (l.as_new(), None)).collect();
    receive_letters(pool, &new, Utc::now()).await.unwrap();
    letters.iter().map(|l| l.message_id.clone()).collect()
}

/// Each received message is, at any moment, a row in the intake or one letter: never both,
/// never neither, never two letters.
async fn row_or_letter(pool: &PgPool, messages: &[String], what: &str) {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT m, (SELECT count(*) FROM core.letter_intake i WHERE i.message_id = m),
                   (SELECT count(*) FROM core.dead_letters d WHERE d.message_id = m)
           FROM unnest($1::text[]) AS m",
    )
    .bind(messages)
    .fetch_all(pool)
    .await
    .unwrap();
    for (message, received, letters) in rows {
        assert_eq!(
            received + letters,
            1,
            "{what}: message {message} is {received} intake rows and {letters} letters"
        );
    }
}

fn settle<'a>(
    pool: &'a PgPool,
    wait: Duration,
) -> impl Future<Output = Result<shared::dead_letter::Settling, FenceError>> + 'a {
    settle_behind(pool, &CONSUMER, Utc::now(), wait, 4)
}

static CONSUMER: std::sync::LazyLock<ConsumerName> = std::sync::LazyLock::new(consumer);

/// Settle rounds cut at every answer of the server.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_settle_cut_at_any_answer_leaves_no_transaction_and_each_record_one_letter(
    direct: PgPool,
) {
    let bench = Bench::new(&direct, 1).await;
    let mut messages = Vec::new();
    for n in 0.. {
        let jobs = [JobId(Uuid::new_v4()), JobId(Uuid::new_v4())];
        messages.extend(receive(&direct, &jobs).await);
        bench.ready().await;
        let finished = cut(&bench.gate, n, settle(&bench.pool, Duration::from_secs(1))).await;
        let what = format!("a settle cut after {n} messages");
        bench.no_transaction_left(&what).await;
        row_or_letter(&direct, &messages, &what).await;
        settle(&bench.pool, Duration::from_secs(1))
            .await
            .unwrap_or_else(|e| panic!("{what}: the next settle failed: {e}"));
        row_or_letter(&direct, &messages, &what).await;
        if let Some(settled) = finished {
            settled.unwrap();
            break;
        }
        assert!(n < MOST_ANSWERS, "the settle never finished");
    }
    settle(&bench.pool, Duration::from_secs(1)).await.unwrap();
    row_or_letter(&direct, &messages, "settled at the end").await;
    assert_eq!(
        count(&direct, "SELECT count(*) FROM core.letter_intake").await,
        0
    );
    groups_exact(&direct).await;
    bench.close().await;
}

/// Settle rounds whose statement waits out a claim (a copy of one job inside its transaction
/// holds its fence), so each falls back to the rows one by one (a transaction holding the settle
/// lock, a savepoint per row): cut at every answer of the server.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_settle_fallback_cut_at_any_answer_leaves_no_transaction_and_each_record_one_letter(
    direct: PgPool,
) {
    let bench = Bench::new(&direct, 1).await;
    let busy = JobId(Uuid::new_v4());
    let copy = copy_inside_its_transaction(&direct, busy, tenant(), &JobDigest([7; 32])).await;
    let mut messages = receive(&direct, &[busy]).await;
    let wait = Duration::from_millis(10);
    for n in 0.. {
        let jobs = [JobId(Uuid::new_v4()), JobId(Uuid::new_v4())];
        messages.extend(receive(&direct, &jobs).await);
        bench.ready().await;
        let finished = cut(&bench.gate, n, settle(&bench.pool, wait)).await;
        let what = format!("a settle falling back cut after {n} messages");
        bench.no_transaction_left(&what).await;
        row_or_letter(&direct, &messages, &what).await;
        settle(&bench.pool, wait)
            .await
            .unwrap_or_else(|e| panic!("{what}: the next settle failed: {e}"));
        row_or_letter(&direct, &messages, &what).await;
        if let Some(settled) = finished {
            let settled = settled.unwrap();
            assert!(
                settled.settled.len() >= 2,
                "the uncut fallback settled the free rows: {settled:?}"
            );
            break;
        }
        assert!(n < MOST_ANSWERS, "the settle never finished");
    }
    copy.rollback().await.unwrap();
    settle(&bench.pool, Duration::from_secs(1)).await.unwrap();
    row_or_letter(&direct, &messages, "settled at the end").await;
    assert_eq!(
        count(&direct, "SELECT count(*) FROM core.letter_intake").await,
        0
    );
    e2e::promises::both_hold(&direct).await;
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// `record_all_unless_processed`: "Any failure writes none of them".

/// The fields a consumer's digest covered before its `JOB_FIELDS` changed.
const OLD_FIELDS: [&str; 1] = ["account_id"];

/// Two poison letters of new jobs, the second digested over other fields than the first (a
/// batch straddling a change of the consumer's `JOB_FIELDS`).
fn straddling() -> (TestLetter, TestLetter) {
    (poison(JobId(Uuid::new_v4())), poison(JobId(Uuid::new_v4())))
}

async fn letters_of(pool: &PgPool, letters: &[&TestLetter]) -> i64 {
    let ids: Vec<String> = letters.iter().map(|l| l.message_id.clone()).collect();
    sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE message_id = ANY($1)")
        .bind(&ids)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn record_both(
    pool: &PgPool,
    first: &TestLetter,
    second: &TestLetter,
    wait: Duration,
) -> Result<Vec<shared::dead_letter::Settled>, FenceError> {
    let letters = [
        (first.as_new(), None),
        (
            NewDeadLetter {
                digest_fields: &OLD_FIELDS,
                ..second.as_new()
            },
            None,
        ),
    ];
    record_all_unless_processed(pool, &letters, Utc::now(), wait).await
}

/// `record_all_unless_processed` of two letters digested over different fields, cut at every
/// answer of the server: it writes both or neither ("any failure writes none of them"; the
/// caller then writes each alone).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn letters_recorded_together_and_cut_at_any_answer_are_all_written_or_none(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    for n in 0.. {
        let (first, second) = straddling();
        bench.ready().await;
        let wait = Duration::from_secs(1);
        let finished = cut(
            &bench.gate,
            n,
            record_both(&bench.pool, &first, &second, wait),
        )
        .await;
        let what = format!("letters recorded together cut after {n} messages");
        bench.no_transaction_left(&what).await;
        let written = letters_of(&direct, &[&first, &second]).await;
        assert!(
            written == 0 || written == 2,
            "{what}: {written} of its 2 letters were written (the first's statement committed, \
             the second's never ran)"
        );
        if let Some(recorded) = finished {
            recorded.unwrap();
            break;
        }
        assert!(n < MOST_ANSWERS, "the call never finished");
    }
    groups_exact(&direct).await;
    bench.close().await;
}

/// `record_all_unless_processed` of two letters digested over different fields, the second's
/// claim waiting out (a copy of its job inside its transaction): the call fails, and writes
/// none of them.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn letters_recorded_together_whose_call_fails_are_none_written(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let (first, second) = straddling();
    let copy = copy_inside_its_transaction(
        &direct,
        second.job_id.unwrap(),
        tenant(),
        &JobDigest([7; 32]),
    )
    .await;
    let failed = record_both(&bench.pool, &first, &second, Duration::from_millis(50)).await;
    copy.rollback().await.unwrap();
    assert!(
        matches!(failed, Err(FenceError::Contended)),
        "the second letter's claim waits out: {failed:?}"
    );
    let written = letters_of(&direct, &[&first, &second]).await;
    assert_eq!(
        written, 0,
        "a call of record_all_unless_processed that failed wrote {written} of its 2 letters"
    );
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// The sweep (`upkeep::sweep::sweep`: its lease, its batches on a held connection).

/// A sweep of fences (six expired, in batches of two) cut at every answer of the server.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_sweep_cut_at_any_answer_leaves_no_transaction_and_keeps_live_fences(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let now = Utc::now();
    shared_testkit::sweeps::seed_fences(&direct, 2, now + chrono::Duration::days(1)).await;
    let settings = SweepSettings {
        batch_size: 2,
        budget: Duration::from_secs(60),
        pause: Duration::ZERO,
        ledger_ttl: Duration::from_secs(7 * 24 * 3600),
    };
    let clock = ManualClock::new(now);
    let expired = "SELECT count(*) FROM core.processed_jobs WHERE expires_at < now()";
    let live = "SELECT count(*) FROM core.processed_jobs WHERE expires_at >= now()";
    for n in 0.. {
        shared_testkit::sweeps::seed_fences(&direct, 6, now - chrono::Duration::minutes(1)).await;
        bench.ready().await;
        let finished = cut(&bench.gate, n, sweep(&bench.pool, &clock, settings, None)).await;
        let what = format!("a sweep cut after {n} messages");
        bench.no_transaction_left(&what).await;
        assert_eq!(count(&direct, live).await, 2, "{what}: a live fence swept");
        // A sweep cut off keeps its lease until it lapses (a minute): ended here at once.
        sqlx::query("DELETE FROM core.sweep_leases")
            .execute(&direct)
            .await
            .unwrap();
        let report = sweep(&bench.pool, &clock, settings, None)
            .await
            .unwrap_or_else(|e| panic!("{what}: the next sweep failed: {e}"));
        assert_eq!(count(&direct, expired).await, 0, "{what}: {report:?}");
        if let Some(report) = finished {
            report.unwrap();
            break;
        }
        assert!(n < MOST_ANSWERS, "the sweep never finished");
    }
    assert_eq!(count(&direct, live).await, 2);
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// The migrate function (`migrate::migrate`: its held connection, sqlx's migration lock and
// transactions on it).

/// The migrate function cut at every answer of the server (whole answers: where it waits for
/// an answer's first message), with the consumers' migrations to
/// apply (their schemas dropped again before each run): no transaction, and no advisory lock (the
/// migration lock is a session's) left on a connection of its pool; the next run applies what
/// the cut one did not.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_migration_cut_at_any_answer_leaves_no_transaction_and_no_lock(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let secrets = aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::Config::builder()
            .behavior_version(aws_sdk_secretsmanager::config::BehaviorVersion::latest())
            .region(aws_sdk_secretsmanager::config::Region::new("us-east-1"))
            .build(),
    );
    let database = Database::new(&DatabaseConfig::for_url(&bench.url, 1), &secrets).unwrap();
    bench.gate.count_answers_only();
    let budget = Duration::from_secs(30);
    for n in 0.. {
        sqlx::raw_sql(
            "DROP SCHEMA IF EXISTS reference CASCADE; DROP SCHEMA IF EXISTS rewards CASCADE",
        )
        .execute(&direct)
        .await
        .unwrap();
        sqlx::query("SELECT 1")
            .execute(database.pool())
            .await
            .unwrap();
        quiet(database.pool()).await;
        let finished = cut(&bench.gate, n, migrate::migrate(&database, budget)).await;
        let what = format!("a migration cut after {n} messages");
        no_transaction_left_on(&direct, database.pool(), &what).await;
        no_advisory_lock_left(&direct, &what).await;
        let report = migrate::migrate(&database, budget)
            .await
            .unwrap_or_else(|e| panic!("{what}: the next run failed: {e}"));
        assert_eq!(
            count(
                &direct,
                "SELECT count(*) FROM pg_tables
                  WHERE (schemaname, tablename) IN (('reference', 'point_awards'),
                                                    ('rewards', 'redemptions'))"
            )
            .await,
            2,
            "{what}: {report}"
        );
        no_advisory_lock_left(&direct, &what).await;
        if let Some(report) = finished {
            report.unwrap();
            break;
        }
        assert!(n < MOST_ANSWERS, "the migration never finished");
    }
    database.pool().close().await;
    bench.close().await;
}

// ---------------------------------------------------------------------------------------------
// The harness (its lanes: connections out of the pool's count, kept between jobs only outside a
// transaction).

fn valid(job: JobId) -> IncomingMessage {
    let body = envelope(job, tenant(), "c", json!({"account_id": "a", "points": 5}));
    message_on("jobs", &body, 1)
}

async fn awards(pool: &PgPool, job: JobId) -> i64 {
    consumer::count_awards(pool, job).await.unwrap()
}

/// One job through the harness (per-job commits) cut at every answer of the server: no lane
/// and no connection of the pool left inside a transaction, the job's effect applied once when
/// its message comes again.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_cut_at_any_answer_leaves_no_transaction_and_applies_once(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let harness = harness_waiting(&bench.pool, CommitMode::PerJob, Duration::from_secs(1));
    for n in 0.. {
        let job = JobId(Uuid::new_v4());
        let msg = valid(job);
        bench.ready().await;
        let finished = cut(&bench.gate, n, harness.process(&msg)).await;
        let what = format!("a job cut after {n} messages");
        bench.no_transaction_left(&what).await;
        assert!(awards(&direct, job).await <= 1, "{what}: applied twice");
        let again = harness.process(&msg).await;
        assert!(again.is_ack(), "{what}: the message again: {again:?}");
        assert_eq!(awards(&direct, job).await, 1, "{what}: applied once");
        if let Some(outcome) = finished {
            assert!(outcome.is_ack(), "{outcome:?}");
            break;
        }
        assert!(n < MOST_ANSWERS, "the job never finished");
    }
    drop(harness);
    e2e::promises::both_hold(&direct).await;
    bench.close().await;
}

/// A batch of three jobs through the harness in batch mode (one commit group) cut at every
/// answer of the server.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_group_cut_at_any_answer_leaves_no_transaction_and_applies_once(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let harness = harness_waiting(&bench.pool, CommitMode::Batch, Duration::from_secs(1));
    for n in 0.. {
        let jobs: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
        let batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
        bench.ready().await;
        let finished = cut(&bench.gate, n, shared_testkit::run_batch(&harness, &batch)).await;
        let what = format!("a commit group cut after {n} messages");
        bench.no_transaction_left(&what).await;
        for job in &jobs {
            assert!(awards(&direct, *job).await <= 1, "{what}: applied twice");
        }
        let again = shared_testkit::run_batch(&harness, &batch).await;
        assert!(
            again.iter().all(|o| o.is_ack()),
            "{what}: the batch again: {again:?}"
        );
        for job in &jobs {
            assert_eq!(awards(&direct, *job).await, 1, "{what}: applied once");
        }
        if let Some(outcomes) = finished {
            assert!(outcomes.iter().all(|o| o.is_ack()), "{outcomes:?}");
            break;
        }
        assert!(n < MOST_ANSWERS, "the batch never finished");
    }
    drop(harness);
    e2e::promises::both_hold(&direct).await;
    bench.close().await;
}

/// The letters of message `message_id`.
async fn letters_of_message(pool: &PgPool, message_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM core.dead_letters WHERE message_id = $1")
        .bind(message_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A job that fails for good (its letter written through its fence: a transaction on a held
/// connection that claims a placeholder fence, writes the letter and drops the claim) and a
/// poison message (its letter written as it is), each through the harness cut at every answer
/// of the server: no transaction left, no effect, and one letter per message once it comes
/// again.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failing_job_cut_at_any_answer_leaves_no_transaction_and_one_letter(direct: PgPool) {
    let bench = Bench::new(&direct, 1).await;
    let harness = shared_testkit::harness_on(
        &bench.pool,
        e2e::faulty_award::AwardPointsWithFaults::new(consumer()),
        HarnessSettings {
            lock_timeout: Duration::from_secs(1),
            ..shared_testkit::settings()
        },
        Arc::new(SystemClock),
    );
    for (kind, payload) in [
        (
            "permanent",
            json!({"account_id": "a", "points": 5, "demo_fault": "permanent"}),
        ),
        ("poison", json!({"account_id": "a", "points": "x"})),
    ] {
        for n in 0.. {
            let job = JobId(Uuid::new_v4());
            let msg = message_on("jobs", &envelope(job, tenant(), "c", payload.clone()), 1);
            bench.ready().await;
            let finished = cut(&bench.gate, n, harness.process(&msg)).await;
            let what = format!("a {kind} job cut after {n} messages");
            bench.no_transaction_left(&what).await;
            assert!(
                letters_of_message(&direct, &msg.message_id).await <= 1,
                "{what}: two letters"
            );
            let again = harness.process(&msg).await;
            assert!(again.is_ack(), "{what}: the message again: {again:?}");
            assert_eq!(
                letters_of_message(&direct, &msg.message_id).await,
                1,
                "{what}: one letter"
            );
            assert_eq!(awards(&direct, job).await, 0, "{what}: an effect committed");
            if let Some(outcome) = finished {
                assert!(outcome.is_ack(), "{outcome:?}");
                break;
            }
            assert!(n < MOST_ANSWERS, "the job never finished");
        }
    }
    drop(harness);
    e2e::promises::both_hold(&direct).await;
    bench.close().await;
}

/// Three jobs run side by side (per-job commits, a pool of three: three lanes at once) cut at
/// every answer of the server, counted over all their connections (which connection's answer
/// comes first is the scheduler's: the cut points vary, the promise does not).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn jobs_side_by_side_cut_at_any_answer_leave_no_transaction_and_apply_once(direct: PgPool) {
    let bench = Bench::new(&direct, 3).await;
    let harness = harness_waiting(&bench.pool, CommitMode::PerJob, Duration::from_secs(1));
    for n in 0.. {
        let jobs: Vec<JobId> = (0..3).map(|_| JobId(Uuid::new_v4())).collect();
        let batch: Vec<IncomingMessage> = jobs.iter().map(|j| valid(*j)).collect();
        bench.ready().await;
        let side_by_side = shared_testkit::run_batch_at(&harness, &batch, 3);
        let finished = cut(&bench.gate, n, side_by_side).await;
        let what = format!("jobs side by side cut after {n} messages");
        bench.no_transaction_left(&what).await;
        let again = shared_testkit::run_batch_at(&harness, &batch, 3).await;
        assert!(
            again.iter().all(|o| o.is_ack()),
            "{what}: the batch again: {again:?}"
        );
        for job in &jobs {
            assert_eq!(awards(&direct, *job).await, 1, "{what}: applied once");
        }
        if let Some(outcomes) = finished {
            assert!(outcomes.iter().all(|o| o.is_ack()), "{outcomes:?}");
            break;
        }
        assert!(n < MOST_ANSWERS, "the batch never finished");
    }
    drop(harness);
    e2e::promises::both_hold(&direct).await;
    bench.close().await;
}
