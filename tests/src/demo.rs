//! The local demo: a sample workload through the real harness and the reference consumer on
//! local PostgreSQL, with redeliveries scheduled as SQS would (after the policy's delay, with
//! the receive count raised). Issue 3 replaces the in-memory redelivery with a local SQS API.

use rand::SeedableRng;
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::dead_letter::ErrorKind;
use shared::harness::{Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::ConsumerName;
use shared::metrics::Metric;
use shared::reference::AwardPoints;
use shared::retry::RetryPolicy;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// The queue name the demo uses.
pub const QUEUE: &str = "points-award-jobs";

/// One message of the workload, with what it is meant to show.
struct Sample {
    label: &'static str,
    body: String,
}

fn envelope(payload: Value) -> (Uuid, String) {
    let job_id = Uuid::new_v4();
    let body = json!({"job_id": job_id, "tenant_id": Uuid::from_u128(1), "correlation_id": format!("demo-{job_id}"), "payload": payload});
    (job_id, body.to_string())
}

fn workload() -> Vec<Sample> {
    let mut samples = Vec::new();
    for i in 1..=5 {
        let (_, body) = envelope(json!({"account_id": format!("acct-{i}"), "points": 10 * i}));
        samples.push(Sample {
            label: "normal",
            body,
        });
    }
    let duplicate = samples[0].body.clone();
    samples.push(Sample {
        label: "duplicate of normal #1",
        body: duplicate,
    });
    let faults = [
        (
            "fails twice, then succeeds",
            json!({"transient_until_attempt": 3}),
        ),
        ("always fails transiently", json!("always_transient")),
        ("fails permanently", json!("permanent")),
    ];
    for (label, fault) in faults {
        let (_, body) = envelope(json!({"account_id": "acct-x", "points": 1, "demo_fault": fault}));
        samples.push(Sample { label, body });
    }
    samples.push(Sample {
        label: "poison: not JSON",
        body: "this is not an envelope".into(),
    });
    let (_, bad) = envelope(json!({"account_id": "acct-y", "points": "lots"}));
    samples.push(Sample {
        label: "poison: payload fails its schema",
        body: bad,
    });
    samples
}

/// What the demo counted, by metric name.
pub type Summary = BTreeMap<&'static str, u64>;

/// The counts the workload must produce.
pub fn expected() -> Summary {
    BTreeMap::from([
        ("Processed", 6),
        ("DuplicateSkipped", 1),
        ("Retried", 2 + 4),
        ("DeadLetteredExhausted", 1),
        ("DeadLetteredPermanent", 1),
        ("DeadLetteredPoison", 2),
    ])
}

/// Runs the workload against `pool` (already migrated) and prints what happens; returns counts.
pub async fn run(pool: PgPool, consumer: ConsumerName) -> Summary {
    // Time-scaled so the demo takes seconds: the same shape as the platform default, base 1 s.
    let policy =
        RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(60)).expect("demo policy");
    let settings = HarnessSettings {
        policy,
        fence_ttl: Duration::from_secs(7 * 86_400),
        lock_timeout: Duration::from_secs(2),
        contended_retry_after: Duration::from_secs(1),
    };
    let harness = Harness::new(
        AwardPoints::new(consumer),
        pool,
        settings,
        Arc::new(SystemClock),
        rand::rngs::StdRng::from_rng(&mut rand::rng()),
    );
    let start = Instant::now();
    let mut queue: Vec<(Instant, &'static str, IncomingMessage)> = workload()
        .into_iter()
        .map(|s| {
            let msg = IncomingMessage {
                message_id: Uuid::new_v4().to_string(),
                queue: QUEUE.into(),
                body: s.body,
                receive_count: 1,
                replay_of: None,
            };
            (start, s.label, msg)
        })
        .collect();
    println!("published {} messages to {QUEUE}", queue.len());
    while !queue.is_empty() {
        queue.sort_by_key(|(due, ..)| *due);
        let (due, label, msg) = queue.remove(0);
        if due > Instant::now() + Duration::from_millis(50) {
            println!(
                "  … waiting {:.1} s for {} message(s) in backoff",
                (due - Instant::now()).as_secs_f64(),
                queue.len() + 1
            );
            tokio::time::sleep_until(due).await;
        }
        let outcome = harness.process(&msg).await;
        let t = start.elapsed().as_secs_f64();
        match &outcome {
            RecordOutcome::Processed => println!(
                "[{t:5.1}s] {label:<34} attempt {} → processed",
                msg.receive_count
            ),
            RecordOutcome::Duplicate => println!("[{t:5.1}s] {label:<34} → duplicate, skipped"),
            RecordOutcome::DeadLettered {
                kind,
                letter,
                error,
            } => {
                println!(
                    "[{t:5.1}s] {label:<34} attempt {} → dead letter {} ({kind}): {error}",
                    msg.receive_count,
                    letter.id()
                )
            }
            RecordOutcome::Retry { after, error, .. } => {
                println!(
                    "[{t:5.1}s] {label:<34} attempt {} → retry in {:.1} s: {error}",
                    msg.receive_count,
                    after.as_secs_f64()
                )
            }
            other => println!(
                "[{t:5.1}s] {label:<34} attempt {} → {other:?}",
                msg.receive_count
            ),
        }
        if let Some(after) = outcome.redeliver_after() {
            let next = IncomingMessage {
                receive_count: msg.receive_count + 1,
                ..msg
            };
            queue.push((Instant::now() + after, label, next));
        }
    }
    let m = harness.metrics();
    let mut summary = Summary::new();
    for metric in [
        Metric::Processed,
        Metric::DuplicateSkipped,
        Metric::Retried,
        Metric::FenceContended,
        Metric::DeadLetterWriteFailed,
    ]
    .into_iter()
    .chain(ErrorKind::ALL.map(Metric::DeadLettered))
    {
        let n = m.get(metric);
        if n > 0 || expected().contains_key(metric.name()) {
            summary.insert(metric.name(), n);
        }
    }
    summary
}
