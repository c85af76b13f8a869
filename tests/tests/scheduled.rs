//! The scheduled function: escalation of unreviewed failure groups (once per group and step,
//! only past the threshold, never in a review's way), delivery of incident steps not yet
//! delivered, what waits as metrics, and the sweep, through the real binary.

use aws_sdk_sqs::types::QueueAttributeName;
use chrono::{DateTime, Duration as Span, Utc};
use e2e::alert_receiver::AlertReceiver;
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use serde_json::json;
use shared::clock::{Clock, ManualClock};
use shared::dead_letter::ErrorKind;
use shared::dead_letter::{Verdict, lock_letter};
use shared::ids::{DeadLetterId, JobId};
use shared::paging::{Alerter, BetterStack, Routes};
use shared::replay::Replayer;
use shared::upkeep::{Heartbeat, ScheduledRun};
use shared_testkit::{TestLetter, record_letter, t0};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

async fn letter(
    pool: &PgPool,
    queue: &str,
    kind: ErrorKind,
    created_at: DateTime<Utc>,
) -> DeadLetterId {
    let job_id = JobId(Uuid::new_v4());
    let letter = TestLetter {
        kind,
        ..TestLetter::new(Some(job_id), &e2e::consumer_name(), queue, "{}")
    };
    record_letter(pool, &letter, created_at).await
}

/// Seeds 2,500 fences of consumer `c` that expired a day ago (by the database's clock).
async fn seed_expired_fences(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         SELECT gen_random_uuid(), 'c', gen_random_uuid(), now() - interval '8 days', now() - interval '1 day'
         FROM generate_series(1, 2500)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The real scheduled binary on the test's database, alerting off, sweeping 1,000 rows a batch,
/// with `env` besides, invoked with `timeout`.
fn scheduled_host(
    connect: &PgConnectOptions,
    env: &[(&str, &str)],
    timeout: Duration,
) -> LambdaHost {
    let mut all: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), e2e::test_database_url(connect)),
        ("ALERTING_DISABLED".into(), "true".into()),
        ("SWEEP_BATCH_SIZE".into(), "1000".into()),
    ];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    LambdaHost::new(FunctionSpec {
        name: "scheduled".into(),
        binary: env!("CARGO_BIN_EXE_local-scheduled").into(),
        env: all,
        timeout,
        log_file: None,
        deadline_as_duration: false,
    })
}

/// The event EventBridge invokes the scheduled function with.
fn scheduled_event() -> serde_json::Value {
    json!({"version": "0", "id": "e", "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-11-30T12:00:00Z", "region": "us-east-1", "resources": [], "detail": {}})
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
        sweep: shared_testkit::SWEEP,
        escalate_after: Duration::from_secs(3 * 86_400),
        replayer: None,
        heartbeat: None,
        replay_alert_after: Duration::from_secs(3_600),
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
    assert_eq!(first.escalation.clone().unwrap().opened, 1, "{first:?}");
    let group_a = shared::dead_letter::list_groups(
        &pool,
        &shared::dead_letter::GroupFilter {
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
            run.run(None).await.escalation.unwrap().opened,
            0,
            "never repeated by a later run"
        );
    }

    clock.advance(Span::days(3)); // the oldest of jobs-a is 7 days old, jobs-b's 3 days
    let later = run.run(None).await.escalation.unwrap();
    assert_eq!((later.opened, later.letters), (2, 4), "{later:?}");
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
    assert_eq!(report.escalation.unwrap().opened, 1);
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
        report.escalation.unwrap().opened,
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
    seed_expired_fences(&pool).await;
    let host = scheduled_host(&connect, &[], Duration::from_secs(60));
    let response = host.invoke(&scheduled_event()).await.unwrap();
    assert_eq!(response["sweep"]["deleted"], 2500, "{response}");
    assert_eq!(response["sweep"]["batches"], 3);
    assert_eq!(response["sweep"]["stop"], "Done");
    tokio::time::sleep(Duration::from_millis(200)).await; // the EMF line is read from its stdout
    assert_eq!(host.metrics().get("FencesDeleted"), Some(&2500));
}

/// A queue name no other test uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &Uuid::new_v4().simple().to_string()[..12])
}

/// `n` letters of `queue`, replayed by an operator at `reviewed_at`, whose message no queue has
/// taken yet (`replay_outcome = queued`): the replay's own send was refused.
async fn queued_replays(
    pool: &PgPool,
    queue: &str,
    n: i64,
    reviewed_at: DateTime<Utc>,
) -> Vec<Uuid> {
    queued_replays_padded(pool, queue, n, reviewed_at, 0).await
}

/// As [`queued_replays`], each letter's payload carrying `padding` more bytes (a `padding`
/// string) and, with any, its body as received: that payload's JSON (what a replay sends).
async fn queued_replays_padded(
    pool: &PgPool,
    queue: &str,
    n: i64,
    reviewed_at: DateTime<Utc>,
    padding: i32,
) -> Vec<Uuid> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, consumer, queue, message_id, payload, body,
                                        attempts, error_kind, last_error, created_at)
         SELECT j, 'award-points', $1, gen_random_uuid()::text, envelope,
                CASE WHEN $4 > 0 THEN envelope::text END,
                5, 'exhausted', 'partner ledger offline', $3 - interval '1 hour'
         FROM (SELECT j, jsonb_build_object('job_id', j, 'tenant_id', gen_random_uuid(),
                    'payload', jsonb_build_object('account_id', 'acct-1', 'points', 1)
                               || CASE WHEN $4 > 0 THEN jsonb_build_object('padding', repeat('x', $4))
                                       ELSE '{}' END) AS envelope
               FROM (SELECT gen_random_uuid() AS j FROM generate_series(1, $2)) AS jobs) AS letters
         RETURNING id",
    )
    .bind(queue)
    .bind(n)
    .bind(reviewed_at)
    .bind(padding)
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

async fn outcomes(pool: &PgPool, ids: &[Uuid]) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT replay_outcome, count(*) FROM core.dead_letters WHERE id = ANY ($1)
         GROUP BY replay_outcome ORDER BY replay_outcome",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Issue 22, item 3: 500 replays queued for a queue that no longer exists (a decommissioned
/// consumer's) used to be retried first on every run, so a replay queued after them was never
/// sent. A queue that refuses itself is asked once per run: the replay tried backs off on its
/// own (its attempts, its last error, its next attempt recorded), the queue's others are left
/// as they are (not tried, so not recorded), and the run goes on past them, however many: a
/// replay to another queue is sent by the same run.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_that_cannot_be_sent_backs_off_and_does_not_block_the_others(pool: PgPool) {
    let sqs = e2e::event_source::sqs_client().await;
    let live = e2e::event_source::create_queue(&sqs, &unique("live"), &[]).await;
    let gone = unique("gone"); // never created
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let stuck = queued_replays(&pool, &gone, 600, t0() - Span::minutes(30)).await; // > a run's 500
    let waiting = queued_replays(&pool, &live.name, 1, t0() - Span::minutes(10)).await;
    let mut run = scheduled(&pool, &receiver, clock.clone());
    run.replayer = Some(Replayer::new(sqs.clone()));
    // (replays tried, their attempts in all, and those with an error but no attempt) of `stuck`.
    let tried = || async {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT count(*) FILTER (WHERE attempts > 0), coalesce(sum(attempts), 0)::bigint,
                    count(*) FILTER (WHERE attempts = 0
                                     AND (last_error IS NOT NULL OR next_attempt_at <> queued_at))
             FROM core.replay_sends WHERE letter_id = ANY ($1)",
        )
        .bind(&stuck)
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    let first = run.run(None).await.replays.unwrap();
    assert_eq!(
        (first.sent, first.failed),
        (1, 1),
        "one call to the dead queue, and the replay behind its 600 is sent: {first:?}"
    );
    assert_eq!(e2e::event_source::depth(&sqs, &live).await, 1);
    assert_eq!(outcomes(&pool, &waiting).await, [("sent".into(), 1)]);
    assert_eq!(outcomes(&pool, &stuck).await, [("queued".into(), 600)]);
    assert_eq!(
        tried().await,
        (1, 1, 0),
        "the 599 not tried are left as they were"
    );
    assert!(
        shared::replay::sends::send_state(&pool, DeadLetterId(waiting[0]))
            .await
            .unwrap()
            .is_none(),
        "a sent replay has no send state"
    );

    // The one refused carries its own state: one attempt, the error, its next attempt a minute
    // after the refusal. The queue's others, due before it, are tried first, one per run.
    let refused = sqlx::query_as::<_, (Uuid,)>(
        "SELECT letter_id FROM core.replay_sends WHERE attempts > 0 AND letter_id = ANY ($1)",
    )
    .bind(&stuck)
    .fetch_one(&pool)
    .await
    .unwrap()
    .0;
    let state = |id: Uuid| shared::replay::sends::send_state(&pool, DeadLetterId(id));
    let one = state(refused).await.unwrap().unwrap();
    assert_eq!(
        (one.attempts, one.next_attempt_at),
        (1, t0() + Span::minutes(1))
    );
    let error = one.last_error.clone().unwrap();
    assert!(error.contains(&gone), "{error}");
    clock.advance(Span::seconds(61)); // it is due again, behind the 599 due since t0 - 30 min
    let second = run.run(None).await.replays.unwrap();
    assert_eq!((second.sent, second.failed), (0, 1), "{second:?}");
    assert_eq!(tried().await, (2, 2, 0), "another one of the 600, once");
    assert_eq!(
        state(refused).await.unwrap().unwrap(),
        one,
        "not tried again yet"
    );
}

/// Issue 25: an edited replay the queue refused at first is sent by the scheduled run with its
/// edited body, never the body its letter received.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_queued_edited_replay_is_sent_with_its_edited_body(pool: PgPool) {
    let sqs = e2e::event_source::sqs_client().await;
    let live = e2e::event_source::create_queue(&sqs, &unique("edited"), &[]).await;
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let job = JobId(Uuid::new_v4());
    let received = json!({"job_id": job, "tenant_id": Uuid::new_v4(),
        "payload": {"account_id": "acct-1", "points": "one"}});
    let edited = json!({"job_id": job, "tenant_id": received["tenant_id"],
        "payload": {"account_id": "acct-1", "points": 1}});
    let letter = TestLetter {
        kind: ErrorKind::Poison,
        ..TestLetter::new(
            Some(job),
            &e2e::consumer_name(),
            &live.name,
            &received.to_string(),
        )
    };
    let id = record_letter(&pool, &letter, t0() - Span::hours(1)).await;
    let mut locked = lock_letter(&pool, id, Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    let verdict = Verdict::Replayed {
        outcome: shared::dead_letter::ReplayOutcome::Queued,
        reason: Some("points as words".into()),
        body: Some(edited.to_string()),
    };
    locked
        .mark(&verdict, "ops-1", t0() - Span::minutes(10))
        .await
        .unwrap();
    locked.commit().await.unwrap();
    let mut run = scheduled(&pool, &receiver, clock);
    run.replayer = Some(Replayer::new(sqs.clone()));
    let replays = run.run(None).await.replays.unwrap();
    assert_eq!((replays.sent, replays.failed), (1, 0), "{replays:?}");
    let got = sqs
        .receive_message()
        .queue_url(&live.url)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    let bodies: Vec<serde_json::Value> = got
        .messages()
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect();
    assert_eq!(bodies, [edited], "the edit is what is sent");
}

/// SQS's former message size limit, which queues created before it rose to 1 MiB keep (moto
/// enforces a queue's `MaximumMessageSize`).
const OLD_SIZE_LIMIT: i32 = 262_144;

/// Issue 22, item 3, review: a replay its queue refuses for its own message (here a body over
/// the queue's size limit; on AWS also a body near it plus the `replay_of` attribute) was taken
/// for a refusal by the queue. The run then tried none of the queue's other due replays and
/// recorded each as refused, with one more attempt and a later next attempt than it, so it came
/// first on every run and those queued with it were never sent. Now only it is refused and backs
/// off; the others of its queue are sent in the same run.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_refused_for_its_own_message_does_not_hold_back_the_others_of_its_queue(
    pool: PgPool,
) {
    let sqs = e2e::event_source::sqs_client().await;
    let limit = (
        QueueAttributeName::MaximumMessageSize,
        OLD_SIZE_LIMIT.to_string(),
    );
    let queue = e2e::event_source::create_queue(&sqs, &unique("limited"), &[limit]).await;
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let big = queued_replays_padded(
        &pool,
        &queue.name,
        1,
        t0() - Span::minutes(30),
        OLD_SIZE_LIMIT,
    )
    .await;
    let others = queued_replays(&pool, &queue.name, 2, t0() - Span::minutes(10)).await;
    let mut run = scheduled(&pool, &receiver, clock.clone());
    run.replayer = Some(Replayer::new(sqs.clone()));

    let first = run.run(None).await.replays.unwrap();
    assert_eq!(
        (first.sent, first.failed),
        (2, 1),
        "the big one is refused, the two behind it are sent: {first:?}"
    );
    assert_eq!(e2e::event_source::depth(&sqs, &queue).await, 2);
    assert_eq!(outcomes(&pool, &others).await, [("sent".into(), 2)]);
    assert_eq!(outcomes(&pool, &big).await, [("queued".into(), 1)]);
    let state = |id: Uuid| shared::replay::sends::send_state(&pool, DeadLetterId(id));
    let refused = state(big[0]).await.unwrap().expect("still queued");
    assert_eq!(
        (refused.attempts, refused.next_attempt_at),
        (1, t0() + Span::minutes(1))
    );
    let error = refused.last_error.unwrap();
    assert!(error.contains("InvalidParameterValue"), "{error}");

    // It keeps being refused, on its own backoff; nothing else is tried or recorded.
    let later = queued_replays(&pool, &queue.name, 1, t0()).await;
    clock.advance(Span::seconds(61));
    let second = run.run(None).await.replays.unwrap();
    assert_eq!((second.sent, second.failed), (1, 1), "{second:?}");
    assert_eq!(outcomes(&pool, &later).await, [("sent".into(), 1)]);
    let refused = state(big[0]).await.unwrap().unwrap();
    assert_eq!(
        (refused.attempts, refused.next_attempt_at),
        (2, clock.now() + Span::minutes(2))
    );
}

/// Issue 22, item 3: a replay its queue keeps refusing used to wait in silence (its letter left
/// `pending_review`, so its group resolved). Past `REPLAY_UNSENT_ALERT_SECONDS` it is a metric
/// the template's alarm watches and a BetterStack incident for its queue, and the run reports
/// failure to the heartbeat; once it is sent, the incident is resolved.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_unsent_past_its_bound_alerts(pool: PgPool) {
    let sqs = e2e::event_source::sqs_client().await;
    let queue = unique("refusing");
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let ids = queued_replays(&pool, &queue, 2, t0() - Span::hours(2)).await;
    let mut run = scheduled(&pool, &receiver, clock.clone());
    run.replayer = Some(Replayer::new(sqs.clone()));
    run.heartbeat = Some(Heartbeat::new(format!("{}/heartbeat", receiver.url)));
    let heartbeats = || -> Vec<String> {
        receiver
            .received()
            .into_iter()
            .filter(|r| r.path.starts_with("/heartbeat"))
            .map(|r| r.path)
            .collect()
    };

    let refused = run.run(None).await;
    assert_eq!(
        refused.replays.clone().unwrap().failed,
        1,
        "one tried; the queue refused itself, so the other is left for the next run: {refused:?}"
    );
    let emf = refused.emf("JobHarness", clock.now());
    assert_eq!(emf["QueuedReplaysOverdue"], 2, "{emf}");
    assert_eq!(emf["OldestQueuedReplaySeconds"], 7200, "{emf}");
    let incidents: Vec<_> = receiver
        .incidents()
        .into_iter()
        .filter(|r| {
            r.body["name"]
                .as_str()
                .unwrap()
                .starts_with("Replays not sent")
        })
        .collect();
    assert_eq!(incidents.len(), 1, "{:?}", receiver.received());
    assert_eq!(
        incidents[0].body["name"],
        format!("Replays not sent: {queue}")
    );
    let summary = incidents[0].body["summary"].as_str().unwrap();
    assert!(summary.starts_with("2 replay(s) to "), "{summary}");
    assert_eq!(heartbeats(), ["/heartbeat/fail"], "sends are failing");

    clock.advance(Span::minutes(10)); // still refused: no second incident
    run.run(None).await;
    assert_eq!(
        receiver
            .incidents()
            .iter()
            .filter(|r| r.body["name"]
                .as_str()
                .unwrap()
                .starts_with("Replays not sent"))
            .count(),
        1
    );

    // The queue is back: the replays go once their backoff is over, and the incident resolves.
    let back = e2e::event_source::create_queue(&sqs, &queue, &[]).await;
    clock.advance(Span::hours(2));
    let sent = run.run(None).await;
    assert_eq!(sent.replays.clone().unwrap().sent, 2, "{sent:?}");
    assert_eq!(e2e::event_source::depth(&sqs, &back).await, 2);
    assert_eq!(outcomes(&pool, &ids).await, [("sent".into(), 2)]);
    let emf = sent.emf("JobHarness", clock.now());
    assert_eq!(emf["QueuedReplaysOverdue"], 0);
    assert_eq!(receiver.resolutions().len(), 1, "{:?}", receiver.received());
    assert_eq!(heartbeats().last().unwrap(), "/heartbeat");
}

/// Issue 22, item 7: the replay step ran before the sweep, alerts and escalation with no bound
/// of its own, so during an SQS outage (every call timing out after 3 s) a run could pass its
/// Lambda timeout without sweeping. The real binary, its SQS endpoint a server that never
/// answers: the replay step stops within its share of the invocation, and the sweep runs.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_scheduled_run_keeps_time_for_the_sweep_during_an_sqs_outage(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    // An SQS endpoint that accepts connections and never answers.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", black_hole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = black_hole.accept().await {
            open.push(stream);
        }
    });
    let queues = 20;
    for _ in 0..queues {
        queued_replays(&pool, &unique("outage"), 1, Utc::now() - Span::minutes(10)).await;
    }
    seed_expired_fences(&pool).await;
    // 20 sends of 3 s each would take 60 s.
    let sqs = [("AWS_ENDPOINT_URL_SQS", endpoint.as_str())];
    let host = scheduled_host(&connect, &sqs, Duration::from_secs(40));
    let response = host
        .invoke(&scheduled_event())
        .await
        .expect("the run ends before its timeout");
    assert_eq!(response["sweep"]["deleted"], 2500, "{response}");
    assert_eq!(response["sweep"]["stop"], "Done", "{response}");
    let failed = response["replays"]["failed"].as_u64().unwrap();
    assert!(
        (1..queues).contains(&failed),
        "some sends tried, the rest left for the next run: {response}"
    );
    held.abort();
}

/// Issue 22, item 7: a group's incident resolved by hand in BetterStack while its letters are
/// still pending used to silence the group until its escalation (days). The scheduled run reads
/// the incidents of open groups; one resolved by hand is raised again, as a new incident that
/// says why, and it is that one the harness resolves when the group is reviewed.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_incident_resolved_by_hand_while_letters_are_pending_is_raised_again(pool: PgPool) {
    let receiver = AlertReceiver::start().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let pending = letter(&pool, "jobs-a", ErrorKind::Exhausted, t0() - Span::hours(1)).await;
    let run = scheduled(&pool, &receiver, clock.clone());
    assert_eq!(run.run(None).await.alerts.opened, 1);
    let first = receiver.incidents()[0].clone();
    let first_id = "1"; // the receiver's first answer
    assert_eq!(
        first.body["name"],
        "Dead letters: award-points / exhausted on jobs-a"
    );

    receiver.resolve_by_hand(first_id);
    clock.advance(Span::minutes(10));
    run.run(None).await;
    let incidents = receiver.incidents();
    assert_eq!(
        incidents.len(),
        2,
        "raised again: {:?}",
        receiver.received()
    );
    assert_eq!(incidents[1].body["name"], first.body["name"]);
    let description = incidents[1].body["description"].as_str().unwrap();
    assert!(
        description.contains(&format!("incident {first_id} was resolved in BetterStack")),
        "{description}"
    );

    clock.advance(Span::minutes(10));
    run.run(None).await;
    assert_eq!(
        receiver.incidents().len(),
        2,
        "the new one is open: raised once"
    );

    let mut locked = lock_letter(&pool, pending, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let verdict = Verdict::Discarded {
        reason: "the partner fixed it".into(),
    };
    locked.mark(&verdict, "ops-1", clock.now()).await.unwrap();
    locked.commit().await.unwrap();
    clock.advance(Span::minutes(1));
    run.run(None).await;
    let resolutions = receiver.resolutions();
    assert_eq!(resolutions.len(), 1, "{:?}", receiver.received());
    assert_ne!(
        resolutions[0].path,
        format!("/api/v3/incidents/{first_id}/resolve"),
        "the open incident is resolved, not the one resolved by hand"
    );
}
