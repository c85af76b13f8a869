//! The test kit (crate `shared-testkit`, a dev-dependency): run jobs through the real harness
//! against a real, migrated PostgreSQL database, and look at what they left. Consumer authors'
//! tests, `shared`'s own and the e2e crate's all stand on it: one clock start, one seed, one set
//! of settings, one way to build an envelope, a message or a batch, one way to look up a fence,
//! a job's letters or its executions.
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
//! harness an SQS batch with [`TestKit::deliver_batch`]. Tests that drive the harness message by
//! message build one with [`harness`] or [`harness_with`] and feed it [`message`]s of [`job`]s.
//!
//! Invariant: nothing here goes around the harness. A delivery is [`Harness::process`] (or
//! [`Harness::process_batch`]) on an [`IncomingMessage`] as the SQS path builds it; time is a
//! [`ManualClock`] starting at [`t0`], the backoff's RNG is seeded with [`SEED`], so every run is
//! the same.
#![warn(missing_docs)]

pub mod commit_cutter;
mod consumers;
mod cut;
mod lookups;
mod messages;
pub mod reference;
mod setup;
pub mod sweeps;

pub use consumers::{Counting, Fault, OnTx};
pub use cut::cut_after_polls;
pub use lookups::{
    charge_executions, executions, fence_committed, hold_fence, letters, queue_replay,
    record_letter, table_counts,
};
pub use messages::{
    QUEUE, TENANT, TestLetter, batch, envelope, in_group, job, message, message_on, with_payload,
};
pub use setup::{
    CONCURRENCY, FENCE_TTL, LOCK_TIMEOUT, SEED, SWEEP, harness, harness_in, harness_on,
    harness_with, own_pool, run_batch, run_batch_at, settings, t0,
};

use chrono::{DateTime, Utc};
use serde_json::Value;
use shared::clock::ManualClock;
use shared::consumer::Consumer;
use shared::dead_letter::DeadLetter;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::retry::RetryPolicy;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use uuid::Uuid;

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
    /// When the kit's clock starts: [`t0`].
    pub fn start() -> DateTime<Utc> {
        t0()
    }

    /// `consumer` on `pool` with the platform's retry policy.
    pub fn new(pool: PgPool, consumer: C) -> Self {
        Self::with_settings(pool, consumer, settings())
    }

    /// `consumer` on `pool` with `policy` (a queue's own, as its template sets it).
    pub fn with_policy(pool: PgPool, consumer: C, policy: RetryPolicy) -> Self {
        Self::with_settings(
            pool,
            consumer,
            HarnessSettings {
                policy,
                ..settings()
            },
        )
    }

    /// `consumer` on `pool` in batch mode (`COMMIT_MODE=batch`): [`TestKit::deliver_batch`]
    /// runs a batch's new jobs through [`Consumer::handle_batch`] on one transaction.
    pub fn in_batch_mode(pool: PgPool, consumer: C) -> Self {
        let commit = CommitMode::Batch;
        Self::with_settings(
            pool,
            consumer,
            HarnessSettings {
                commit,
                ..settings()
            },
        )
    }

    /// `consumer` on `pool` with `settings` (start from [`settings`]).
    pub fn with_settings(pool: PgPool, consumer: C, settings: HarnessSettings) -> Self {
        let (harness, clock) = harness_with(&pool, consumer, settings);
        Self {
            harness,
            clock,
            pool,
        }
    }

    /// A new job carrying `payload` in a well-formed envelope (of a tenant of its own).
    pub fn job(&self, payload: Value) -> TestJob {
        let job_id = JobId(Uuid::new_v4());
        let tenant_id = TenantId(Uuid::new_v4());
        let body = envelope(job_id, tenant_id, &format!("testkit-{job_id}"), payload);
        Self::job_with_body(job_id, tenant_id, body)
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
        self.harness.process(&self.next_delivery(job)).await
    }

    /// The next delivery of each job's message, together as one SQS batch (up to 10), as the
    /// Lambda hands it over: the outcomes in the batch's order.
    pub async fn deliver_batch(&self, jobs: &[&TestJob]) -> Vec<RecordOutcome> {
        let batch: Vec<IncomingMessage> = jobs.iter().map(|job| self.next_delivery(job)).collect();
        run_batch(&self.harness, &batch).await
    }

    /// Another message carrying the same job (a duplicate send, or a replay).
    pub async fn deliver_copy(&self, job: &TestJob) -> RecordOutcome {
        self.harness.process(&message(&job.body, 1)).await
    }

    fn next_delivery(&self, job: &TestJob) -> IncomingMessage {
        let receive_count = job.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        IncomingMessage {
            message_id: job.message_id.clone(),
            ..message(&job.body, receive_count)
        }
    }

    /// Whether the job's fence has committed (its effect has).
    pub async fn is_processed(&self, job: &TestJob) -> bool {
        fence_committed(&self.pool, job.job_id, self.harness.consumer().name()).await
    }

    /// The job's dead letters, oldest first.
    pub async fn letters(&self, job: &TestJob) -> Vec<DeadLetter> {
        letters(&self.pool, job.job_id, self.harness.consumer().name()).await
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
