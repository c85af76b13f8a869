//! Helpers shared by the database tests: envelopes, messages, a harness with test settings,
//! and consumers that fail in controlled ways around the reference consumer's real effect.
#![allow(dead_code)]

use chrono::{DateTime, TimeZone, Utc};
use consumer::{AwardPoints, PointsAward};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use shared::clock::{Clock, ManualClock};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
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
        commit: Default::default(),
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

/// A harness that commits one transaction per job, or per batch.
pub fn harness_in<C: Consumer>(pool: &PgPool, consumer: C, mode: CommitMode) -> Harness<C> {
    let mut settings = settings(RetryPolicy::default());
    settings.commit = mode;
    harness_with(pool, consumer, settings).0
}

/// Delivers `msg` as the harness's mode would see it: alone per job; in batch mode, in an SQS
/// batch with a new job of its own (so the batch's transaction is the one that runs it), whose
/// outcome must be `Processed`. Returns `msg`'s outcome.
pub async fn deliver<C: Consumer>(harness: &Harness<C>, msg: &IncomingMessage) -> RecordOutcome {
    match harness.settings().commit {
        CommitMode::PerJob => harness.process(msg).await,
        CommitMode::Batch => {
            let (_, companion) = job(award(1));
            let batch = [msg.clone(), message(&companion, 1)];
            let outcomes = harness.process_batch(&batch, &|| true, 10).await;
            assert_eq!(outcomes[1], Some(RecordOutcome::Processed), "{outcomes:?}");
            outcomes[0].clone().expect("started")
        }
    }
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

/// Charges `n` executions to `job_id` that ended without an outcome (as crashes leave them).
pub async fn charge_crashed_executions(pool: &PgPool, job_id: JobId, n: u32) {
    shared_testkit::charge_executions(pool, job_id, &consumer_name(), n, None).await;
}

/// A TCP proxy in front of PostgreSQL that can cut one connection at its `COMMIT`, for the
/// lost-reply and lost-request cases of a commit.
pub mod commit_cutter {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Where to cut the next `COMMIT`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u8)]
    pub enum Cut {
        /// Pass everything.
        Off = 0,
        /// Forward the `COMMIT` to the server, then drop the connection before its reply: the
        /// job committed, and the client cannot know.
        AfterCommitSent = 1,
        /// Drop the connection instead of forwarding the `COMMIT`: the server rolls back.
        BeforeCommitSent = 2,
    }

    /// The running proxy; each cut fires once.
    pub struct CommitCutter {
        /// The port it listens on (127.0.0.1).
        pub port: u16,
        cut: Arc<AtomicU8>,
    }

    impl CommitCutter {
        /// Listens on a free port, forwarding to `upstream_port` on 127.0.0.1.
        pub async fn start(upstream_port: u16) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let cut = Arc::new(AtomicU8::new(Cut::Off as u8));
            let shared = cut.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let cut = shared.clone();
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await {
                            relay(client, server, cut).await;
                        }
                    });
                }
            });
            Self { port, cut }
        }

        /// Arms the next cut.
        pub fn arm(&self, cut: Cut) {
            self.cut.store(cut as u8, Ordering::SeqCst);
        }

        /// Whether the armed cut has fired.
        pub fn fired(&self) -> bool {
            self.cut.load(Ordering::SeqCst) == Cut::Off as u8
        }
    }

    /// The test's own pool on `connect`, a cutter in front of its server, and a pool of the
    /// same options whose connections go through the cutter.
    pub async fn pools_through(
        pool_opts: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) -> (sqlx::PgPool, CommitCutter, sqlx::PgPool) {
        let pool = pool_opts
            .clone()
            .connect_with(connect.clone())
            .await
            .unwrap();
        let cutter = CommitCutter::start(connect.get_port()).await;
        let through = pool_opts
            .connect_with(
                connect
                    .host("127.0.0.1")
                    .port(cutter.port)
                    .ssl_mode(sqlx::postgres::PgSslMode::Disable),
            )
            .await
            .unwrap();
        (pool, cutter, through)
    }

    async fn relay(client: TcpStream, server: TcpStream, cut: Arc<AtomicU8>) {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let down = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        });
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let is_commit = chunk.windows(7).any(|w| w == b"COMMIT\0");
            let armed = cut.load(Ordering::SeqCst);
            if is_commit && armed != Cut::Off as u8 {
                cut.store(Cut::Off as u8, Ordering::SeqCst);
                // Nothing the server says from here on reaches the client.
                down.abort();
                if armed == Cut::AfterCommitSent as u8 {
                    let _ = server_write.write_all(chunk).await;
                    // Let the server commit; then the reply has nowhere to go.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                down.abort();
                return; // both halves drop: the client sees the connection die
            }
            if server_write.write_all(chunk).await.is_err() {
                break;
            }
        }
        down.abort();
    }
}

/// How [`Failing`] fails after the reference consumer's real effect (which then rolls back).
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Transiently, on every attempt.
    AlwaysTransient,
    /// Transiently on attempts before this one, then it succeeds.
    TransientUntilAttempt(u32),
    /// Permanently.
    Permanent,
}

/// The reference consumer, counting its calls, failing as told after writing its effect.
pub struct Failing {
    pub inner: Counting,
    pub fault: Fault,
}

impl Failing {
    pub fn new(fault: Fault) -> Self {
        Self {
            inner: Counting::new(),
            fault,
        }
    }
    pub fn calls(&self) -> usize {
        self.inner.calls()
    }
}

impl Consumer for Failing {
    type Payload = PointsAward;
    fn name(&self) -> &ConsumerName {
        self.inner.name()
    }
    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.inner.handle(job, tx).await?;
        match self.fault {
            Fault::TransientUntilAttempt(n) if job.attempt >= n => Ok(()),
            Fault::AlwaysTransient | Fault::TransientUntilAttempt(_) => Err(
                ProcessError::transient(format!("provider timeout on attempt {}", job.attempt)),
            ),
            Fault::Permanent => Err(ProcessError::permanent("account is closed")),
        }
    }
}
