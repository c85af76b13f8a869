//! BetterStack alerting against a real local HTTP server standing in for it: one incident per
//! failure group while it lasts (across hour boundaries), updated with the group's count and
//! resolved when every letter is reviewed; fingerprints that keep statuses apart and mask what
//! varies per job; routes per queue; durable retries; a broken alert path as a metric; and
//! processing that never waits on BetterStack for long.

use chrono::{DateTime, TimeZone, Utc};
use consumer::{AwardPoints, count_awards};
use e2e::alert_receiver::AlertReceiver;
use e2e::faulty_award::AwardPointsWithFaults;
use serde_json::json;
use shared::clock::{Clock, ManualClock, SystemClock};
use shared::dead_letter::ErrorKind;
use shared::dead_letter::{GroupFilter, GroupStatus, list_groups};
use shared::dead_letter::{Verdict, lock_letter};
use shared::harness::{Harness, IncomingMessage, RecordOutcome};
use shared::ids::{DeadLetterId, JobId, TenantId};
use shared::metrics::Metric;
use shared::paging::{Alerter, BetterStack, Route, Routes};
use shared_testkit::{TestLetter, record_letter};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const TOKEN: &str = "test-token-123";
const QUEUE: &str = "points-award-jobs";

fn alerter_with(pool: &PgPool, url: &str, clock: Arc<dyn Clock>, routes: Routes) -> Alerter {
    let client = BetterStack::new(url, TOKEN, Some("oncall@example.com".into())).unwrap();
    Alerter::new(
        pool.clone(),
        client,
        routes,
        clock,
        Duration::from_secs(1),
        Duration::from_secs(15 * 60),
    )
}

fn alerter(pool: &PgPool, url: &str, clock: Arc<dyn Clock>) -> Alerter {
    alerter_with(pool, url, clock, Routes::default())
}

/// The reference consumer, failing on request (`demo_fault`), with `alerter`.
fn harness(pool: &PgPool, alerter: Alerter) -> Harness<AwardPointsWithFaults> {
    e2e::harness(
        pool.clone(),
        AwardPointsWithFaults::new(e2e::consumer_name()),
    )
    .with_alerter(Some(alerter))
}

fn message(body: &str, receive_count: u32) -> IncomingMessage {
    shared_testkit::message_on(QUEUE, body, receive_count)
}

fn job(payload: serde_json::Value) -> String {
    let (job_id, tenant_id) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    shared_testkit::envelope(job_id, tenant_id, "corr-7", payload)
}

/// Writes a letter of the reference consumer on `queue` with `error`, at `at`.
async fn letter(pool: &PgPool, queue: &str, error: &str, at: DateTime<Utc>) -> DeadLetterId {
    let job_id = JobId(Uuid::new_v4());
    let letter = TestLetter {
        last_error: error.into(),
        correlation_id: Some("corr-1".into()),
        ..TestLetter::new(Some(job_id), &e2e::consumer_name(), queue, "{}")
    };
    record_letter(pool, &letter, at).await
}

async fn discard(pool: &PgPool, id: DeadLetterId, at: DateTime<Utc>) {
    let mut locked = lock_letter(pool, id, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the letter");
    let verdict = Verdict::Discarded {
        reason: "fixed by hand".into(),
    };
    locked.mark(&verdict, "ops-1", at).await.unwrap();
    locked.commit().await.unwrap();
}

async fn groups(pool: &PgPool) -> Vec<shared::dead_letter::Group> {
    let all = GroupFilter::default();
    let mut groups = list_groups(pool, &all, None, 100).await.unwrap();
    groups.sort_by_key(|g| g.id);
    groups
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_new_dead_letter_pages_once_with_the_expected_fields(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let harness = harness(&pool, alerter(&pool, &receiver.url, Arc::new(SystemClock)));
    let body = job(json!({"account_id": "a", "points": 1, "demo_fault": "permanent"}));
    let outcome = harness.process(&message(&body, 1)).await;
    assert_eq!(outcome.dead_letter_kind(), Some(ErrorKind::Permanent));

    let got = receiver.received();
    assert_eq!(got.len(), 1, "{got:?}");
    let request = &got[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/api/v3/incidents")
    );
    assert_eq!(
        request.authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        request.body["name"],
        "Dead letters: award-points / permanent on points-award-jobs"
    );
    assert_eq!(
        request.body["summary"],
        "1 permanent dead letter(s) on points-award-jobs: simulated: account is closed"
    );
    assert_eq!(request.body["requester_email"], "oncall@example.com");
    let group = &groups(&pool).await[0];
    let description = request.body["description"].as_str().unwrap();
    let job_id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for needle in [
        "simulated: account is closed".to_owned(),
        job_id,
        "corr-7".to_owned(),
        format!("dlq replay --group {} --dry-run", group.id),
        format!("GET /v1/core/dead-letter-groups/{}", group.id),
    ] {
        assert!(
            description.contains(&needle),
            "{needle:?} missing from {description}"
        );
    }
    let incident = group.incident.as_ref().expect("recorded");
    assert_eq!((incident.id.as_str(), incident.count), ("1", 1));
}

/// One incident per failure group while it lasts: a letter of the same failure an hour later
/// joins the same group and incident; the incident is updated with the count (not re-opened),
/// and resolved once every letter of the group is reviewed. A later letter of the same failure
/// is a new group and a new incident.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn one_incident_per_group_across_an_hour_boundary_updated_then_resolved(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let start = Utc.with_ymd_and_hms(2026, 11, 30, 10, 55, 0).unwrap();
    let clock = Arc::new(ManualClock::new(start));
    let alerter = alerter(&pool, &receiver.url, clock.clone());
    let first = letter(&pool, QUEUE, "ledger timeout after 31 s", start).await;
    assert_eq!(alerter.deliver_pending(10).await.opened, 1);

    // 11:05, the next clock hour: the same failure, with another number in it.
    clock.advance(chrono::Duration::minutes(10));
    let second = letter(&pool, QUEUE, "ledger timeout after 29 s", clock.now()).await;
    let third = letter(&pool, QUEUE, "ledger timeout after 30 s", clock.now()).await;
    let delivery = alerter.deliver_pending(10).await;
    assert_eq!(
        (delivery.opened, delivery.updated),
        (0, 0),
        "no new incident; the update waits its interval"
    );
    assert_eq!(groups(&pool).await.len(), 1, "one group across the hour");

    clock.advance(chrono::Duration::minutes(15));
    assert_eq!(alerter.deliver_pending(10).await.updated, 1);
    let comments = receiver.comments();
    assert_eq!(comments.len(), 1);
    assert_eq!(comments[0].path, "/api/v2/incidents/1/comments");
    let comment = comments[0].body["content"].as_str().unwrap();
    assert!(
        comment.contains("now 3 dead letter(s), 3 pending review"),
        "{comment}"
    );
    assert_eq!(
        alerter.deliver_pending(10).await.updated,
        0,
        "nothing new to say"
    );

    for id in [first, second] {
        discard(&pool, id, clock.now()).await;
    }
    assert_eq!(alerter.deliver_pending(10).await.resolved, 0, "one pending");
    discard(&pool, third, clock.now()).await;
    assert_eq!(alerter.deliver_pending(10).await.resolved, 1);
    assert_eq!(
        receiver.resolutions()[0].path,
        "/api/v3/incidents/1/resolve"
    );
    let resolved = &groups(&pool).await[0];
    assert_eq!(resolved.status, GroupStatus::Resolved);
    assert!(resolved.incident.as_ref().unwrap().resolved_at.is_some());

    // The failure comes back: a new group, a new incident.
    letter(&pool, QUEUE, "ledger timeout after 12 s", clock.now()).await;
    assert_eq!(alerter.deliver_pending(10).await.opened, 1);
    assert_eq!(receiver.incidents().len(), 2);
    let all = groups(&pool).await;
    assert_eq!(
        all.iter().map(|g| g.status).collect::<Vec<_>>(),
        [GroupStatus::Resolved, GroupStatus::Open]
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn fingerprints_keep_statuses_and_codes_apart_and_mask_values_per_job(pool: PgPool) {
    let at = Utc::now();
    for error in [
        "provider answered 503: try later",
        "provider answered 429: slow down",
        "provider answered 503: try later",
        "account 'acct-17' is closed",
        "account 'acct-99' is closed",
        "E1001 invalid account acct-3",
        "E1002 invalid account acct-4",
        "request req_8f3a9b2c1d4e5f timed out after 3000 ms for job 6f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f",
        "request req_00aa11bb22cc33 timed out after 2999 ms for job 0f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f",
    ] {
        letter(&pool, QUEUE, error, at).await;
    }
    let patterns: Vec<(String, i64)> = groups(&pool)
        .await
        .into_iter()
        .map(|g| (g.pattern, g.letter_count))
        .collect();
    assert_eq!(
        patterns,
        [
            ("provider answered #503: try later".to_owned(), 2),
            ("provider answered #429: slow down".to_owned(), 1),
            ("account <q> is closed".to_owned(), 2),
            ("E1001 invalid account acct-<n>".to_owned(), 1),
            ("E1002 invalid account acct-<n>".to_owned(), 1),
            (
                "request <id> timed out after <n> for job <id>".to_owned(),
                2
            ),
        ]
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_queue_pages_its_own_route(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let routes = Routes {
        default: Route {
            policy_id: Some("default-policy".into()),
            team_name: None,
        },
        by_queue: [(
            "rewards-jobs".to_owned(),
            Route {
                policy_id: Some("rewards-policy".into()),
                team_name: Some("Rewards".into()),
            },
        )]
        .into(),
        escalation: None,
    };
    let alerter = alerter_with(&pool, &receiver.url, Arc::new(SystemClock), routes);
    letter(&pool, QUEUE, "boom", Utc::now()).await;
    letter(&pool, "rewards-jobs", "boom", Utc::now()).await;
    assert_eq!(alerter.deliver_pending(10).await.opened, 2);
    let mut routed: Vec<(String, String, Option<String>)> = receiver
        .incidents()
        .iter()
        .map(|r| {
            (
                r.body["name"].as_str().unwrap().to_owned(),
                r.body["policy_id"].as_str().unwrap().to_owned(),
                r.body["team_name"].as_str().map(str::to_owned),
            )
        })
        .collect();
    routed.sort();
    assert_eq!(
        routed,
        [
            (
                "Dead letters: award-points / exhausted on points-award-jobs".to_owned(),
                "default-policy".to_owned(),
                None
            ),
            (
                "Dead letters: award-points / exhausted on rewards-jobs".to_owned(),
                "rewards-policy".to_owned(),
                Some("Rewards".to_owned())
            ),
        ]
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_rejected_token_is_counted_as_a_broken_alert_path(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    receiver.refuse_next(&[401; 5]);
    let harness = harness(&pool, alerter(&pool, &receiver.url, Arc::new(SystemClock)));
    let outcome = harness.process(&message("garbage", 1)).await;
    assert_eq!(outcome.dead_letter_kind(), Some(ErrorKind::Poison));
    assert_eq!(
        receiver.received().len(),
        1,
        "a refused token is not retried"
    );
    let metrics = harness.metrics();
    assert_eq!(
        (
            metrics.get(Metric::AlertDeliveryFailed),
            metrics.get(Metric::AlertRejected)
        ),
        (1, 1)
    );
    let group = &groups(&pool).await[0];
    assert_eq!(group.delivery_failures, 1);
    assert!(
        group
            .last_delivery_error
            .as_deref()
            .unwrap()
            .contains("refused the API token (401)"),
        "{group:?}"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_storm_of_10000_letters_of_one_group_is_one_incident(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(connect)
        .await
        .unwrap();
    let receiver = AlertReceiver::start().await;
    receiver.set_latency(Duration::from_millis(300)); // a page takes a while; others dead-letter meanwhile
    let harness = Arc::new(harness(
        &pool,
        alerter(&pool, &receiver.url, Arc::new(SystemClock)),
    ));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let harness = harness.clone();
            tokio::spawn(async move {
                for _ in 0..10_000 / 16 + 1 {
                    harness
                        .process(&message("a bad deploy sends garbage", 1))
                        .await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let letters = harness
        .metrics()
        .get(Metric::DeadLettered(ErrorKind::Poison));
    assert!(letters >= 10_000, "{letters} letters");
    assert_eq!(
        receiver.incidents().len(),
        1,
        "one page for the whole storm"
    );
    let groups = groups(&pool).await;
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (
            groups[0].letter_count as u64,
            groups[0].pending_count as u64
        ),
        (letters, letters),
        "every letter is counted into the group once"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_redelivered_message_is_counted_into_its_group_once(pool: PgPool) {
    let harness = e2e::harness(pool.clone(), AwardPoints::new(e2e::consumer_name()));
    let msg = message("garbage", 1);
    for _ in 0..3 {
        assert!(harness.process(&msg).await.is_ack());
    }
    let group = &groups(&pool).await[0];
    assert_eq!((group.letter_count, group.pending_count), (1, 1));
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_alert_refused_with_500_is_sent_by_the_next_round(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    receiver.refuse_next(&[500; 20]);
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let harness = harness(&pool, alerter(&pool, &receiver.url, clock.clone()));
    let outcome = harness.process(&message("garbage", 1)).await;
    assert!(
        matches!(outcome, RecordOutcome::DeadLettered { .. }),
        "the letter commits whatever BetterStack says"
    );
    assert!(receiver.incidents().is_empty());
    assert!(
        receiver.received().len() >= 2,
        "500 is retried within the budget"
    );
    assert!(groups(&pool).await[0].incident.is_none());

    receiver.accept_all(); // BetterStack is back
    clock.advance(chrono::Duration::minutes(10)); // past the failed step's backoff
    let delivery = alerter(&pool, &receiver.url, clock.clone())
        .deliver_pending(100)
        .await;
    assert_eq!((delivery.opened, delivery.failed), (1, 0));
    assert_eq!(receiver.incidents().len(), 1);
    assert!(groups(&pool).await[0].incident.is_some());
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_betterstack_down_letters_commit_and_processing_continues(pool: PgPool) {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let harness = harness(&pool, alerter(&pool, &closed, Arc::new(SystemClock)));
    for _ in 0..3 {
        let outcome = harness.process(&message("garbage", 1)).await;
        assert!(
            matches!(outcome, RecordOutcome::DeadLettered { .. }),
            "{outcome:?}"
        );
    }
    let ok = job(json!({"account_id": "a", "points": 1}));
    assert_eq!(
        harness.process(&message(&ok, 1)).await,
        RecordOutcome::Processed
    );
    let job_id = JobId(
        serde_json::from_str::<serde_json::Value>(&ok).unwrap()["job_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    let group = &groups(&pool).await[0];
    assert_eq!(group.letter_count, 3);
    assert!(
        group.incident.is_none() && group.delivery_failures >= 1,
        "kept for the scheduled run: {group:?}"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn poison_exhausted_permanent_and_crashed_letters_all_alert(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let harness = harness(&pool, alerter(&pool, &receiver.url, Arc::new(SystemClock)));
    let failing = |fault: &str| job(json!({"account_id": "a", "points": 1, "demo_fault": fault}));
    harness.process(&message("garbage", 1)).await;
    let exhausting = failing("always_transient");
    for delivery in 1..=5 {
        harness.process(&message(&exhausting, delivery)).await;
    }
    harness.process(&message(&failing("permanent"), 1)).await;
    // A job whose five executions all crashed: its next delivery is a `crashed` letter.
    let crashed = job(json!({"account_id": "a", "points": 1}));
    let crashed_id = serde_json::from_str::<serde_json::Value>(&crashed).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    e2e::charge_executions(&pool, JobId(crashed_id), 5, None).await;
    harness.process(&message(&crashed, 6)).await;
    let mut names: Vec<String> = receiver
        .incidents()
        .iter()
        .map(|r| r.body["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    let expected: Vec<String> = ["crashed", "exhausted", "permanent", "poison"]
        .iter()
        .map(|k| format!("Dead letters: award-points / {k} on points-award-jobs"))
        .collect();
    assert_eq!(names, expected);
}

/// Issue 36: a letter committed while another caller's round runs is paged by its own caller's
/// round, not left to the scheduled run (the round in flight read the groups before the letter
/// was there). A version that skipped a caller while a round was in flight failed here.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_committed_during_a_round_is_paged_by_the_round_after_it(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let alerter = alerter_with(&pool, &receiver.url, clock, Routes::default());
    letter(&pool, "jobs-a", "ledger timeout after 31 s", Utc::now()).await;
    receiver.set_latency(Duration::from_millis(400));
    let first = tokio::spawn({
        let alerter = alerter.clone();
        async move { alerter.deliver_pending(10).await }
    });
    // The first round has claimed jobs-a's group and waits on BetterStack.
    tokio::time::sleep(Duration::from_millis(150)).await;
    letter(&pool, "jobs-b", "partner refused the call", Utc::now()).await;
    let askers: Vec<_> = (0..8)
        .map(|_| {
            let alerter = alerter.clone();
            tokio::spawn(async move { alerter.deliver_pending(10).await })
        })
        .collect();
    let mut opened = first.await.unwrap().opened;
    for asker in askers {
        opened += asker.await.unwrap().opened;
    }
    assert_eq!(opened, 2, "each group's incident opened once, by a caller");
    assert_eq!(receiver.incidents().len(), 2);
}
