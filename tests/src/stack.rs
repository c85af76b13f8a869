//! The local stack: a job queue and its DLQ on the local SQS API (redrive as in
//! `template.yaml`), the consumer and the backstop ingester as real Lambda binaries, and an
//! event source for each queue. The tests and the demo both run on it.

use crate::event_source::{EventSource, PollReport, Queue, create_queue_pair, depth, sqs_client};
use crate::lambda_host::{FunctionSpec, LambdaHost};
use migrate::consumers::ConsumerCrate;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// The function binaries: this package's `local-consumer` (the reference consumer with
/// failures on request), `local-dlq-ingester`, `local-scheduled` and `local-dead-letter-api`.
/// Every other consumer runs its own binary, found beside them ([`Binaries::own_binary`]).
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The consumer.
    pub consumer: PathBuf,
    /// The DLQ ingester.
    pub ingester: PathBuf,
    /// The scheduled function.
    pub scheduled: PathBuf,
    /// The dead-letter API functions (one binary serving as the function it is named).
    pub api: PathBuf,
}

impl Binaries {
    /// The binaries next to the running executable (for this package's own binaries).
    pub fn beside_current_exe() -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let dir = exe.parent().expect("exe dir");
        Self {
            consumer: dir.join("local-consumer"),
            ingester: dir.join("local-dlq-ingester"),
            scheduled: dir.join("local-scheduled"),
            api: dir.join("local-dead-letter-api"),
        }
    }

    /// The consumer's own Lambda binary (`cargo build --bins` puts it beside this package's).
    pub fn own_binary(&self, consumer: &ConsumerCrate) -> PathBuf {
        self.ingester.with_file_name(consumer.binary)
    }

    /// Each consumer's own binary that is not built: empty, or what to build.
    pub fn missing(&self, consumers: &[ConsumerCrate]) -> Result<(), String> {
        let missing: Vec<String> = consumers
            .iter()
            .map(|c| self.own_binary(c))
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "consumer binaries not built: {} (build them: cargo build --bins)",
            missing.join(", ")
        ))
    }
}

/// The binaries as cargo built them for this package's integration tests.
#[macro_export]
macro_rules! test_binaries {
    () => {
        $crate::stack::Binaries {
            consumer: env!("CARGO_BIN_EXE_local-consumer").into(),
            ingester: env!("CARGO_BIN_EXE_local-dlq-ingester").into(),
            scheduled: env!("CARGO_BIN_EXE_local-scheduled").into(),
            api: env!("CARGO_BIN_EXE_local-dead-letter-api").into(),
        }
    };
}

/// The operations' sandbox's function timeout ([`Stack::work_operations`]): the scheduled
/// function keeps 10 s of it free, so a round works for 10 s.
pub const OPERATIONS_TIMEOUT: Duration = Duration::from_secs(20);

/// How to set the stack up.
#[derive(Debug, Clone)]
pub struct StackSpec {
    /// The function binaries.
    pub binaries: Binaries,
    /// The database the functions use.
    pub database_url: String,
    /// The job queue's name; the DLQ is `<name>-dlq`.
    pub queue_name: String,
    /// The consumer name (`CONSUMER_NAME`).
    pub consumer_name: String,
    /// The job queue's visibility timeout: how soon a crashed delivery comes back.
    pub visibility_timeout: Duration,
    /// The redrive `maxReceiveCount` (on a FIFO queue, at least what the functions require:
    /// see [`StackSpec::redrive`]).
    pub max_receive_count: u32,
    /// The most records the event source hands the consumer at once (`CONSUMER_BATCH_SIZE`).
    pub batch_size: u32,
    /// Extra environment for the consumer (the retry policy, faults, …).
    pub consumer_env: Vec<(String, String)>,
    /// Extra environment for every function (the log level and format, …).
    pub function_env: Vec<(String, String)>,
    /// The consumer's function timeout.
    pub consumer_timeout: Duration,
    /// Where the functions' logs go.
    pub log_dir: Option<PathBuf>,
}

impl StackSpec {
    /// A stack whose retry policy is the platform's shape at base 1 s, so a run takes seconds.
    pub fn time_scaled(binaries: Binaries, database_url: &str, queue_name: &str) -> Self {
        Self {
            binaries,
            database_url: database_url.to_owned(),
            queue_name: queue_name.to_owned(),
            consumer_name: "award-points".into(),
            visibility_timeout: Duration::from_secs(2),
            max_receive_count: 7,
            batch_size: 10,
            consumer_env: vec![
                ("RETRY_BASE_SECONDS".into(), "1".into()),
                ("RETRY_CAP_SECONDS".into(), "60".into()),
                (
                    "RETRY_OVERRIDE_RATIONALE".into(),
                    "local stack: the default policy's shape at base 1 s".into(),
                ),
                ("DEADLINE_MARGIN_MS".into(), "4000".into()),
            ],
            function_env: Vec::new(),
            consumer_timeout: Duration::from_secs(20),
            log_dir: None,
        }
    }
}

impl StackSpec {
    /// The consumer's database is unreachable (the other functions still reach theirs): it
    /// never sees a record finish, so its records are redriven to the DLQ after
    /// `max_receive_count` receives. An outage hands records back after the policy's backoff,
    /// capped at 2 s here so those receives take seconds.
    pub fn consumer_cannot_reach_its_database(&mut self) {
        for (key, value) in [
            (
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:1/unreachable",
            ),
            ("DATABASE_ACQUIRE_TIMEOUT_MS", "300"),
            ("RETRY_CAP_SECONDS", "2"),
        ] {
            self.consumer_env.push((key.into(), value.into()));
        }
    }

    /// The same stack for `consumer` (any consumer the workspace declares), its own `binary`
    /// on its own queue `queue_name`: the platform's time-scaled policy with the consumer's
    /// `local-env` on top (its own retry policy, …), and a redrive of its attempts + 2. A
    /// consumer on another queue than this stack's logs in a directory named after it.
    pub fn for_consumer(
        &self,
        consumer: &ConsumerCrate,
        queue_name: &str,
        binary: PathBuf,
    ) -> Self {
        let mut spec = Self::time_scaled(self.binaries.clone(), &self.database_url, queue_name);
        spec.binaries.consumer = binary;
        spec.function_env = self.function_env.clone();
        spec.consumer_name = consumer.name.into();
        spec.log_dir = match self.log_dir.as_ref() {
            Some(dir) if queue_name != self.queue_name => Some(dir.join(consumer.name)),
            other => other.cloned(),
        };
        let own = |key: &str| consumer.local_env.iter().any(|(k, _)| *k == key);
        if consumer
            .local_env
            .iter()
            .any(|(k, _)| k.starts_with("RETRY_"))
        {
            let rationale = format!("local stack: {}'s policy, time-scaled", consumer.name);
            for (key, value) in &mut spec.consumer_env {
                if key == "RETRY_OVERRIDE_RATIONALE" {
                    *value = rationale.clone();
                }
            }
        }
        spec.consumer_env.retain(|(k, _)| !own(k));
        let local = consumer
            .local_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        spec.consumer_env = local.chain(spec.consumer_env).collect();
        let attempts: u32 = consumer
            .local_env
            .iter()
            .find(|(k, _)| *k == "RETRY_MAX_ATTEMPTS")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(shared::retry::RetryPolicy::default().max_attempts());
        spec.max_receive_count = attempts + 2;
        spec
    }

    /// Whether the stack's queues are FIFO queues (the name ends in `.fifo`).
    pub fn is_fifo(&self) -> bool {
        self.queue_name.ends_with(".fifo")
    }

    /// The redrive `maxReceiveCount` the job queue gets: [`StackSpec::max_receive_count`] as it
    /// is set (a test of a misconfiguration sets it low), but on a FIFO queue at least what the
    /// functions require of it (the batch size times the attempts + 2, as the template's FIFO
    /// default), since a group's held-back records are received with its head.
    pub fn redrive(&self) -> u32 {
        if !self.is_fifo() {
            return self.max_receive_count;
        }
        let attempts = self
            .consumer_env
            .iter()
            .rev()
            .find(|(k, _)| k == "RETRY_MAX_ATTEMPTS")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(shared::retry::RetryPolicy::default().max_attempts());
        let least = shared::config::least_receive_count(true, self.batch_size, attempts);
        self.max_receive_count.max(least)
    }

    /// What every function of the stack gets: the database, the consumer name, the queue's
    /// redrive count (each function checks it against the attempts), whether the queues are
    /// FIFO and the batch size, no alerts.
    pub fn common_env(&self) -> Vec<(String, String)> {
        let redrive = self.redrive().to_string();
        let batch_size = self.batch_size.to_string();
        [
            ("DATABASE_URL", self.database_url.as_str()),
            ("CONSUMER_NAME", self.consumer_name.as_str()),
            ("DATABASE_POOL_SIZE", "4"),
            ("ALERTING_DISABLED", "true"),
            ("REDRIVE_MAX_RECEIVE_COUNT", redrive.as_str()),
            ("QUEUE_FIFO", if self.is_fifo() { "true" } else { "false" }),
            ("CONSUMER_BATCH_SIZE", batch_size.as_str()),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into_iter()
        .chain(self.function_env.iter().cloned())
        .collect()
    }

    /// Where the function `name` logs, if anywhere.
    pub fn log_file(&self, name: &str) -> Option<PathBuf> {
        self.log_dir.as_ref().map(|d| d.join(format!("{name}.log")))
    }

    /// The consumer function as a Lambda named `name` (each name is one sandbox).
    pub fn consumer_function(&self, name: &str) -> FunctionSpec {
        FunctionSpec {
            name: name.into(),
            binary: self.binaries.consumer.clone(),
            env: self
                .common_env()
                .into_iter()
                .chain(self.consumer_env.iter().cloned())
                .collect(),
            timeout: self.consumer_timeout,
            log_file: self.log_file(name),
            deadline_as_duration: false,
        }
    }
}

/// A test's stack: a pool on the test's database (`#[sqlx::test]` made it) and a stack of the
/// `binaries` over it, on queues of its own, after `tweak` has adjusted the spec.
pub async fn start_for_test(
    binaries: Binaries,
    pool_opts: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
    tweak: impl FnOnce(&mut StackSpec),
) -> (sqlx::PgPool, Stack) {
    let pool = pool_opts
        .connect_with(connect.clone())
        .await
        .expect("the test database");
    let mut spec = StackSpec::time_scaled(
        binaries,
        &crate::test_database_url(&connect),
        &format!("jobs-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
    );
    tweak(&mut spec);
    (pool, Stack::start(spec).await)
}

/// A running local stack.
pub struct Stack {
    /// The consumer's name (`CONSUMER_NAME`).
    pub consumer_name: String,
    /// The SQS client.
    pub sqs: aws_sdk_sqs::Client,
    /// The job queue.
    pub jobs: Queue,
    /// Its backstop DLQ.
    pub dlq: Queue,
    /// The consumer function.
    pub consumer: LambdaHost,
    /// The DLQ ingester function.
    pub ingester: LambdaHost,
    /// The scheduled function (EventBridge invokes it on AWS; [`Stack::tick`] here).
    pub scheduled: LambdaHost,
    /// The same function in a sandbox of its own for its bulk operations' round
    /// ([`Stack::work_operations`]): on AWS its own schedule's invocations run beside the
    /// scheduled run's, each in a sandbox, and a round may take the whole invocation.
    pub operations: LambdaHost,
    /// The dead-letter API: `dead-letters-read`, `-replay` and `-discard` (shared with a local
    /// [`crate::gateway::Gateway`]).
    pub api: std::sync::Arc<ApiFunctions>,
    /// The most records one poll hands the consumer.
    pub batch_size: u32,
}

/// The dead-letter API's functions, as API Gateway would invoke them.
pub struct ApiFunctions {
    /// List and get.
    pub read: LambdaHost,
    /// Replay: the only one with an SQS client.
    pub replay: LambdaHost,
    /// Discard.
    pub discard: LambdaHost,
}

impl ApiFunctions {
    /// The function that serves `request`'s route, by the route table in `dead_letter_api::api`; the
    /// read function for a request no route matches (it answers 404 or 405).
    pub fn serving(&self, request: &dead_letter_api::api::ApiRequest) -> &LambdaHost {
        match dead_letter_api::api::function_for(&request.method, &request.path) {
            Some("dead-letters-replay") => &self.replay,
            Some("dead-letters-discard") => &self.discard,
            _ => &self.read,
        }
    }

    /// Sends `request` through its function; returns the status and JSON body.
    pub async fn call(
        &self,
        request: &dead_letter_api::api::ApiRequest,
    ) -> dead_letter_api::api::ApiResponse {
        crate::api_client::invoke(self.serving(request), request).await
    }
}

impl Stack {
    /// Creates the queues and prepares the functions (they start on their first invocation).
    pub async fn start(spec: StackSpec) -> Self {
        if let Some(dir) = &spec.log_dir {
            std::fs::create_dir_all(dir).expect("the stack's log directory");
        }
        let sqs = sqs_client().await;
        let (jobs, dlq) = create_queue_pair(
            &sqs,
            &spec.queue_name,
            spec.visibility_timeout,
            spec.redrive(),
        )
        .await;
        let common = spec.common_env();
        let log = |name: &str| spec.log_file(name);
        let consumer = LambdaHost::new(spec.consumer_function("consumer"));
        // The ingester gets the consumer's retry policy too, as in template.yaml's stanza.
        let retry_policy: Vec<(String, String)> = spec
            .consumer_env
            .iter()
            .filter(|(k, _)| k.starts_with("RETRY_"))
            .cloned()
            .collect();
        let ingester_env = retry_policy
            .iter()
            .cloned()
            .chain([("JOB_QUEUE_NAME".to_owned(), jobs.name.clone())]);
        let ingester = LambdaHost::new(FunctionSpec {
            name: "dlq-ingester".into(),
            binary: spec.binaries.ingester.clone(),
            env: common.iter().cloned().chain(ingester_env).collect(),
            timeout: Duration::from_secs(20),
            log_file: log("dlq-ingester"),
            deadline_as_duration: false,
        });
        // The scheduled function checks the stack's redrive count against the retry policy as
        // the others do: it gets the consumer's policy too (a stack whose consumer gives up
        // after 2 executions redrives after 4 receives, which the default 5 attempts refuse).
        let scheduled_function = |log_name: &str, timeout: Duration| {
            LambdaHost::new(FunctionSpec {
                name: "scheduled".into(),
                binary: spec.binaries.scheduled.clone(),
                env: common.iter().chain(&retry_policy).cloned().collect(),
                timeout,
                log_file: log(log_name),
                deadline_as_duration: false,
            })
        };
        let scheduled = scheduled_function("scheduled", Duration::from_secs(60));
        // A round works until 10 s before its deadline: 10 s of work a round, so a local stack
        // gives an operation's worker back within seconds and shows its progress move.
        let operations = scheduled_function("scheduled-operations", OPERATIONS_TIMEOUT);
        let api_function = |name: &str| {
            LambdaHost::new(FunctionSpec {
                name: name.into(),
                binary: spec.binaries.api.clone(),
                env: common.to_vec(),
                timeout: Duration::from_secs(10),
                log_file: log(name),
                deadline_as_duration: false,
            })
        };
        let api = std::sync::Arc::new(ApiFunctions {
            read: api_function("dead-letters-read"),
            replay: api_function("dead-letters-replay"),
            discard: api_function("dead-letters-discard"),
        });
        Self {
            consumer_name: spec.consumer_name.clone(),
            sqs,
            jobs,
            dlq,
            consumer,
            ingester,
            scheduled,
            operations,
            api,
            batch_size: spec.batch_size,
        }
    }

    /// Invokes the scheduled function once with an EventBridge scheduled event; returns its report.
    pub async fn tick(&self) -> Result<serde_json::Value, crate::lambda_host::InvokeError> {
        let event = serde_json::json!({"version": "0", "id": uuid::Uuid::new_v4(), "detail-type": "Scheduled Event",
            "source": "aws.events", "account": "123456789012", "time": chrono::Utc::now(), "region": "us-east-1",
            "resources": [], "detail": {}});
        self.scheduled.invoke(&event).await
    }

    /// Invokes the scheduled function once with its operations event (`{"work": "operations"}`,
    /// as `OperationsSchedule` does every minute on AWS): it works the bulk operations that are
    /// running for up to [`OPERATIONS_TIMEOUT`] less its margin, and returns its round's report.
    pub async fn work_operations(
        &self,
    ) -> Result<serde_json::Value, crate::lambda_host::InvokeError> {
        let event = serde_json::json!({ "work": scheduled::OPERATIONS_WORK });
        self.operations.invoke(&event).await
    }

    /// Sends `body` to the job queue; returns the message id. On a FIFO queue, in the group
    /// `default` (see [`Stack::send_in_group`]).
    pub async fn send(&self, body: &str) -> String {
        self.send_in_group(body, "default").await
    }

    /// Sends `body` to the job queue, in the message group `group` if it is a FIFO queue (whose
    /// content-based deduplication, as `templates/consumer.yaml` declares it, drops a second
    /// send of the same body within 5 minutes); returns the message id.
    pub async fn send_in_group(&self, body: &str, group: &str) -> String {
        let mut send = self
            .sqs
            .send_message()
            .queue_url(&self.jobs.url)
            .message_body(body);
        if self.jobs.is_fifo() {
            send = send.message_group_id(group);
        }
        let out = send.send().await.expect("SendMessage");
        out.message_id.expect("message id")
    }

    /// One poll of each queue: (jobs, dlq).
    pub async fn poll(&self) -> (PollReport, PollReport) {
        let jobs = EventSource {
            sqs: &self.sqs,
            queue: &self.jobs,
            function: &self.consumer,
            batch_size: self.batch_size as i32,
            delete_loss: 0.0,
        };
        let dlq = EventSource {
            sqs: &self.sqs,
            queue: &self.dlq,
            function: &self.ingester,
            batch_size: 10,
            delete_loss: 0.0,
        };
        tokio::join!(jobs.poll_once(), dlq.poll_once())
    }

    /// Messages on both queues, visible or in flight.
    pub async fn in_flight(&self) -> u64 {
        depth(&self.sqs, &self.jobs).await + depth(&self.sqs, &self.dlq).await
    }

    /// Polls both queues until `done()` holds and both are empty, or `timeout` passes.
    /// Returns every poll report of the job queue, with when it happened.
    pub async fn run_until<F, Fut>(
        &self,
        timeout: Duration,
        mut done: F,
    ) -> Vec<(Instant, PollReport)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        let mut reports = Vec::new();
        loop {
            let (jobs, _) = self.poll().await;
            if jobs.received > 0 {
                reports.push((Instant::now(), jobs));
            }
            if done().await && self.in_flight().await == 0 {
                return reports;
            }
            assert!(
                start.elapsed() < timeout,
                "not settled within {timeout:?}; job polls so far: {reports:#?}"
            );
        }
    }
}
