//! Attacks on the one paging driver (`shared/src/paging`, the scheduled run in
//! `shared/src/upkeep`), against real PostgreSQL and the in-process BetterStack fake: two runs at
//! once, senders that die mid-step, chains of incidents resolved by hand, BetterStack failing
//! then recovering, steps deferred for lack of time, many escalations at once. Each asserts
//! exact counts, in the fake and in `core.dead_letter_groups`,
//! `core.dead_letter_group_escalations` and `core.replay_send_incidents`.
//!
//! Each test was written by an outside attack on the paging driver; the ones it found failing
//! (a step started short of time, a deferred read-back, a claim cut off midway, escalations
//! starved behind refusals or a dead sender) pass since their fix.

use chrono::{DateTime, Duration as Span, Utc};
use e2e::alert_receiver::{AlertReceiver, Received};
use shared::clock::{Clock, ManualClock};
use shared::dead_letter::{ErrorKind, Verdict, lock_letter, record_replay_sent};
use shared::ids::{DeadLetterId, JobId};
use shared::paging::{Alerter, BetterStack, Routes};
use shared::upkeep::ScheduledRun;
use shared_testkit::{TestLetter, record_letter, t0};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// A row of `core.dead_letter_group_escalations`: attempts, last error, paged at, claimed until.
type EscalationRow = (
    i32,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The escalation threshold of every run here: 3 days.
const ESCALATE_AFTER: Duration = Duration::from_secs(3 * 86_400);
/// The bound on unsent replays: 1 hour.
const UNSENT_BOUND: Duration = Duration::from_secs(3_600);
/// The paging lease (`shared::lease::LEASE`).
const LEASE_SECS: i64 = 120;

/// A scheduled run on `pool` paging the fake at `url`, each page within `budget`.
fn run_on(pool: &PgPool, url: &str, clock: &Arc<ManualClock>, budget: Duration) -> ScheduledRun {
    let client = BetterStack::new(url, "tok", None).unwrap();
    let clock: Arc<dyn Clock> = clock.clone();
    ScheduledRun {
        pool: pool.clone(),
        alerter: Some(Alerter::new(
            pool.clone(),
            client,
            Routes::default(),
            clock.clone(),
            budget,
            Duration::from_secs(900),
        )),
        clock,
        sweep: shared_testkit::SWEEP,
        escalate_after: ESCALATE_AFTER,
        replayer: None,
        heartbeat: None,
        replay_alert_after: UNSENT_BOUND,
    }
}

fn alerter(run: &ScheduledRun) -> &Alerter {
    run.alerter.as_ref().unwrap()
}

/// A pending letter on `queue` (one failure group per queue), written at `at`.
async fn letter(pool: &PgPool, queue: &str, at: DateTime<Utc>) -> DeadLetterId {
    let letter = TestLetter {
        kind: ErrorKind::Exhausted,
        ..TestLetter::new(
            Some(JobId(Uuid::new_v4())),
            &e2e::consumer_name(),
            queue,
            "{}",
        )
    };
    record_letter(pool, &letter, at).await
}

/// Reviews letter `id` (discarded) at `at`.
async fn review(pool: &PgPool, id: DeadLetterId, at: DateTime<Utc>) {
    let mut locked = lock_letter(pool, id, Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    let verdict = Verdict::Discarded {
        reason: "reviewed".into(),
    };
    locked.mark(&verdict, "ops-1", at).await.unwrap();
    locked.commit().await.unwrap();
}

/// `n` letters of `queue` replayed at `reviewed_at` and never sent (`replay_outcome = queued`).
async fn queued_replays(
    pool: &PgPool,
    queue: &str,
    n: i64,
    reviewed_at: DateTime<Utc>,
) -> Vec<Uuid> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload,
                                        attempts, error_kind, last_error, created_at)
         SELECT gen_random_uuid(), 'award-points', $1, gen_random_uuid()::text, '{}'::jsonb,
                5, 'exhausted', 'partner ledger offline', $3 - interval '1 hour'
         FROM generate_series(1, $2)
         RETURNING id",
    )
    .bind(queue)
    .bind(n)
    .bind(reviewed_at)
    .fetch_all(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE core.dead_letters
         SET status = 'replayed', reviewed_by = 'ops-1', reviewed_at = $2,
             replay_outcome = 'queued', replay_reason = 'the ledger is back'
         WHERE id = ANY ($1)",
    )
    .bind(&ids)
    .bind(reviewed_at)
    .execute(pool)
    .await
    .unwrap();
    ids
}

/// Records the replays `ids` as sent (their rows leave `core.replay_sends`).
async fn sent(pool: &PgPool, ids: &[Uuid], at: DateTime<Utc>) {
    for id in ids {
        record_replay_sent(pool, DeadLetterId(*id), "m-1", at)
            .await
            .unwrap()
            .expect("a queued replay");
    }
}

/// Incidents the fake created (answered 201) whose name starts with `prefix`.
fn created(receiver: &AlertReceiver, prefix: &str) -> Vec<Received> {
    receiver
        .incidents()
        .into_iter()
        .filter(|r| r.body["name"].as_str().unwrap_or("").starts_with(prefix))
        .collect()
}

/// Requests to create an incident the fake got, whatever it answered.
fn create_requests(receiver: &AlertReceiver) -> usize {
    receiver
        .received()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/api/v3/incidents")
        .count()
}

/// The ids the fake gave the incidents it created whose name starts with `prefix`: each is the
/// request's position among all requests (the fake answers `received.len() + 1`).
fn created_ids(receiver: &AlertReceiver, prefix: &str) -> Vec<String> {
    receiver
        .received()
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.path == "/api/v3/incidents"
                && r.status < 300
                && r.body["name"].as_str().unwrap_or("").starts_with(prefix)
        })
        .map(|(at, _)| (at + 1).to_string())
        .collect()
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap()
}

const DEAD_LETTERS: &str = "Dead letters:";
const UNREVIEWED: &str = "Unreviewed";
const UNSENT: &str = "Replays not sent";

fn distinct_names(v: &[Received]) -> BTreeSet<String> {
    v.iter()
        .map(|r| r.body["name"].as_str().unwrap().to_owned())
        .collect()
}

fn distinct_summaries(v: &[Received]) -> BTreeSet<String> {
    v.iter()
        .map(|r| r.body["summary"].as_str().unwrap().to_owned())
        .collect()
}

/// A BetterStack that takes each request as soon as it arrives (an incident is created then) and
/// answers only `latency` later, even to a client that stopped waiting: what a slow BetterStack
/// does, unlike [`AlertReceiver`], whose request is dropped with its connection.
struct LateBetterStack {
    url: String,
    state: Arc<Mutex<LateState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct LateState {
    latency: Duration,
    /// Every request taken: method, path, JSON body.
    taken: Vec<(String, String, serde_json::Value)>,
}

impl Drop for LateBetterStack {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LateBetterStack {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(LateState::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(late_answer(stream, shared.clone()));
            }
        });
        Self { url, state, task }
    }

    fn set_latency(&self, latency: Duration) {
        self.state.lock().unwrap().latency = latency;
    }

    /// The incidents created (taken, answered or not) whose name starts with `prefix`, by id.
    fn created(&self, prefix: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .taken
            .iter()
            .enumerate()
            .filter(|(_, (m, p, b))| {
                m == "POST"
                    && p == "/api/v3/incidents"
                    && b["name"].as_str().unwrap_or("").starts_with(prefix)
            })
            .map(|(at, _)| format!("late-{}", at + 1))
            .collect()
    }

    /// The paths of the resolutions taken.
    fn resolutions(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .taken
            .iter()
            .filter(|(_, p, _)| p.ends_with("/resolve"))
            .map(|(_, p, _)| p.clone())
            .collect()
    }
}

async fn late_answer(mut stream: tokio::net::TcpStream, state: Arc<Mutex<LateState>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let (head_end, length) = loop {
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap_or(0));
            break (end + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut first = head.split_whitespace();
    let (method, path) = (
        first.next().unwrap_or("").to_owned(),
        first.next().unwrap_or("").to_owned(),
    );
    let body: serde_json::Value =
        serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or_default();
    let (status, answer, latency) = {
        let mut state = state.lock().unwrap();
        state.taken.push((method.clone(), path.clone(), body));
        let id = format!("late-{}", state.taken.len());
        let (status, answer) = if method == "GET" {
            (
                "200 OK",
                serde_json::json!({"data": {"id": id, "attributes": {"status": "Started", "resolved_at": null}}}),
            )
        } else if path.ends_with("/resolve") {
            ("200 OK", serde_json::json!({"data": {"id": id}}))
        } else {
            ("201 Created", serde_json::json!({"data": {"id": id}}))
        };
        (status, answer.to_string(), state.latency)
    };
    tokio::time::sleep(latency).await;
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// (1) Two scheduled runs at once, on separate pools, over the same groups, escalations and
// queues: one incident per group, one page per (group, step), one incident per queue, one
// update per group count, one raise-again per incident resolved by hand, one resolution each.
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn two_runs_at_once_page_each_group_step_and_queue_once(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    const GROUPS: usize = 30;
    const QUEUES: usize = 6;
    let setup = pool_opts
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    let pool_a = pool_opts
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    let pool_b = pool_opts.connect_with(connect.clone()).await.unwrap();
    let receiver = AlertReceiver::start().await;
    receiver.set_latency(Duration::from_millis(15)); // widen every window between claim and record
    let clock = Arc::new(ManualClock::new(t0()));
    let mut letters = Vec::new();
    for g in 0..GROUPS {
        letters.push(letter(&setup, &format!("jobs-{g:02}"), t0() - Span::days(4)).await);
    }
    let mut replays = Vec::new();
    for q in 0..QUEUES {
        replays
            .push(queued_replays(&setup, &format!("replays-{q}"), 2, t0() - Span::hours(2)).await);
    }
    let a = run_on(&pool_a, &receiver.url, &clock, Duration::from_secs(5));
    let b = run_on(&pool_b, &receiver.url, &clock, Duration::from_secs(5));

    // Round 1: everything is due once.
    let (ra, rb) = tokio::join!(a.run(None), b.run(None));
    assert_eq!(
        ra.alerts.opened + rb.alerts.opened,
        GROUPS,
        "{ra:?}\n{rb:?}"
    );
    let esc = |r: &shared::upkeep::ScheduledReport| r.escalation.clone().unwrap();
    let uns = |r: &shared::upkeep::ScheduledReport| r.unsent_replays.clone().unwrap();
    assert_eq!(esc(&ra).opened + esc(&rb).opened, GROUPS);
    assert_eq!(uns(&ra).opened + uns(&rb).opened, QUEUES);
    let groups_created = created(&receiver, DEAD_LETTERS);
    assert_eq!(groups_created.len(), GROUPS);
    assert_eq!(distinct_names(&groups_created).len(), GROUPS);
    let pages = created(&receiver, UNREVIEWED);
    assert_eq!(pages.len(), GROUPS);
    assert_eq!(distinct_summaries(&pages).len(), GROUPS);
    let unsent = created(&receiver, UNSENT);
    assert_eq!(unsent.len(), QUEUES);
    assert_eq!(distinct_names(&unsent).len(), QUEUES);
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.dead_letter_groups
             WHERE resolved_at IS NULL AND incident_id IS NOT NULL AND claimed_until IS NULL"
        )
        .await,
        GROUPS as i64
    );
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.dead_letter_group_escalations
             WHERE paged_at IS NOT NULL AND step = 1 AND claimed_until IS NULL"
        )
        .await,
        GROUPS as i64
    );
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.dead_letter_group_escalations"
        )
        .await,
        GROUPS as i64
    );
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.replay_send_incidents
             WHERE incident_id IS NOT NULL AND resolved_at IS NULL AND claimed_until IS NULL"
        )
        .await,
        QUEUES as i64
    );

    // Nothing more at the same time, nor a minute later.
    for _ in 0..2 {
        let before = receiver.received().len();
        tokio::join!(a.run(None), b.run(None));
        assert_eq!(receiver.received().len(), before, "nothing due");
        clock.advance(Span::minutes(1));
    }

    // Round 2: groups 0..10 grow (an update each), incidents of groups 10..20 and of queues
    // 0..3 are resolved by hand (raised again once each).
    for g in 0..10 {
        letter(&setup, &format!("jobs-{g:02}"), clock.now()).await;
    }
    let group_incident: Vec<(String, String)> = sqlx::query_as(
        "SELECT queue, incident_id FROM core.dead_letter_groups WHERE resolved_at IS NULL ORDER BY queue",
    )
    .fetch_all(&setup)
    .await
    .unwrap();
    for (_, incident) in &group_incident[10..20] {
        receiver.resolve_by_hand(incident);
    }
    let queue_incident: Vec<(String, String)> =
        sqlx::query_as("SELECT queue, incident_id FROM core.replay_send_incidents ORDER BY queue")
            .fetch_all(&setup)
            .await
            .unwrap();
    for (_, incident) in &queue_incident[0..3] {
        receiver.resolve_by_hand(incident);
    }
    clock.advance(Span::minutes(16)); // past the update interval and the read-back interval
    // Three rounds of two runs: the read-backs (20 a run) reach all 30 open group incidents.
    for _ in 0..3 {
        tokio::join!(a.run(None), b.run(None));
        clock.advance(Span::seconds(30));
    }
    assert_eq!(receiver.comments().len(), 10, "one update per grown group");
    assert_eq!(
        created(&receiver, DEAD_LETTERS).len(),
        GROUPS + 10,
        "each incident resolved by hand raised again exactly once"
    );
    assert_eq!(created(&receiver, UNSENT).len(), QUEUES + 3);
    assert_eq!(
        scalar(
            &setup,
            "SELECT coalesce(sum(incidents_raised_again), 0)::bigint FROM core.dead_letter_groups"
        )
        .await,
        10
    );
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.replay_send_incidents
             WHERE previous_incident_id IS NOT NULL AND incident_id IS NOT NULL AND resolved_at IS NULL"
        )
        .await,
        3
    );

    // Round 3: groups 0..5 reviewed, queues 0..2 sent: one resolution each.
    for l in &letters[0..5] {
        review(&setup, *l, clock.now()).await;
    }
    // Their later letters too (groups 0..5 got a second one in round 2).
    let later: Vec<Uuid> = sqlx::query_scalar(
        "SELECT d.id FROM core.dead_letters d JOIN core.dead_letter_groups g ON g.id = d.group_id
         WHERE d.status = 'pending_review' AND g.queue = ANY ($1)",
    )
    .bind((0..5).map(|g| format!("jobs-{g:02}")).collect::<Vec<_>>())
    .fetch_all(&setup)
    .await
    .unwrap();
    for l in later {
        review(&setup, DeadLetterId(l), clock.now()).await;
    }
    for ids in &replays[0..2] {
        sent(&setup, ids, clock.now()).await;
    }
    clock.advance(Span::minutes(1));
    for _ in 0..2 {
        tokio::join!(a.run(None), b.run(None));
    }
    let resolutions = receiver.resolutions();
    let paths: BTreeSet<_> = resolutions.iter().map(|r| r.path.clone()).collect();
    assert_eq!(resolutions.len(), 5 + 2, "{resolutions:?}");
    assert_eq!(paths.len(), 5 + 2);

    // Step 2 of every group still open: 25 pages, once each.
    clock.set(t0() + Span::days(2) + Span::hours(1));
    for _ in 0..2 {
        tokio::join!(a.run(None), b.run(None));
    }
    let pages = created(&receiver, UNREVIEWED);
    assert_eq!(pages.len(), GROUPS + 25);
    assert_eq!(distinct_summaries(&pages).len(), GROUPS + 25);
    assert_eq!(
        scalar(
            &setup,
            "SELECT count(*) FROM core.dead_letter_group_escalations WHERE paged_at IS NOT NULL AND step = 2"
        )
        .await,
        25
    );
}

// ---------------------------------------------------------------------------------------------
// (2) A sender that claims and dies before recording: never sent again before its lease ends,
// taken over (once) after.
// ---------------------------------------------------------------------------------------------

/// Runs `run` until it is dropped mid-send, 600 ms in; the fake hangs `hang` per request.
async fn die_mid_send(run: &ScheduledRun, receiver: &AlertReceiver, hang: Duration) {
    receiver.set_latency(hang);
    let died = tokio::time::timeout(Duration::from_millis(600), run.run(None)).await;
    assert!(died.is_err(), "the run was still sending when it died");
    tokio::time::sleep(hang).await; // the fake finishes whatever it was answering
    receiver.set_latency(Duration::ZERO);
}

/// After a sender died at t0: at t0, t0+60 s and t0+119 s nothing is sent; at t0+121 s the
/// step is sent once, and never again.
async fn taken_over_after_the_lease_only(
    run: &ScheduledRun,
    receiver: &AlertReceiver,
    clock: &ManualClock,
) {
    let abandoned = create_requests(receiver);
    for at in [0, 60, LEASE_SECS - 1] {
        clock.set(t0() + Span::seconds(at));
        run.run(None).await;
        assert_eq!(
            create_requests(receiver),
            abandoned,
            "sent again at t0 + {at} s, inside the dead sender's lease"
        );
    }
    clock.set(t0() + Span::seconds(LEASE_SECS + 1));
    run.run(None).await;
    assert_eq!(create_requests(receiver), abandoned + 1, "taken over once");
    clock.advance(Span::seconds(30));
    run.run(None).await;
    assert_eq!(create_requests(receiver), abandoned + 1);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_incident_whose_sender_died_is_taken_over_after_the_lease_and_not_before(
    pool: PgPool,
) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    die_mid_send(&run, &receiver, Duration::from_secs(2)).await;
    let (claimed, incident, failures): (Option<DateTime<Utc>>, Option<String>, i32) =
        sqlx::query_as(
            "SELECT claimed_until, incident_id, delivery_failures FROM core.dead_letter_groups",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        (claimed, incident, failures),
        (Some(t0() + Span::seconds(LEASE_SECS)), None, 0)
    );
    taken_over_after_the_lease_only(&run, &receiver, &clock).await;
    let incident: Option<String> =
        sqlx::query_scalar("SELECT incident_id FROM core.dead_letter_groups")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(incident, created_ids(&receiver, DEAD_LETTERS).pop());
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_escalation_whose_sender_died_is_taken_over_after_the_lease_and_not_before(
    pool: PgPool,
) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::days(4)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    assert_eq!(alerter(&run).deliver_pending(10).await.opened, 1); // only the page is left
    die_mid_send(&run, &receiver, Duration::from_secs(2)).await;
    let row: (i32, Option<DateTime<Utc>>, Option<DateTime<Utc>>, i32) = sqlx::query_as(
        "SELECT step, claimed_until, paged_at, attempts FROM core.dead_letter_group_escalations",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, (1, Some(t0() + Span::seconds(LEASE_SECS)), None, 0));
    taken_over_after_the_lease_only(&run, &receiver, &clock).await;
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM core.dead_letter_group_escalations WHERE paged_at IS NOT NULL"
        )
        .await,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_unsent_replays_incident_whose_sender_died_is_taken_over_after_the_lease_and_not_before(
    pool: PgPool,
) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    queued_replays(&pool, "gone", 2, t0() - Span::hours(2)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    die_mid_send(&run, &receiver, Duration::from_secs(2)).await;
    let row: (Option<String>, Option<DateTime<Utc>>, i32) = sqlx::query_as(
        "SELECT incident_id, claimed_until, attempts FROM core.replay_send_incidents",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, (None, Some(t0() + Span::seconds(LEASE_SECS)), 0));
    taken_over_after_the_lease_only(&run, &receiver, &clock).await;
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM core.replay_send_incidents WHERE incident_id IS NOT NULL"
        )
        .await,
        1
    );
}

// Known, not fixed (the code before the paging driver did the same): a page BetterStack took but
// answered after the budget is released as failed and sent again after its backoff, so the
// group gets two incidents and the first, never recorded, is never resolved by the harness.
// BetterStack's incident API takes no idempotency key to make a retried open exactly-once;
// docs/operations.md says how to spot and close such an incident. Kept, ignored, as the
// statement of the gap.
#[ignore = "known gap: an open BetterStack took but answered late is opened again (no idempotency key)"]
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_page_answered_after_the_budget_is_not_opened_twice(pool: PgPool) {
    let betterstack = LateBetterStack::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let pending = letter(&pool, "jobs-a", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &betterstack.url, &clock, Duration::from_millis(500));
    betterstack.set_latency(Duration::from_millis(1500));
    let slow = run.run(None).await;
    assert_eq!((slow.alerts.opened, slow.alerts.failed), (0, 1), "{slow:?}");
    betterstack.set_latency(Duration::ZERO);
    clock.advance(Span::seconds(11)); // past the failure's backoff
    run.run(None).await;
    review(&pool, pending, clock.now()).await;
    clock.advance(Span::seconds(1));
    run.run(None).await;
    let opened = betterstack.created(DEAD_LETTERS);
    let resolved = betterstack.resolutions();
    let unresolved: Vec<&String> = opened
        .iter()
        .filter(|id| !resolved.contains(&format!("/api/v3/incidents/{id}/resolve")))
        .collect();
    assert_eq!(
        (opened.len(), unresolved),
        (1, Vec::<&String>::new()),
        "one incident for the group, resolved with it"
    );
}

// ---------------------------------------------------------------------------------------------
// (3) Chains: open → resolved by hand → raised again → ... → reviewed/sent → resolved.
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_incident_chain_of_hand_resolutions_ends_resolved_once(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let pending = letter(&pool, "jobs-a", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    let state = || async {
        sqlx::query_as::<_, (Option<String>, Option<String>, i32, bool)>(
            "SELECT incident_id, previous_incident_id, incidents_raised_again, needs_delivery
             FROM core.dead_letter_groups_counted",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(run.run(None).await.alerts.opened, 1);
    let mut current = state().await.0.unwrap();
    for n in 1..=2 {
        receiver.resolve_by_hand(&current);
        clock.advance(Span::minutes(6));
        let report = run.run(None).await;
        assert_eq!(
            (report.alerts.raised_again, report.alerts.opened),
            (1, 1),
            "raised again in the same run: {report:?}"
        );
        let (incident, previous, raised, needs) = state().await;
        assert_eq!(
            (previous.as_deref(), raised, needs),
            (Some(current.as_str()), n, false)
        );
        let newest = created(&receiver, DEAD_LETTERS).pop().unwrap();
        assert!(
            newest.body["description"]
                .as_str()
                .unwrap()
                .contains(&format!("incident {current} was resolved in BetterStack")),
            "{newest:?}"
        );
        current = incident.unwrap();
        assert_eq!(Some(&current), created_ids(&receiver, DEAD_LETTERS).last());
    }
    clock.advance(Span::minutes(6));
    let quiet = run.run(None).await;
    assert_eq!(quiet.alerts, Default::default(), "read back, still open");
    assert_eq!(receiver.reads().len(), 3);

    review(&pool, pending, clock.now()).await;
    clock.advance(Span::minutes(1));
    assert_eq!(run.run(None).await.alerts.resolved, 1);
    for _ in 0..2 {
        clock.advance(Span::minutes(6));
        assert_eq!(run.run(None).await.alerts, Default::default());
    }
    let resolutions = receiver.resolutions();
    assert_eq!(resolutions.len(), 1);
    assert_eq!(
        resolutions[0].path,
        format!("/api/v3/incidents/{current}/resolve")
    );
    assert_eq!(created(&receiver, DEAD_LETTERS).len(), 3);
    let (resolved, needs): (Option<DateTime<Utc>>, bool) = sqlx::query_as(
        "SELECT incident_resolved_at, needs_delivery FROM core.dead_letter_groups_counted",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(resolved.is_some() && !needs);

    // The same failure again: a new group, a new incident that names no earlier one.
    letter(&pool, "jobs-a", clock.now()).await;
    assert_eq!(run.run(None).await.alerts.opened, 1);
    let fresh = created(&receiver, DEAD_LETTERS).pop().unwrap();
    assert!(
        !fresh.body["description"]
            .as_str()
            .unwrap()
            .contains("Raised again"),
        "{fresh:?}"
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM core.dead_letter_groups").await,
        2
    );
}

/// Resolved by hand, then reviewed before any read-back: resolved (BetterStack's 409 counts),
/// never raised again.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_group_resolved_by_hand_then_reviewed_is_resolved_not_raised_again(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let pending = letter(&pool, "jobs-a", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    assert_eq!(run.run(None).await.alerts.opened, 1);
    let incident: String = sqlx::query_scalar("SELECT incident_id FROM core.dead_letter_groups")
        .fetch_one(&pool)
        .await
        .unwrap();
    receiver.resolve_by_hand(&incident);
    review(&pool, pending, clock.now()).await;
    clock.advance(Span::minutes(10));
    let report = run.run(None).await;
    assert_eq!(
        (
            report.alerts.resolved,
            report.alerts.raised_again,
            report.alerts.opened
        ),
        (1, 0, 0)
    );
    run.run(None).await;
    assert_eq!(created(&receiver, DEAD_LETTERS).len(), 1);
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM core.dead_letter_groups_counted WHERE incident_resolved_at IS NOT NULL
               AND NOT needs_delivery AND incidents_raised_again = 0"
        )
        .await,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_unsent_replays_incident_chain_of_hand_resolutions_ends_resolved_once(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let ids = queued_replays(&pool, "q", 2, t0() - Span::hours(2)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    let state = || async {
        sqlx::query_as::<_, (Option<String>, Option<String>, Option<DateTime<Utc>>)>(
            "SELECT incident_id, previous_incident_id, resolved_at FROM core.replay_send_incidents",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(run.run(None).await.unsent_replays.unwrap().opened, 1);
    let mut current = state().await.0.unwrap();
    for _ in 0..2 {
        receiver.resolve_by_hand(&current);
        clock.advance(Span::minutes(6));
        let report = run.run(None).await.unsent_replays.unwrap();
        assert_eq!(
            (report.raised_again, report.opened),
            (1, 1),
            "raised again in the same run: {report:?}"
        );
        let (incident, previous, resolved) = state().await;
        assert_eq!(
            (previous.as_deref(), resolved),
            (Some(current.as_str()), None)
        );
        let newest = created(&receiver, UNSENT).pop().unwrap();
        assert!(
            newest.body["description"]
                .as_str()
                .unwrap()
                .contains(&format!("incident {current} was resolved in BetterStack")),
            "{newest:?}"
        );
        current = incident.unwrap();
        assert_eq!(Some(&current), created_ids(&receiver, UNSENT).last());
    }
    clock.advance(Span::minutes(6));
    let quiet = run.run(None).await.unsent_replays.unwrap();
    assert_eq!(quiet, Default::default(), "read back, still open");

    sent(&pool, &ids, clock.now()).await;
    clock.advance(Span::minutes(1));
    assert_eq!(run.run(None).await.unsent_replays.unwrap().resolved, 1);
    for _ in 0..2 {
        clock.advance(Span::minutes(6));
        assert_eq!(
            run.run(None).await.unsent_replays.unwrap(),
            Default::default()
        );
    }
    let resolutions = receiver.resolutions();
    assert_eq!(resolutions.len(), 1);
    assert_eq!(
        resolutions[0].path,
        format!("/api/v3/incidents/{current}/resolve")
    );
    let (incident, previous, resolved) = state().await;
    assert_eq!(
        (incident.as_deref(), previous, resolved.is_some()),
        (Some(current.as_str()), None, true)
    );
    assert_eq!(created(&receiver, UNSENT).len(), 3);

    // Unsent again later: a new incident, naming no earlier one.
    queued_replays(&pool, "q", 1, clock.now() - Span::hours(2)).await;
    assert_eq!(run.run(None).await.unsent_replays.unwrap().opened, 1);
    let fresh = created(&receiver, UNSENT).pop().unwrap();
    assert!(
        !fresh.body["description"]
            .as_str()
            .unwrap()
            .contains("Raised again"),
        "{fresh:?}"
    );
    assert_eq!(created(&receiver, UNSENT).len(), 4);
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM core.replay_send_incidents").await,
        1
    );
}

// ---------------------------------------------------------------------------------------------
// (4) BetterStack failing (401, 500) then recovering: attempts counted, backoff respected,
// delivered once.
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failing_group_incident_backs_off_and_is_delivered_once(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(1));
    let state = || async {
        sqlx::query_as::<_, (i32, DateTime<Utc>, Option<String>, Option<DateTime<Utc>>)>(
            "SELECT delivery_failures, next_delivery_at, last_delivery_error, claimed_until
             FROM core.dead_letter_groups",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    receiver.refuse_next(&[401]);
    let refused = run.run(None).await;
    assert_eq!((refused.alerts.failed, refused.alerts.rejected), (1, 1));
    let (failures, next, error, claimed) = state().await;
    assert_eq!(
        (failures, next, claimed),
        (1, t0() + Span::seconds(10), None)
    );
    assert!(error.unwrap().contains("401"));
    let asked = create_requests(&receiver);
    clock.set(t0() + Span::seconds(9));
    assert_eq!(run.run(None).await.alerts, Default::default());
    assert_eq!(create_requests(&receiver), asked, "inside the backoff");

    clock.set(t0() + Span::seconds(10));
    receiver.refuse_next(&[500; 200]); // every retry within the 1 s budget fails
    let failing = run.run(None).await;
    assert_eq!((failing.alerts.failed, failing.alerts.rejected), (1, 0));
    let (failures, next, _, claimed) = state().await;
    assert_eq!(
        (failures, next, claimed),
        (2, t0() + Span::seconds(30), None)
    );
    receiver.accept_all();
    let asked = create_requests(&receiver);
    clock.set(t0() + Span::seconds(29));
    run.run(None).await;
    assert_eq!(
        create_requests(&receiver),
        asked,
        "inside the doubled backoff"
    );

    clock.set(t0() + Span::seconds(30));
    let back = run.run(None).await;
    assert_eq!((back.alerts.opened, back.alerts.failed), (1, 0));
    let (failures, _, error, claimed) = state().await;
    assert_eq!((failures, error, claimed), (0, None, None));
    for _ in 0..2 {
        clock.advance(Span::seconds(40));
        run.run(None).await;
    }
    assert_eq!(created(&receiver, DEAD_LETTERS).len(), 1);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn failing_escalations_and_unsent_incidents_are_counted_and_delivered_once(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::days(4)).await;
    queued_replays(&pool, "q", 1, t0() - Span::hours(2)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(1));
    assert_eq!(alerter(&run).deliver_pending(10).await.opened, 1);

    receiver.refuse_next(&[401, 403]);
    let refused = run.run(None).await;
    let (esc, uns) = (
        refused.escalation.clone().unwrap(),
        refused.unsent_replays.clone().unwrap(),
    );
    assert_eq!((esc.failed, esc.rejected, esc.opened), (1, 1, 0));
    assert_eq!((uns.failed, uns.rejected, uns.opened), (1, 1, 0));
    assert_eq!(
        refused.emf("JobHarness", clock.now())["AlertDeliveriesFailed"],
        2
    );
    let escalation: EscalationRow = sqlx::query_as(
        "SELECT attempts, last_error, paged_at, claimed_until
             FROM core.dead_letter_group_escalations",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((escalation.0, escalation.2, escalation.3), (1, None, None));
    assert!(escalation.1.unwrap().contains("401"));
    let incident: (i32, Option<String>, Option<String>, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT attempts, last_error, incident_id, claimed_until FROM core.replay_send_incidents",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((incident.0, incident.2, incident.3), (1, None, None));
    assert!(incident.1.unwrap().contains("403"));

    clock.advance(Span::minutes(1));
    let back = run.run(None).await;
    assert_eq!(back.escalation.unwrap().opened, 1);
    assert_eq!(back.unsent_replays.unwrap().opened, 1);
    for _ in 0..2 {
        clock.advance(Span::minutes(1));
        run.run(None).await;
    }
    assert_eq!(created(&receiver, UNREVIEWED).len(), 1);
    assert_eq!(created(&receiver, UNSENT).len(), 1);
    assert_eq!(
        scalar(
            &pool,
            "SELECT attempts::bigint FROM core.replay_send_incidents"
        )
        .await,
        0,
        "reset once opened"
    );
}

// ---------------------------------------------------------------------------------------------
// (5) Steps claimed and not started for lack of time.
// ---------------------------------------------------------------------------------------------

/// Two group incidents due, a BetterStack slower than the budget: the first is tried and fails
/// (backoff), the second is deferred: released untouched and sent by the next round.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_deferred_group_incident_is_released_untouched_and_sent_next_round(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::hours(2)).await;
    letter(&pool, "jobs-b", t0() - Span::hours(1)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_millis(300));
    receiver.set_latency(Duration::from_secs(1));
    // (AlertReceiver drops a request whose client gave up, with its connection: it creates
    // nothing.)
    let slow = alerter(&run).deliver_pending(10).await;
    assert_eq!(
        (slow.failed, slow.deferred, slow.opened),
        (1, 1, 0),
        "{slow:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    receiver.set_latency(Duration::ZERO);
    let rows: Vec<(String, i32, bool, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT queue, delivery_failures, next_delivery_at = '-infinity', claimed_until
         FROM core.dead_letter_groups ORDER BY queue",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        (rows[0].1, rows[0].2, rows[0].3),
        (1, false, None),
        "tried, failed, backing off"
    );
    let deferred = &rows[1];
    assert_eq!(
        (deferred.1, deferred.2, deferred.3),
        (0, true, None),
        "released untouched"
    );
    let next = alerter(&run).deliver_pending(10).await;
    assert_eq!(
        next.opened, 1,
        "the deferred one, at once; the failed one after its backoff"
    );
    clock.advance(Span::seconds(11));
    assert_eq!(alerter(&run).deliver_pending(10).await.opened, 1);
    assert_eq!(created(&receiver, DEAD_LETTERS).len(), 2);
}

// Found by the attack, fixed: an escalation (or unsent-replays incident, read-back) is
// started with whatever sliver of the round is left (paging/mod.rs:203-211, only `left == 0`
// defers; `round.per_page.min(left)`), where the code at b0f605b (escalation.rs:101,
// unsent_replays.rs:234-238) started a page only with a whole page budget left
// and otherwise deferred it untouched. Now the page goes out with a budget too short to be
// answered: it counts as a failed attempt, and when BetterStack took it anyway it is paged a
// second time by the next run (two pages for one (group, step)).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_escalation_without_a_whole_page_budget_left_is_deferred_not_half_sent(pool: PgPool) {
    let betterstack = LateBetterStack::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::days(5)).await;
    letter(&pool, "jobs-b", t0() - Span::days(4)).await;
    let run = run_on(&pool, &betterstack.url, &clock, Duration::from_secs(5));
    assert_eq!(alerter(&run).deliver_pending(10).await.opened, 2);
    betterstack.set_latency(Duration::from_secs(1));
    // The escalation step gets a quarter of the 2 s left: 0.5 s, less than a page's 5 s.
    let short = run.run(Some(Instant::now() + Duration::from_secs(2))).await;
    let attempts = scalar(
        &pool,
        "SELECT coalesce(sum(attempts), 0)::bigint FROM core.dead_letter_group_escalations",
    )
    .await;
    betterstack.set_latency(Duration::ZERO);
    run.run(None).await;
    run.run(None).await;
    let pages = betterstack.created(UNREVIEWED);
    let esc = short.escalation.unwrap();
    assert_eq!(
        (pages.len(), esc.failed, esc.deferred, attempts),
        (2, 0, 2, 0),
        "one page per (group, step), none started without a page's budget: {esc:?}"
    );
}

// Found by the attack, fixed: a read-back claimed and not started for lack of time is
// "released" by read_backs.rs:200-208 (UnsentReplayReadBacks::release → record(.., false, now),
// read_backs.rs:175-180), which stamps `checked_at = now`: the deferred read-back is skipped for
// INCIDENT_CHECK_INTERVAL (5 min), so an unsent-replays incident resolved by hand is not raised
// again by the next run. the code at b0f605b (unsent_replays.rs:234-238) deferred without touching the row.
// The first read-back, started with the round's last 0.5 s, also fails and is stamped (see the
// finding above). (GroupReadBacks::release, read_backs.rs:101-117, does the same, as the code at b0f605b's
// read-back did with a zero budget.)
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_deferred_unsent_replays_read_back_is_read_by_the_next_run(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    queued_replays(&pool, "q-a", 1, t0() - Span::hours(2)).await;
    queued_replays(&pool, "q-b", 1, t0() - Span::hours(2)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    assert_eq!(run.run(None).await.unsent_replays.unwrap().opened, 2);
    let incidents: Vec<(String, String)> =
        sqlx::query_as("SELECT queue, incident_id FROM core.replay_send_incidents ORDER BY queue")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (_, id) in &incidents {
        receiver.resolve_by_hand(id);
    }
    clock.advance(Span::minutes(10));
    receiver.set_latency(Duration::from_secs(1));
    let short = run.run(Some(Instant::now() + Duration::from_secs(2))).await;
    let short = short.unsent_replays.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    receiver.set_latency(Duration::ZERO);
    let checked: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT checked_at FROM core.replay_send_incidents WHERE queue = 'q-b'")
            .fetch_one(&pool)
            .await
            .unwrap();
    clock.advance(Span::minutes(1));
    let next = run.run(None).await.unsent_replays.unwrap();
    assert_eq!(
        (next.raised_again, next.opened, checked),
        (2, 2, Some(t0())),
        "the short run ({short:?}) left q-b's read-back as it was, so the next run reads both"
    );
}

// Found by the attack, fixed: a claim still
// in flight when the round's time ends is abandoned (paging/mod.rs:198-200:
// `timeout_at(round.until, claimed)` drops the future) but the statement commits in PostgreSQL:
// the steps stay claimed for the whole LEASE with no sender, the round reports nothing (not even
// `deferred`), and the next runs page nothing until the lease ends. the code at b0f605b claimed
// escalations (escalation.rs:105-117) and unsent-replay incidents without a timeout. Here the
// claim waits on a row lock held by another transaction.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_escalation_claim_cut_by_the_round_end_leaves_nothing_claimed(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", t0() - Span::days(5)).await;
    letter(&pool, "jobs-b", t0() - Span::days(4)).await;
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(5));
    assert_eq!(alerter(&run).deliver_pending(10).await.opened, 2);
    let oldest: i64 =
        sqlx::query_scalar("SELECT id FROM core.dead_letter_groups WHERE queue = 'jobs-a'")
            .fetch_one(&pool)
            .await
            .unwrap();
    sqlx::query("INSERT INTO core.dead_letter_group_escalations (group_id, step) VALUES ($1, 1)")
        .bind(oldest)
        .execute(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM core.dead_letter_group_escalations WHERE group_id = $1 FOR UPDATE")
        .bind(oldest)
        .execute(&mut *holder)
        .await
        .unwrap();
    let short = run.run(Some(Instant::now() + Duration::from_secs(2))).await;
    holder.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let orphaned = scalar(
        &pool,
        "SELECT count(*) FROM core.dead_letter_group_escalations
         WHERE paged_at IS NULL AND claimed_until IS NOT NULL",
    )
    .await;
    clock.advance(Span::minutes(1)); // the next run, well inside a lease
    let next = run.run(None).await.escalation.unwrap();
    let short_opened = short.escalation.clone().unwrap().opened;
    // The claim skips the row another transaction holds (it never waits, so it is never cut
    // off midway); with no whole page's time left the short run starts nothing and releases
    // what it claimed: nothing is left claimed, and the next run pages both.
    assert_eq!(
        (orphaned, short_opened, next.opened),
        (0, 0, 2),
        "the short run ({:?}) left nothing claimed; the next run pages both",
        short.escalation
    );
}

// ---------------------------------------------------------------------------------------------
// (6) Many escalations at once: more than a run's 100.
// ---------------------------------------------------------------------------------------------

/// 150 unreviewed groups (the oldest first by a minute each), their incidents open.
async fn many_groups(pool: &PgPool, run: &ScheduledRun, n: i64) {
    for g in 0..n {
        letter(
            pool,
            &format!("h-{g:03}"),
            t0() - Span::days(4) - Span::minutes(n - g),
        )
        .await;
    }
    assert_eq!(alerter(run).deliver_pending(1_000).await.opened, n as usize);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_hundred_fifty_escalations_are_each_paged_once_across_runs(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    let other = pool_opts.connect_with(connect).await.unwrap();
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(30));
    let rival = run_on(&other, &receiver.url, &clock, Duration::from_secs(30));
    many_groups(&pool, &run, 150).await;
    let (a, b) = tokio::join!(run.run(None), rival.run(None));
    let first = a.escalation.unwrap().opened + b.escalation.unwrap().opened;
    assert!((100..=150).contains(&first), "{first}");
    let mut total = first;
    for _ in 0..3 {
        total += run.run(None).await.escalation.unwrap().opened;
    }
    assert_eq!(total, 150);
    let pages = created(&receiver, UNREVIEWED);
    assert_eq!((pages.len(), distinct_summaries(&pages).len()), (150, 150));
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM core.dead_letter_group_escalations
             WHERE paged_at IS NOT NULL AND claimed_until IS NULL AND step = 1"
        )
        .await,
        150
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM core.dead_letter_group_escalations"
        )
        .await,
        150
    );
}

// Found by the attack, fixed: the escalation claim takes the 100 oldest due (group,
// step)s *before* it filters out those it cannot claim (escalations.rs:42-71, LIMIT at :55: `due
// ... ORDER BY oldest LIMIT $4`, then `ON CONFLICT ... WHERE`), and a failed page is released with
// no backoff (escalations.rs:107-126). So 100 pages BetterStack keeps refusing (a 4xx for their
// body) are retried first on every run and the groups behind them are never escalated. the code at b0f605b
// (escalation.rs:43-68, 100-155: no limit) went through every due group, so the others were paged
// in the same run.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn escalations_refused_again_and_again_do_not_starve_the_groups_behind_them(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(30));
    many_groups(&pool, &run, 150).await;
    // The first run claims the 100 oldest (ESCALATIONS_PER_RUN); BetterStack refuses them all.
    receiver.refuse_next(&[422; 100]);
    let refused = run.run(None).await.escalation.unwrap();
    receiver.accept_all();
    assert_eq!((refused.failed, refused.opened), (100, 0));
    // The next run takes the steps never tried first: the 50 younger groups are in it, with
    // 50 of the refused; the run after pages the last 50, each step once.
    let paged =
        "SELECT count(*) FROM core.dead_letter_group_escalations WHERE paged_at IS NOT NULL";
    let never_refused = "SELECT count(*) FROM core.dead_letter_group_escalations
                         WHERE paged_at IS NOT NULL AND attempts = 0";
    let next = run.run(None).await.escalation.unwrap();
    assert_eq!(next.opened, 100, "{next:?}");
    assert_eq!(
        scalar(&pool, never_refused).await,
        50,
        "the 50 younger groups are paged"
    );
    assert_eq!(run.run(None).await.escalation.unwrap().opened, 50);
    assert_eq!(scalar(&pool, paged).await, 150);
    assert_eq!(run.run(None).await.escalation.unwrap().opened, 0);
}

// Found by the attack, fixed: the same limit before
// the claim filter (escalations.rs:42-71, LIMIT at :55): 100 due (group, step)s held by a sender
// that died fill the `due` set, so no other group is escalated until their lease ends (120 s).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn escalations_held_by_a_dead_sender_do_not_block_the_others(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let run = run_on(&pool, &receiver.url, &clock, Duration::from_secs(30));
    many_groups(&pool, &run, 150).await;
    // The 100 oldest, claimed by a sender that died a minute ago.
    sqlx::query(
        "INSERT INTO core.dead_letter_group_escalations (group_id, step, claimed_until)
         SELECT id, 1, $1 FROM core.dead_letter_groups ORDER BY first_letter_at LIMIT 100",
    )
    .bind(t0() + Span::seconds(60))
    .execute(&pool)
    .await
    .unwrap();
    let report = run.run(None).await.escalation.unwrap();
    assert_eq!(
        (report.opened, created(&receiver, UNREVIEWED).len()),
        (50, 50),
        "the 50 groups nobody holds are paged"
    );
}
