//! BetterStack alerting against a real local HTTP server standing in for it: one incident per
//! group, durable retries by the scheduled run, and processing that never waits on it for long.

use chrono::Utc;
use consumer::{AwardPoints, count_awards};
use e2e::alert_receiver::AlertReceiver;
use serde_json::json;
use shared::alert_store::{all_groups, unsent_letters};
use shared::alerting::{Alerter, BetterStack};
use shared::clock::{Clock, ManualClock, SystemClock};
use shared::dead_letter::ErrorKind;
use shared::harness::{Harness, IncomingMessage, RecordOutcome};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const TOKEN: &str = "test-token-123";

fn alerter(pool: &PgPool, url: &str, clock: Arc<dyn Clock>) -> Alerter {
    let client = BetterStack::new(url, TOKEN.into(), Some("oncall@example.com".into())).unwrap();
    Alerter::new(pool.clone(), client, clock, Duration::from_secs(1))
}

fn harness(pool: &PgPool, alerter: Alerter) -> Harness<AwardPoints> {
    e2e::harness(pool.clone(), AwardPoints::new(e2e::consumer_name())).with_alerter(Some(alerter))
}

fn message(body: &str, receive_count: u32) -> IncomingMessage {
    IncomingMessage {
        message_id: Uuid::new_v4().to_string(),
        queue: "points-award-jobs".into(),
        body: body.into(),
        receive_count,
        replay_of: None,
    }
}

fn job(payload: serde_json::Value) -> String {
    json!({"job_id": Uuid::new_v4(), "tenant_id": Uuid::new_v4(), "correlation_id": "corr-7", "payload": payload}).to_string()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_new_dead_letter_pages_once_with_the_expected_fields(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let harness = harness(&pool, alerter(&pool, &receiver.url, Arc::new(SystemClock)));
    let body = job(json!({"account_id": "a", "points": 1, "demo_fault": "permanent"}));
    let outcome = harness.process(&message(&body, 1)).await;
    assert!(
        matches!(
            outcome,
            RecordOutcome::DeadLettered {
                kind: ErrorKind::Permanent,
                ..
            }
        ),
        "{outcome:?}"
    );

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
        "Dead letters: points-award-jobs / permanent"
    );
    assert_eq!(
        request.body["summary"],
        "1 permanent dead letter(s) on points-award-jobs"
    );
    assert_eq!(request.body["requester_email"], "oncall@example.com");
    let description = request.body["description"].as_str().unwrap();
    let job_id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for needle in [
        "simulated: account is closed",
        job_id.as_str(),
        "corr-7",
        "GET /v1/core/dead-letters?queue=points-award-jobs&error_kind=permanent",
    ] {
        assert!(
            description.contains(needle),
            "{needle:?} missing from {description}"
        );
    }
    let groups = all_groups(&pool).await.unwrap();
    assert_eq!(
        (
            groups.len(),
            groups[0].incident_id.as_deref(),
            groups[0].notified_count
        ),
        (1, Some("1"), Some(1))
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
        .get(shared::metrics::Metric::DeadLettered(ErrorKind::Poison));
    assert!(letters >= 10_000, "{letters} letters");
    assert_eq!(receiver.received().len(), 1, "one page for the whole storm");
    let groups = all_groups(&pool).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0].letter_count as u64, letters,
        "every letter is counted into the group"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_alert_refused_with_500_is_sent_by_the_next_scheduled_run(pool: PgPool) {
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
    assert_eq!(unsent_letters(&pool).await.unwrap(), 1);

    receiver.accept_all(); // BetterStack is back
    clock.advance(chrono::Duration::minutes(10)); // past the failed group's backoff
    let delivery = alerter(&pool, &receiver.url, clock.clone())
        .deliver_pending(100)
        .await;
    assert_eq!((delivery.sent, delivery.failed), (1, 0));
    assert_eq!(receiver.incidents().len(), 1);
    assert_eq!(unsent_letters(&pool).await.unwrap(), 0);
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
    let job_id = shared::ids::JobId(
        serde_json::from_str::<serde_json::Value>(&ok).unwrap()["job_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    assert_eq!(
        unsent_letters(&pool).await.unwrap(),
        3,
        "kept for the scheduled run"
    );
    let groups = all_groups(&pool).await.unwrap();
    assert!(groups[0].send_attempts >= 1);
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
    e2e::charge_executions(&pool, shared::ids::JobId(crashed_id), 5, None).await;
    harness.process(&message(&crashed, 6)).await;
    let mut names: Vec<String> = receiver
        .incidents()
        .iter()
        .map(|r| r.body["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    let expected: Vec<String> = ["crashed", "exhausted", "permanent", "poison"]
        .iter()
        .map(|k| format!("Dead letters: points-award-jobs / {k}"))
        .collect();
    assert_eq!(names, expected);
}
