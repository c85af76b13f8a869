//! The one call that runs a consumer on AWS Lambda. A consumer crate is its payload type, its
//! [`Consumer`] and a `main` that calls [`run_consumer`]: configuration, the database pool, the
//! SQS client, time, alerts, telemetry, the SQS batch and the metrics are the library's.
//!
//! Invariant: everything is built once, before the first invocation; a configuration error
//! stops the process at start, naming the variable (exit status 78). Secrets are read at run
//! time (the first invocation, and again when the database rejects them), and every AWS call
//! has its timeout ([`crate::aws`]).

use crate::clock::{Clock, SystemClock};
use crate::config::{ConsumerConfig, Env, or_exit};
use crate::consumer::Consumer;
use crate::db::Database;
use crate::harness::{Harness, HarnessSettings};
use crate::ids::ConsumerName;
use crate::sqs::{BatchSettings, SqsVisibility, invocation_deadline, process_batch};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{LambdaEvent, service_fn};
use std::sync::Arc;
use std::time::Duration;

/// Runs `make(CONSUMER_NAME)` as the Lambda function on an SQS event source (with
/// `ReportBatchItemFailures`) until the runtime stops:
///
/// ```no_run
/// # use shared::{consumer::*, ids::ConsumerName};
/// # struct AwardPoints(ConsumerName);
/// # impl Consumer for AwardPoints {
/// #     type Payload = serde_json::Value;
/// #     fn name(&self) -> &ConsumerName { &self.0 }
/// #     async fn handle(&self, _: &Job<Self::Payload>, _: &mut sqlx::PgConnection) -> Result<(), ProcessError> { Ok(()) }
/// # }
/// #[tokio::main]
/// async fn main() -> Result<(), lambda_runtime::Error> {
///     shared::run::run_consumer(AwardPoints).await
/// }
/// ```
pub async fn run_consumer<C, F>(make: F) -> Result<(), lambda_runtime::Error>
where
    C: Consumer + 'static,
    F: FnOnce(ConsumerName) -> C,
{
    crate::telemetry::init();
    let config = or_exit(ConsumerConfig::from_env(&Env::process()));
    let sdk = crate::aws::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let database = or_exit(Database::new(&config.database, &secrets));
    let visibility = SqsVisibility(aws_sdk_sqs::Client::new(&sdk));
    let harness = harness_of(
        make(config.consumer_name.clone()),
        &config,
        &database,
        &secrets,
    );
    let (harness, visibility, config, database) = (&harness, &visibility, &config, &database);

    // Boxed: the service future is deep enough to overflow the compiler's layout query depth in
    // optimized builds of the consumer crates (seen with the perf and release profiles).
    Box::pin(crate::telemetry::otel::serve(
        lambda_runtime::layers::OpenTelemetryFaasTrigger::PubSub,
        service_fn(move |event: LambdaEvent<SqsEvent>| {
            invoke(harness, visibility, config, database, event)
        }),
    ))
    .await
}

/// One invocation: the batch processed within its deadline, then the metrics flushed.
async fn invoke<C: Consumer>(
    harness: &Harness<C>,
    visibility: &SqsVisibility,
    config: &ConsumerConfig,
    database: &Database,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, lambda_runtime::Error> {
    let deadline = invocation_deadline(event.context.deadline, harness.now());
    if let Err(e) = database.ready().await {
        // The records fail or hand themselves back as with the database down.
        tracing::error!(error = %e, "the database is not ready");
    }
    let records = event.payload.records;
    let settings = batch_settings(config);
    let response = process_batch(harness, visibility, records, deadline, settings).await;
    harness.metrics().flush_emf(
        &mut std::io::stdout().lock(),
        &config.metrics_namespace,
        config.consumer_name.as_str(),
        harness.now(),
    )?;
    Ok(response)
}

/// The harness over `consumer`, as `config` sets it up; a consumer whose code names other job
/// fields than `JOB_FIELDS` stops here, naming the variable.
fn harness_of<C: Consumer>(
    consumer: C,
    config: &ConsumerConfig,
    database: &Database,
    secrets: &aws_sdk_secretsmanager::Client,
) -> Harness<C> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let pool = database.pool().clone();
    let alerter =
        (config.alerts.as_ref()).map(|a| or_exit(a.alerter(pool.clone(), clock.clone(), secrets)));
    or_exit(config.fence.agree_on_job_fields(consumer.job_fields()));
    let settings = harness_settings(config);
    Harness::new(consumer, pool, settings, clock, rand::make_rng()).with_alerter(alerter)
}

/// The harness settings a consumer's configuration describes. A contended fence is retried
/// after the lock timeout plus a second, when the copy holding it has usually finished.
pub(crate) fn harness_settings(config: &ConsumerConfig) -> HarnessSettings {
    HarnessSettings {
        policy: config.fence.policy,
        fence_ttl: config.fence.ttl,
        lock_timeout: config.fence.lock_timeout,
        contended_retry_after: config.fence.lock_timeout + Duration::from_secs(1),
        commit: config.commit,
        settle_due: config.settle_due,
    }
}

/// How batches are processed: as many records at once as the pool has connections.
fn batch_settings(config: &ConsumerConfig) -> BatchSettings {
    BatchSettings {
        concurrency: config.database.pool_size as usize,
        deadline_margin: config.deadline_margin,
    }
}
