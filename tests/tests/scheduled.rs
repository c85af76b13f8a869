//! The scheduled function: escalation of unreviewed failure groups (once per group and step,
//! only past the threshold, never in a review's way), delivery of incident steps not yet
//! delivered, what waits as metrics, and the sweep, through the real binary.

use chrono::{DateTime, Duration as Span, TimeZone, Utc};
use e2e::alert_receiver::AlertReceiver;
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use serde_json::json;
use shared::alerting::{Alerter, BetterStack, Routes};
use shared::clock::{Clock, ManualClock};
use shared::dead_letter::{ErrorKind, NewDeadLetter, record_dead_letter};
use shared::ids::{DeadLetterId, JobId};
use shared::review::{Verdict, lock_letter};
use shared::scheduled::ScheduledRun;
use shared::sweeper::SweepSettings;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

async fn letter(
    pool: &PgPool,
    queue: &str,
    kind: ErrorKind,
    created_at: DateTime<Utc>,
) -> DeadLetterId {
    let payload = json!({});
    let letter = NewDeadLetter {
        job_id: Some(JobId(Uuid::new_v4())),
        tenant_id: None,
        consumer: &e2e::consumer_name(),
        queue,
        message_id: &Uuid::new_v4().to_string(),
        payload: &payload,
        attempts: 5,
        kind,
        last_error: "timeout",
        correlation_id: None,
        replay_of: None,
    };
    record_dead_letter(&mut pool.acquire().await.unwrap(), &letter, created_at)
        .await
        .unwrap()
        .id()
}

fn scheduled(pool: &PgPool, receiver: &AlertReceiver, clock: Arc<ManualClock>) -> ScheduledRun {
    let client = BetterStack::new(&receiver.url, "tok", None).unwrap();
    let clock: Arc<dyn Clock> = clock;
    ScheduledRun {
        pool: pool.clone(),
        alerter: Some(Alerter::new(
            pool.clone(),
            client,
            Routes::default(),
            clock.clone(),
            Duration::from_secs(5),
            Duration::from_secs(900),
        )),
        clock,
        sweep: SweepSettings {
            batch_size: 1_000,
            budget: Duration::from_secs(60),
            pause: Duration::ZERO,
            ledger_ttl: Duration::from_secs(7 * 86_400),
        },
        escalate_after: Duration::from_secs(3 * 86_400),
        page_budget: Duration::from_secs(5),
        replayer: None,
        heartbeat: None,
    }
}

fn escalations(receiver: &AlertReceiver) -> Vec<String> {
    let mut summaries: Vec<String> = receiver
        .incidents()
        .iter()
        .filter(|r| r.body["name"].as_str().unwrap().starts_with("Unreviewed"))
        .map(|r| r.body["summary"].as_str().unwrap().to_owned())
        .collect();
    summaries.sort();
    summaries
}

/// Step k of a group is its oldest pending letter reaching k x 3 days; each pages once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn escalation_pages_once_per_step_per_group_past_the_threshold(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(4)).await;
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(4)).await;
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(2)).await;
    letter(&pool, "jobs-b", ErrorKind::Exhausted, t0()).await;
    let run = scheduled(&pool, &receiver, clock.clone());

    let first = run.run(None).await;
    assert_eq!(first.escalation.clone().unwrap().pages, 1, "{first:?}");
    let group_a = shared::groups::list_groups(
        &pool,
        &shared::groups::GroupFilter {
            queue: Some("jobs-a".into()),
            ..Default::default()
        },
        None,
        1,
    )
    .await
    .unwrap()[0]
        .id;
    assert_eq!(
        escalations(&receiver),
        [format!(
            "3 poison dead letter(s) of group {group_a} pending review for over 3 day(s)"
        )]
    );
    for _ in 0..3 {
        assert_eq!(
            run.run(None).await.escalation.unwrap().pages,
            0,
            "never repeated by a later run"
        );
    }

    clock.advance(Span::days(3)); // the oldest of jobs-a is 7 days old, jobs-b's 3 days
    let later = run.run(None).await.escalation.unwrap();
    assert_eq!((later.pages, later.letters), (2, 4), "{later:?}");
    assert_eq!(escalations(&receiver).len(), 3);
    assert!(
        escalations(&receiver)
            .iter()
            .any(|s| s.ends_with("pending review for over 6 day(s)")),
        "{:?}",
        escalations(&receiver)
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failed_escalation_page_is_retried_by_the_next_run(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", ErrorKind::Permanent, t0() - Span::days(4)).await;
    let run = scheduled(&pool, &receiver, clock);
    receiver.refuse_next(&[503; 500]);
    let report = run.run(None).await;
    assert_eq!(report.escalation.unwrap().failed, 1);
    receiver.accept_all();
    let report = run.run(None).await;
    assert_eq!(report.escalation.unwrap().pages, 1);
    assert_eq!(escalations(&receiver).len(), 1);
}

/// While an escalation page waits on a slow BetterStack, a review of the same group's letter
/// goes through at once: the escalation holds no lock.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_escalation_in_flight_never_blocks_a_review(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let old = letter(&pool, "jobs-a", ErrorKind::Exhausted, t0() - Span::days(4)).await;
    // The group's incident is already open; only the escalation page is left to send.
    let run = scheduled(&pool, &receiver, clock.clone());
    assert_eq!(
        run.alerter
            .as_ref()
            .unwrap()
            .deliver_pending(10)
            .await
            .opened,
        1
    );
    receiver.set_latency(Duration::from_secs(3));
    let escalating = tokio::spawn(async move { run.run(None).await });
    tokio::time::sleep(Duration::from_millis(500)).await; // the page is in flight now
    let started = std::time::Instant::now();
    let mut locked = lock_letter(&pool, old, Duration::from_millis(200))
        .await
        .expect("no lock wait: the escalation holds nothing")
        .unwrap();
    let verdict = Verdict::Discarded {
        reason: "reviewed during an escalation".into(),
    };
    locked.mark(&verdict, "ops-1", t0()).await.unwrap();
    locked.commit().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    let report = escalating.await.unwrap();
    assert_eq!(
        report.escalation.unwrap().pages,
        1,
        "the page still went out"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_scheduled_run_delivers_incidents_not_yet_delivered_and_measures_what_waits(
    pool: PgPool,
) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", ErrorKind::Crashed, t0() - Span::hours(2)).await; // no alerter wrote it
    receiver.refuse_next(&[401]);
    let run = scheduled(&pool, &receiver, clock.clone());
    let refused = run.run(None).await;
    assert_eq!((refused.alerts.failed, refused.alerts.rejected), (1, 1));
    let emf = refused.emf("JobHarness", clock.now());
    assert_eq!(emf["AlertsRejected"], 1);
    assert_eq!(emf["AlertDeliveriesFailed"], 1);
    assert_eq!(emf["OldestUndeliveredAlertSeconds"], 7200);
    assert_eq!(emf["LettersPendingReview"], 1);
    assert_eq!(emf["OldestPendingLetterAgeSeconds"], 7200);

    clock.advance(Span::minutes(5)); // past the failed step's backoff
    let report = run.run(None).await;
    assert_eq!((report.alerts.opened, report.alerts.failed), (1, 0));
    assert_eq!(
        receiver.incidents()[0].body["name"],
        "Dead letters: award-points / crashed on jobs-a"
    );
    assert_eq!(
        report.emf("JobHarness", clock.now())["OldestUndeliveredAlertSeconds"],
        0
    );
}

/// The real binary, invoked as EventBridge invokes it: it sweeps and reports, and emits metrics.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_sweeper_function_deletes_expired_fences_when_invoked(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         SELECT gen_random_uuid(), 'c', gen_random_uuid(), now() - interval '8 days', now() - interval '1 day'
         FROM generate_series(1, 2500)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let host = LambdaHost::new(FunctionSpec {
        name: "scheduled".into(),
        binary: env!("CARGO_BIN_EXE_local-scheduled").into(),
        env: vec![
            ("DATABASE_URL".into(), e2e::test_database_url(&connect)),
            ("ALERTING_DISABLED".into(), "true".into()),
            ("SWEEP_BATCH_SIZE".into(), "1000".into()),
        ],
        timeout: Duration::from_secs(60),
        log_file: None,
        deadline_as_duration: false,
    });
    let scheduled_event = json!({"version": "0", "id": "e", "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-11-30T12:00:00Z", "region": "us-east-1", "resources": [], "detail": {}});
    let response = host.invoke(&scheduled_event).await.unwrap();
    assert_eq!(response["sweep"]["deleted"], 2500, "{response}");
    assert_eq!(response["sweep"]["batches"], 3);
    assert_eq!(response["sweep"]["stop"], "Done");
    tokio::time::sleep(Duration::from_millis(200)).await; // the EMF line is read from its stdout
    assert_eq!(host.metrics().get("FencesDeleted"), Some(&2500));
}
