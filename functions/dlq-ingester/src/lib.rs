//! The backstop: a Lambda on the job queue's SQS DLQ that turns every message the harness never
//! saw finish into a `crashed` dead letter. Wiring only; the logic is `shared::dlq_ingester`.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use shared::clock::SystemClock;
use shared::config::{DlqIngesterConfig, Env, or_exit};
use shared::db::Database;
use shared::dlq_ingester::DlqIngester;
use std::sync::Arc;

/// Builds everything once from the environment, then serves invocations until the runtime stops.
/// A configuration error stops the process with the variable's name (exit status 78).
pub async fn run() -> Result<(), Error> {
    shared::telemetry::init();
    let config = or_exit(DlqIngesterConfig::from_env(&Env::process()));
    let sdk = shared::aws::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let database = or_exit(Database::new(&config.database, &secrets));
    let clock: Arc<dyn shared::clock::Clock> = Arc::new(SystemClock);
    let alerter = config
        .alerts
        .as_ref()
        .map(|a| or_exit(a.alerter(database.pool().clone(), clock.clone(), &secrets)));
    let ingester = DlqIngester {
        pool: database.pool().clone(),
        consumer: config.consumer_name.clone(),
        job_queue: config.job_queue.clone(),
        max_receive_count: config.fence.max_receive_count,
        max_attempts: config.fence.policy.max_attempts(),
        settle_wait: config.fence.lock_timeout,
        fence_ttl: config.fence.ttl,
        queue_retention: config.fence.queue_retention,
        job_fields: config.fence.job_fields.clone(),
        settle_due: config.settle_due,
        clock,
        metrics: Default::default(),
        alerter,
    };
    let (ingester, config, database) = (&ingester, &config, &database);

    // Boxed, as the consumer's service: unboxed, the service future overflows the compiler's
    // layout query depth in optimized builds (the perf profile, at fc3e797).
    Box::pin(shared::telemetry::otel::serve(
        lambda_runtime::layers::OpenTelemetryFaasTrigger::PubSub,
        service_fn(move |event: LambdaEvent<SqsEvent>| async move {
            if let Err(e) = database.ready().await {
                tracing::error!(error = %e, "the database is not ready");
            }
            let response = ingester.ingest(event.payload.records).await;
            let (namespace, consumer) = (&config.metrics_namespace, config.consumer_name.as_str());
            ingester.metrics.flush_emf(
                &mut std::io::stdout().lock(),
                namespace,
                consumer,
                chrono::Utc::now(),
            )?;
            Ok::<_, Error>(response)
        }),
    ))
    .await
}
