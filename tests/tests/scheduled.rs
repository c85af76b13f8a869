//! The scheduled function: escalation of unreviewed dead letters (once per letter and step,
//! only past the threshold), retries of unsent alerts, and the sweep, through the real binary.

use chrono::{DateTime, Duration as Span, TimeZone, Utc};
use e2e::alert_receiver::AlertReceiver;
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use serde_json::json;
use shared::alerting::{Alerter, BetterStack};
use shared::clock::{Clock, ManualClock};
use shared::dead_letter::{ErrorKind, NewDeadLetter, record_dead_letter};
use shared::ids::JobId;
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

async fn letter(pool: &PgPool, queue: &str, kind: ErrorKind, created_at: DateTime<Utc>) {
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
        .unwrap();
}

fn scheduled(
    pool: &PgPool,
    receiver: &AlertReceiver,
    clock: Arc<ManualClock>,
    with_alerter: bool,
) -> ScheduledRun {
    let client = BetterStack::new(&receiver.url, "tok".into(), None).unwrap();
    let clock: Arc<dyn Clock> = clock;
    ScheduledRun {
        pool: pool.clone(),
        alerter: with_alerter.then(|| {
            Alerter::new(
                pool.clone(),
                client.clone(),
                clock.clone(),
                Duration::from_secs(1),
            )
        }),
        pager: Some(client),
        clock,
        sweep: SweepSettings {
            batch_size: 1_000,
            budget: Duration::from_secs(60),
            pause: Duration::ZERO,
            ledger_ttl: Duration::from_secs(7 * 86_400),
        },
        escalate_after: Duration::from_secs(3 * 86_400),
        page_budget: Duration::from_secs(1),
        replayer: None,
    }
}

fn pages(receiver: &AlertReceiver) -> Vec<String> {
    let mut summaries: Vec<String> = receiver
        .incidents()
        .iter()
        .map(|r| r.body["summary"].as_str().unwrap().to_owned())
        .collect();
    summaries.sort();
    summaries
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn escalation_fires_once_and_only_for_letters_past_the_threshold(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(4)).await;
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(4)).await;
    letter(&pool, "jobs-a", ErrorKind::Poison, t0() - Span::days(2)).await;
    letter(&pool, "jobs-b", ErrorKind::Exhausted, t0()).await;
    let run = scheduled(&pool, &receiver, clock.clone(), false);

    let first = run.run(None).await;
    assert_eq!(first.escalation.clone().unwrap().pages, 1, "{first:?}");
    assert_eq!(
        pages(&receiver),
        ["2 poison dead letter(s) on jobs-a pending review for over 3 day(s)"]
    );
    assert_eq!(
        run.run(None).await.escalation.unwrap().pages,
        0,
        "never repeated by the next run"
    );
    assert_eq!(receiver.incidents().len(), 1);

    clock.advance(Span::days(3)); // 7, 7, 5 and 3 days old now
    let later = run.run(None).await.escalation.unwrap();
    assert_eq!(
        (later.pages, later.letters),
        (3, 4),
        "two letters reach step 2, two reach step 1"
    );
    assert_eq!(
        pages(&receiver),
        [
            "1 exhausted dead letter(s) on jobs-b pending review for over 3 day(s)",
            "1 poison dead letter(s) on jobs-a pending review for over 3 day(s)",
            "2 poison dead letter(s) on jobs-a pending review for over 3 day(s)",
            "2 poison dead letter(s) on jobs-a pending review for over 6 day(s)",
        ]
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_failed_escalation_page_is_retried_by_the_next_run(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    receiver.refuse_next(&[503; 50]);
    let clock = Arc::new(ManualClock::new(t0()));
    letter(&pool, "jobs-a", ErrorKind::Permanent, t0() - Span::days(4)).await;
    let run = scheduled(&pool, &receiver, clock, false);
    assert_eq!(run.run(None).await.escalation.unwrap().failed, 1);
    receiver.accept_all();
    assert_eq!(run.run(None).await.escalation.unwrap().pages, 1);
    assert_eq!(receiver.incidents().len(), 1);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_scheduled_run_sends_alerts_that_were_not_sent(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(Utc::now()));
    letter(&pool, "jobs-a", ErrorKind::Crashed, Utc::now()).await; // written with no alerter at all
    let report = scheduled(&pool, &receiver, clock, true).run(None).await;
    assert_eq!((report.alerts.sent, report.alerts.failed), (1, 0));
    assert_eq!(
        receiver.incidents()[0].body["name"],
        "Dead letters: jobs-a / crashed"
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
