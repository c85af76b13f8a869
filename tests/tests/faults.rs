//! Faults as named tests, each against the real thing: a database that is not there, a session
//! that dies between the work and the commit, and an SQS API that refuses
//! `ChangeMessageVisibility`. In each, nothing is acknowledged that is not done, nothing is
//! applied twice, and the message comes back and is processed once.
//! (The Lambda deadline mid-batch: `sqs_path.rs`; an alert storm: `alerting.rs`.)

use aws_lambda_events::event::sqs::SqsMessage;
use consumer::{AwardPoints, PointsAward, count_awards};
use e2e::event_source::{Queue, create_queue, depth, sqs_client};
use serde_json::json;
use shared::config::DatabaseConfig;
use shared::consumer::Consumer;
use shared::harness::RecordOutcome;
use shared::ids::{JobId, TenantId};
use shared::sqs::{BatchSettings, SqsVisibility, process_batch};
use shared_testkit::{Counting, envelope};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

fn job() -> (JobId, String) {
    let (job_id, tenant_id) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let payload = json!({"account_id": "a", "points": 2});
    (job_id, envelope(job_id, tenant_id, "fault", payload))
}

async fn queue() -> (aws_sdk_sqs::Client, Queue) {
    let sqs = sqs_client().await;
    let name = format!("fault-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let queue = create_queue(
        &sqs,
        &name,
        &[(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "2".into(),
        )],
    )
    .await;
    (sqs, queue)
}

/// Receives up to 10 messages as Lambda's event source would hand them over.
async fn receive(sqs: &aws_sdk_sqs::Client, queue: &Queue) -> Vec<SqsMessage> {
    let out = sqs
        .receive_message()
        .queue_url(&queue.url)
        .max_number_of_messages(10)
        .wait_time_seconds(5)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
        .send()
        .await
        .expect("ReceiveMessage");
    out.messages
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            let mut record = SqsMessage::default();
            record.message_id = m.message_id;
            record.receipt_handle = m.receipt_handle;
            record.body = m.body;
            record.event_source_arn = Some(queue.arn.clone());
            record.attributes = m
                .attributes
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.as_str().to_owned(), v))
                .collect();
            record
        })
        .collect()
}

/// Deletes the records the batch response did not report, as the event source does.
async fn ack(sqs: &aws_sdk_sqs::Client, queue: &Queue, records: &[SqsMessage], failed: &[String]) {
    for r in records {
        if !failed.contains(r.message_id.as_ref().unwrap()) {
            sqs.delete_message()
                .queue_url(&queue.url)
                .receipt_handle(r.receipt_handle.clone().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
}

fn settings() -> BatchSettings {
    BatchSettings {
        concurrency: 4,
        deadline_margin: Duration::from_secs(1),
    }
}

fn far_deadline() -> Option<chrono::DateTime<chrono::Utc>> {
    Some(chrono::Utc::now() + chrono::Duration::minutes(5))
}

async fn failed_ids(
    harness: &shared::harness::Harness<impl Consumer>,
    visibility: &SqsVisibility,
    records: Vec<SqsMessage>,
) -> Vec<String> {
    process_batch(harness, visibility, records, far_deadline(), settings())
        .await
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_the_database_unreachable_nothing_is_acked_and_nothing_lost(pool: PgPool) {
    let (sqs, queue) = queue().await;
    let jobs: Vec<_> = (0..3).map(|_| job()).collect();
    for (_, body) in &jobs {
        sqs.send_message()
            .queue_url(&queue.url)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    // A pool aimed at a port where no database listens, as during an outage.
    let mut down = DatabaseConfig::for_url("postgres://postgres@127.0.0.1:1/nowhere", 2);
    down.acquire_timeout = Duration::from_millis(500);
    let down = down.lazy_pool().unwrap();
    let visibility = SqsVisibility(sqs.clone());
    let outage = e2e::harness(down, AwardPoints::new(e2e::consumer_name()));
    let records = receive(&sqs, &queue).await;
    assert_eq!(records.len(), 3);
    let failed = failed_ids(&outage, &visibility, records.clone()).await;
    assert_eq!(failed.len(), 3, "every record reported: nothing acked");
    ack(&sqs, &queue, &records, &failed).await;
    assert_eq!(depth(&sqs, &queue).await, 3, "all three still on the queue");

    let healthy = e2e::harness(pool.clone(), AwardPoints::new(e2e::consumer_name()));
    let mut seen = 0;
    for _ in 0..10 {
        if seen == 3 {
            break;
        }
        let records = receive(&sqs, &queue).await;
        seen += records.len();
        let failed = failed_ids(&healthy, &visibility, records.clone()).await;
        assert!(failed.is_empty(), "{failed:?}");
        ack(&sqs, &queue, &records, &failed).await;
    }
    assert_eq!(seen, 3, "every message came back");
    for (job_id, _) in &jobs {
        assert_eq!(
            count_awards(&pool, *job_id).await.unwrap(),
            1,
            "processed once after the outage"
        );
    }
    assert_eq!(depth(&sqs, &queue).await, 0);
}

/// Writes the real award, then has the database end its session (as a failover or a restart
/// does, `admin` asking it to) before the harness can commit.
fn session_dies_after_work(admin: PgPool) -> impl Consumer<Payload = PointsAward> {
    Counting::then(AwardPoints::new(e2e::consumer_name()), move |tx| {
        let admin = admin.clone();
        Box::pin(async move {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_terminate_backend($1, 5000)")
                .bind(pid)
                .execute(&admin)
                .await?;
            Ok(())
        })
    })
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_database_gone_between_work_and_commit_leaves_neither_and_retries(pool: PgPool) {
    let (job_id, body) = job();
    let dying = e2e::harness(pool.clone(), session_dies_after_work(pool.clone()));
    let msg = shared::harness::IncomingMessage {
        message_id: "m-1".into(),
        ..shared_testkit::message_on("jobs", &body, 1)
    };
    let outcome = dying.process(&msg).await;
    assert!(
        matches!(outcome, RecordOutcome::Retry { attempt: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0, "no effect");
    assert!(!e2e::fenced(&pool, job_id).await, "no fence");

    let healthy = e2e::harness(pool.clone(), AwardPoints::new(e2e::consumer_name()));
    let redelivery = shared::harness::IncomingMessage {
        receive_count: 2,
        ..msg
    };
    assert_eq!(healthy.process(&redelivery).await, RecordOutcome::Processed);
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_refused_change_message_visibility_still_brings_the_message_back(pool: PgPool) {
    let (sqs, queue) = queue().await;
    let job_id = JobId(Uuid::new_v4());
    let body = json!({"job_id": job_id, "tenant_id": Uuid::new_v4(), "correlation_id": "fault",
        "payload": {"account_id": "a", "points": 2, "demo_fault": {"transient_until_attempt": 2}}});
    sqs.send_message()
        .queue_url(&queue.url)
        .message_body(body.to_string())
        .send()
        .await
        .unwrap();
    // An SQS API that is not there: ChangeMessageVisibility fails with a real SDK error.
    let broken = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&aws_config::load_from_env().await)
            .endpoint_url("http://127.0.0.1:1")
            .build(),
    );
    let harness = e2e::harness(
        pool.clone(),
        e2e::faulty_award::AwardPointsWithFaults::new(e2e::consumer_name()),
    );
    let records = receive(&sqs, &queue).await;
    let failed = failed_ids(&harness, &SqsVisibility(broken), records.clone()).await;
    assert_eq!(
        failed.len(),
        1,
        "reported for redelivery despite the failed call"
    );
    ack(&sqs, &queue, &records, &failed).await;

    // Back after the queue's visibility timeout (2 s) instead of the backoff, and done once.
    let again = receive(&sqs, &queue).await;
    assert_eq!(again.len(), 1, "the message came back");
    assert_eq!(shared::sqs::receive_count(&again[0]), 2);
    let failed = failed_ids(&harness, &SqsVisibility(sqs.clone()), again.clone()).await;
    assert!(failed.is_empty(), "{failed:?}");
    ack(&sqs, &queue, &again, &failed).await;
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}
