//! Helpers shared by the database tests: envelopes, messages, a harness with test settings,
//! and consumers that fail in controlled ways around the reference consumer's real effect.
#![allow(dead_code)]

use chrono::{DateTime, TimeZone, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use shared::clock::{Clock, ManualClock};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::harness::{Harness, HarnessSettings, IncomingMessage};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::reference::{AwardPoints, PointsAward};
use shared::retry::RetryPolicy;
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use uuid::Uuid;

pub const QUEUE: &str = "points-award-jobs";

pub fn consumer_name() -> ConsumerName {
    ConsumerName::new("award-points").unwrap()
}

pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

pub fn settings(policy: RetryPolicy) -> HarnessSettings {
    HarnessSettings {
        policy,
        fence_ttl: Duration::from_secs(7 * 86_400),
        lock_timeout: Duration::from_secs(10),
        contended_retry_after: Duration::from_secs(2),
    }
}

pub fn harness_with<C: Consumer>(
    pool: &PgPool,
    consumer: C,
    settings: HarnessSettings,
) -> (Harness<C>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    (
        Harness::new(
            consumer,
            pool.clone(),
            settings,
            dyn_clock,
            StdRng::seed_from_u64(42),
        ),
        clock,
    )
}

pub fn harness<C: Consumer>(pool: &PgPool, consumer: C) -> Harness<C> {
    harness_with(pool, consumer, settings(RetryPolicy::default())).0
}

pub fn award_points() -> AwardPoints {
    AwardPoints::new(consumer_name())
}

/// A new job's id and the body of its envelope.
pub fn job(payload: Value) -> (JobId, String) {
    let job_id = JobId(Uuid::new_v4());
    let body = json!({
        "job_id": job_id,
        "tenant_id": TenantId(Uuid::from_u128(7)),
        "correlation_id": format!("corr-{job_id}"),
        "payload": payload,
    });
    (job_id, body.to_string())
}

pub fn award(points: i64) -> Value {
    json!({"account_id": "acct-1", "points": points})
}

pub fn message(body: &str, receive_count: u32) -> IncomingMessage {
    IncomingMessage {
        message_id: Uuid::new_v4().to_string(),
        queue: QUEUE.into(),
        body: body.into(),
        receive_count,
        replay_of: None,
    }
}

/// The reference consumer, counting how often its handler was entered.
pub struct Counting {
    pub inner: AwardPoints,
    pub calls: AtomicUsize,
}

impl Counting {
    pub fn new() -> Self {
        Self {
            inner: award_points(),
            calls: AtomicUsize::new(0),
        }
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Consumer for Counting {
    type Payload = PointsAward;
    fn name(&self) -> &ConsumerName {
        self.inner.name()
    }
    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.handle(job, tx).await
    }
}

/// Row counts of every table in every user schema, keyed `schema.table`.
pub async fn table_counts(pool: &PgPool) -> std::collections::BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT table_schema || '.' || table_name,
                (xpath('/row/c/text()', query_to_xml(
                    format('SELECT count(*) AS c FROM %I.%I', table_schema, table_name), false, true, '')))[1]::text::bigint
         FROM information_schema.tables
         WHERE table_type = 'BASE TABLE'
           AND table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}
