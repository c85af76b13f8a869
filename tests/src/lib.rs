//! Cross-crate test support, on the test kit (`shared-testkit`): the reference consumer failing
//! on request ([`faulty_award`], which `local-consumer` runs), a consumer that misbehaves on
//! purpose right after the reference consumer's real effect, the kit's harness on the wall
//! clock, and the local demo runner. Fault injection lives here only, never in a crate that
//! deploys.

pub mod alert_receiver;
pub mod api_client;
pub mod bench;
pub mod demo;
pub mod dev;
pub mod event_source;
pub mod faulty_award;
pub mod gateway;
pub mod groups;
pub mod intake_kit;
pub mod lambda_host;
pub mod latency_proxy;
pub mod local_stack;
pub mod operations_kit;
pub mod otlp_receiver;
pub mod pooler;
pub mod promises;
pub mod smoke;
pub mod soak;
pub mod stack;
pub mod throwaway_pg;

use consumer::{AwardPoints, PointsAward};
use shared::clock::SystemClock;
use shared::consumer::{Consumer, Job, ProcessError};
use shared::harness::{Harness, HarnessSettings};
use shared::ids::ConsumerName;
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;
use std::time::Duration;

/// What [`AfterWork::Hang`] prints once its work is written but not committed.
pub const WORK_WRITTEN: &str = "WORK_WRITTEN_NOT_COMMITTED";

/// `s` quoted for a POSIX shell when it needs it (to print commands as they would be typed).
pub fn shell_word(s: &str) -> String {
    dlq::args::shell_word(s)
}

/// The cargo that built these tests, on the toolchain that built them, for a test that builds
/// or inspects the workspace: `cargo test` runs a test with `RUSTUP_TOOLCHAIN` set to the
/// toolchain rustup chose for it, but `scripts/run_tests.py` runs the test binaries itself, and
/// there a nested build's `rustc` (a rustup proxy) chose again from what it found (CI's found
/// one that is not installed). Pinned here as the tests were compiled.
pub fn cargo() -> std::process::Command {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    if let Some(toolchain) = option_env!("RUSTUP_TOOLCHAIN") {
        cargo.env("RUSTUP_TOOLCHAIN", toolchain);
    }
    cargo
}

/// The consumer name every test here fences under: the reference consumer's.
pub fn consumer_name() -> ConsumerName {
    shared_testkit::reference::reference_name()
}

/// What [`FailAfterWork`] does between the work and the commit.
#[derive(Debug, Clone, Copy)]
pub enum AfterWork {
    /// Panic: a failpoint inside the process.
    Panic,
    /// Announce [`WORK_WRITTEN`] on stdout and wait forever, for a test to kill the process.
    Hang,
}

/// Does the reference consumer's real work, then fails as told before the harness can commit.
pub struct FailAfterWork(pub AwardPoints, pub AfterWork);

impl FailAfterWork {
    async fn fail(&self, jobs: &[&Job<PointsAward>]) -> Result<(), ProcessError> {
        match self.1 {
            AfterWork::Panic => panic!("failpoint: between the work and the commit"),
            AfterWork::Hang => {
                let ids: Vec<String> = jobs.iter().map(|j| j.envelope.job_id.to_string()).collect();
                println!("{WORK_WRITTEN} {}", ids.join(" "));
                std::future::pending::<()>().await;
                unreachable!("killed while waiting")
            }
        }
    }
}

impl Consumer for FailAfterWork {
    type Payload = PointsAward;

    fn name(&self) -> &ConsumerName {
        self.0.name()
    }

    async fn handle(
        &self,
        job: &Job<PointsAward>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.0.handle(job, tx).await?;
        self.fail(&[job]).await
    }

    /// The reference consumer's batch work (all its awards), then the failure.
    async fn handle_batch(
        &self,
        jobs: &[Job<PointsAward>],
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.0.handle_batch(jobs, tx).await?;
        self.fail(&jobs.iter().collect::<Vec<_>>()).await
    }
}

/// `DATABASE_URL` (credentials and all) pointed at the database `#[sqlx::test]` made for a test,
/// for the processes a test starts.
pub fn test_database_url(opts: &sqlx::postgres::PgConnectOptions) -> String {
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for database tests");
    let server = server.split('?').next().unwrap_or_default();
    let (head, _) = server
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    format!(
        "{head}/{}",
        opts.get_database().expect("the test database's name")
    )
}

/// How long a copy waits for another's fence here: the kit's wait is for tasks in one process;
/// these tests race processes (and a local SQS API) on a loaded machine.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The kit's harness with the platform's retry policy on the wall clock (these tests meet
/// processes, queues and the database's own `now()`), waiting [`LOCK_TIMEOUT`] for a fence.
pub fn harness<C: Consumer>(pool: PgPool, consumer: C) -> Harness<C> {
    harness_in(pool, consumer, Default::default())
}

/// [`harness`] committing one transaction per job, or per batch.
pub fn harness_in<C: Consumer>(
    pool: PgPool,
    consumer: C,
    commit: shared::harness::CommitMode,
) -> Harness<C> {
    let settings = HarnessSettings {
        lock_timeout: LOCK_TIMEOUT,
        commit,
        ..shared_testkit::settings()
    };
    shared_testkit::harness_on(&pool, consumer, settings, Arc::new(SystemClock))
}

/// Charges `executions` to `job_id` in the execution ledger, as if that many had run and the
/// last had ended with `last_error` (`None`: without an outcome, as a crash leaves it).
pub async fn charge_executions(
    pool: &PgPool,
    job_id: shared::ids::JobId,
    executions: u32,
    last_error: Option<&str>,
) {
    shared_testkit::charge_executions(pool, job_id, &consumer_name(), executions, last_error).await;
}

/// The letters of `job_id` for the consumer every test here fences under, oldest first.
pub async fn letters(
    pool: &PgPool,
    job_id: shared::ids::JobId,
) -> Vec<shared::dead_letter::DeadLetter> {
    shared_testkit::letters(pool, job_id, &consumer_name()).await
}

/// Whether `job_id`'s fence for the consumer every test here fences under has committed.
pub async fn fenced(pool: &PgPool, job_id: shared::ids::JobId) -> bool {
    shared_testkit::fence_committed(pool, job_id, &consumer_name()).await
}

/// A fresh directory for a stack's function logs (`StackSpec::log_dir`).
pub fn log_dir() -> std::path::PathBuf {
    let logs = std::env::temp_dir().join(format!("e2e-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&logs).expect("creating the log directory");
    logs
}

/// Invokes `stack`'s consumer, expecting it to refuse to start as misconfigured (exit status 78,
/// `EX_CONFIG`); its log from `logs` (the stack's [`log_dir`]).
pub async fn refused_start_log(stack: &stack::Stack, logs: &std::path::Path) -> String {
    let error = stack
        .consumer
        .invoke(&serde_json::json!({"Records": []}))
        .await
        .expect_err("a misconfigured consumer does not start");
    assert!(error.to_string().contains("exit status: 78"), "{error}");
    std::fs::read_to_string(logs.join("consumer.log")).expect("the consumer's log")
}

/// The messages on `stack`'s job queue (waiting up to 2 s for the first), as received.
pub async fn received_jobs(stack: &stack::Stack) -> Vec<aws_sdk_sqs::types::Message> {
    stack
        .sqs
        .receive_message()
        .queue_url(&stack.jobs.url)
        .wait_time_seconds(2)
        .send()
        .await
        .expect("ReceiveMessage")
        .messages
        .unwrap_or_default()
}

/// [`stack::start_for_test`] with this package's binaries ([`test_binaries!`], which only an
/// integration test can name): `e2e::stack_for_test!(pool_opts, connect, |spec| ..).await`.
#[macro_export]
macro_rules! stack_for_test {
    ($pool_opts:expr, $connect:expr, $tweak:expr) => {
        $crate::stack::start_for_test($crate::test_binaries!(), $pool_opts, $connect, $tweak)
    };
}
