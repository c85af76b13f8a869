//! The backstop: a Lambda on the job queue's SQS DLQ that turns every message the harness never
//! saw finish into a `crashed` dead letter. Wiring only; the logic is `shared::dlq_ingester`.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use shared::clock::SystemClock;
use shared::config::{DlqIngesterConfig, Env, or_exit};
use shared::dlq_ingester::DlqIngester;
use std::sync::Arc;

/// Builds everything once from the environment, then serves invocations until the runtime stops.
/// A configuration error stops the process with the variable's name (exit status 78).
pub async fn run() -> Result<(), Error> {
    shared::telemetry::init();
    let config = or_exit(DlqIngesterConfig::from_env(&Env::process()));
    let pool = or_exit(config.database.lazy_pool());
    let clock: Arc<dyn shared::clock::Clock> = Arc::new(SystemClock);
    let alerter = config
        .alerts
        .as_ref()
        .map(|a| or_exit(a.alerter(pool.clone(), clock.clone())));
    let ingester = DlqIngester {
        pool,
        consumer: config.consumer_name.clone(),
        job_queue: config.job_queue.clone(),
        max_receive_count: config.fence.max_receive_count,
        max_attempts: config.fence.policy.max_attempts(),
        settle_wait: config.fence.lock_timeout,
        clock,
        metrics: Default::default(),
        alerter,
    };
    let (ingester, config) = (&ingester, &config);

    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let response = ingester.ingest(event.payload.records).await;
        let (namespace, consumer) = (&config.metrics_namespace, config.consumer_name.as_str());
        ingester.metrics.flush_emf(
            &mut std::io::stdout().lock(),
            namespace,
            consumer,
            chrono::Utc::now(),
        )?;
        Ok::<_, Error>(response)
    }))
    .await
}
