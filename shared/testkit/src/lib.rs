//! The test kit for consumer authors (crate `shared-testkit`, a dev-dependency): run jobs
//! through the real harness against a real, migrated PostgreSQL database, and look at what they
//! left.
//!
//! ```ignore
//! #[sqlx::test(migrator = "my_consumer::MIGRATOR_WITH_CORE")]
//! async fn applies_once(pool: PgPool) {
//!     let kit = TestKit::new(pool, MyConsumer::new(consumer_name("my-consumer")));
//!     let job = kit.job(json!({"account_id": "a", "points": 5}));
//!     assert_eq!(kit.deliver(&job).await, RecordOutcome::Processed);
//!     assert_eq!(kit.deliver_copy(&job).await, RecordOutcome::Duplicate);
//! }
//! ```
//!
//! A consumer in batch mode is tested the same way on [`TestKit::in_batch_mode`], handing the
//! harness an SQS batch with [`TestKit::deliver_batch`].
//!
//! Invariant: nothing here goes around the harness. A delivery is [`Harness::process`] on an
//! [`IncomingMessage`] as the SQS path builds it; time is a [`ManualClock`], the backoff's RNG
//! is seeded, so every run is the same.
#![warn(missing_docs)]

use chrono::{DateTime, TimeZone, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use shared::clock::{Clock, ManualClock};
use shared::consumer::Consumer;
use shared::dead_letter::{DeadLetter, letters_for_job};
use shared::fence::fence_exists;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::retry::RetryPolicy;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use uuid::Uuid;

/// The queue name the kit's messages come from.
pub const QUEUE: &str = "testkit-jobs";

/// `name` as a consumer name; panics if it is not a valid one.
pub fn consumer_name(name: &str) -> ConsumerName {
    ConsumerName::new(name).unwrap_or_else(|e| panic!("consumer name {name:?}: {e}"))
}

/// A consumer under test, with its harness, database and clock.
pub struct TestKit<C> {
    harness: Harness<C>,
    clock: Arc<ManualClock>,
    pool: PgPool,
}

/// A job the kit made: its envelope's body, and the message that carries it.
#[derive(Debug)]
pub struct TestJob {
    /// The job id (the fence key with the consumer name).
    pub job_id: JobId,
    /// The tenant.
    pub tenant_id: TenantId,
    /// The SQS body: the envelope as JSON.
    pub body: String,
    message_id: String,
    deliveries: AtomicU32,
}

impl<C: Consumer> TestKit<C> {
    /// When the kit's clock starts: 2026-01-01T00:00:00Z.
    pub fn start() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    /// `consumer` on `pool` with the platform's retry policy.
    pub fn new(pool: PgPool, consumer: C) -> Self {
        Self::with_policy(pool, consumer, RetryPolicy::default())
    }

    /// `consumer` on `pool` with `policy` (a queue's own, as its template sets it).
    pub fn with_policy(pool: PgPool, consumer: C, policy: RetryPolicy) -> Self {
        Self::build(pool, consumer, policy, CommitMode::PerJob)
    }

    /// `consumer` on `pool` in batch mode (`COMMIT_MODE=batch`): [`TestKit::deliver_batch`]
    /// runs a batch's new jobs through [`Consumer::handle_batch`] on one transaction.
    pub fn in_batch_mode(pool: PgPool, consumer: C) -> Self {
        Self::build(pool, consumer, RetryPolicy::default(), CommitMode::Batch)
    }

    fn build(pool: PgPool, consumer: C, policy: RetryPolicy, commit: CommitMode) -> Self {
        let clock = Arc::new(ManualClock::new(Self::start()));
        let settings = HarnessSettings {
            policy,
            fence_ttl: Duration::from_secs(7 * 86_400),
            lock_timeout: Duration::from_secs(2),
            contended_retry_after: Duration::from_secs(3),
            commit,
        };
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let harness = Harness::new(
            consumer,
            pool.clone(),
            settings,
            dyn_clock,
            StdRng::seed_from_u64(7),
        );
        Self {
            harness,
            clock,
            pool,
        }
    }

    /// A new job carrying `payload` in a well-formed envelope.
    pub fn job(&self, payload: Value) -> TestJob {
        let job_id = JobId(Uuid::new_v4());
        let tenant_id = TenantId(Uuid::new_v4());
        let body = json!({"job_id": job_id, "tenant_id": tenant_id,
            "correlation_id": format!("testkit-{job_id}"), "payload": payload});
        Self::job_with_body(job_id, tenant_id, body.to_string())
    }

    /// A message whose body is `body` as it is (for malformed messages).
    pub fn raw(&self, body: &str) -> TestJob {
        let ids = shared::envelope::read_ids(body);
        Self::job_with_body(
            ids.job_id.unwrap_or(JobId(Uuid::nil())),
            ids.tenant_id.unwrap_or(TenantId(Uuid::nil())),
            body.to_owned(),
        )
    }

    fn job_with_body(job_id: JobId, tenant_id: TenantId, body: String) -> TestJob {
        TestJob {
            job_id,
            tenant_id,
            body,
            message_id: Uuid::new_v4().to_string(),
            deliveries: AtomicU32::new(0),
        }
    }

    /// The next delivery of the job's message: the first, then redeliveries (as after a
    /// retry's backoff or a lost acknowledgement).
    pub async fn deliver(&self, job: &TestJob) -> RecordOutcome {
        let receive_count = job.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        self.harness
            .process(&self.message(&job.message_id, &job.body, receive_count))
            .await
    }

    /// The next delivery of each job's message, together as one SQS batch (up to 10), as the
    /// Lambda hands it over: the outcomes in the batch's order.
    pub async fn deliver_batch(&self, jobs: &[&TestJob]) -> Vec<RecordOutcome> {
        let batch: Vec<IncomingMessage> = jobs
            .iter()
            .map(|job| {
                let receive_count = job.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
                self.message(&job.message_id, &job.body, receive_count)
            })
            .collect();
        self.harness
            .process_batch(&batch, &|| true, batch.len().max(1))
            .await
            .into_iter()
            .map(|outcome| outcome.expect("every record starts: no deadline in the kit"))
            .collect()
    }

    /// Another message carrying the same job (a duplicate send, or a replay).
    pub async fn deliver_copy(&self, job: &TestJob) -> RecordOutcome {
        let message_id = Uuid::new_v4().to_string();
        self.harness
            .process(&self.message(&message_id, &job.body, 1))
            .await
    }

    fn message(&self, message_id: &str, body: &str, receive_count: u32) -> IncomingMessage {
        IncomingMessage {
            message_id: message_id.to_owned(),
            queue: QUEUE.into(),
            body: body.to_owned(),
            receive_count,
            replay_of: None,
        }
    }

    /// Whether the job's fence has committed (its effect has).
    pub async fn is_processed(&self, job: &TestJob) -> bool {
        fence_exists(&self.pool, job.job_id, self.harness.consumer().name())
            .await
            .expect("reading the fence")
    }

    /// The job's dead letters, oldest first.
    pub async fn letters(&self, job: &TestJob) -> Vec<DeadLetter> {
        letters_for_job(&self.pool, job.job_id, self.harness.consumer().name())
            .await
            .expect("reading the letters")
    }

    /// The harness under test (its metrics, its consumer).
    pub fn harness(&self) -> &Harness<C> {
        &self.harness
    }

    /// The clock: `kit.clock().advance(..)` moves the harness's time.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Sets `job_id`'s execution ledger for `consumer` as if `executions` had run, the last ending
/// with `last_error` (`None`: without an outcome, as a crash leaves it). For testing what a
/// consumer does on its last attempt, or past its budget, without running it that often.
pub async fn charge_executions(
    pool: &PgPool,
    job_id: JobId,
    consumer: &ConsumerName,
    executions: u32,
    last_error: Option<&str>,
) {
    sqlx::query(
        "INSERT INTO core.job_executions (job_id, consumer, executions, last_error, updated_at)
         VALUES ($1, $2, $3, $4, now())
         ON CONFLICT (job_id, consumer) DO UPDATE SET executions = $3, last_error = $4",
    )
    .bind(job_id.0)
    .bind(consumer.as_str())
    .bind(i32::try_from(executions).expect("executions fit an i32"))
    .bind(last_error)
    .execute(pool)
    .await
    .expect("charging executions");
}
