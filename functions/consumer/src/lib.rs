//! The reference consumer as a Lambda on an SQS event source (with `ReportBatchItemFailures`).
//! Wiring only: configuration, pool and SQS client are built once; every record goes through
//! `shared::sqs::process_batch`.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use shared::clock::SystemClock;
use shared::config::{ConsumerConfig, Env, or_exit};
use shared::harness::Harness;
use shared::reference::AwardPoints;
use shared::sqs::{SqsVisibility, process_batch};
use std::sync::Arc;

/// Builds everything once from the environment, then serves invocations until the runtime stops.
/// A configuration error stops the process with the variable's name (exit status 78).
pub async fn run() -> Result<(), Error> {
    shared::telemetry::init();
    let config = or_exit(ConsumerConfig::from_env(&Env::process()));
    let pool = or_exit(config.database.lazy_pool());
    let visibility = SqsVisibility(aws_sdk_sqs::Client::new(&aws_config::load_from_env().await));
    let consumer = AwardPoints::new(config.consumer_name.clone());
    let clock: Arc<dyn shared::clock::Clock> = Arc::new(SystemClock);
    let alerter = config
        .alerts
        .as_ref()
        .map(|a| or_exit(a.alerter(pool.clone(), clock.clone())));
    let settings = config.harness_settings();
    let harness =
        Harness::new(consumer, pool, settings, clock, rand::make_rng()).with_alerter(alerter);
    let (harness, visibility, config) = (&harness, &visibility, &config);

    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let deadline = chrono::DateTime::from_timestamp_millis(event.context.deadline as i64)
            .unwrap_or_default();
        let response: SqsBatchResponse = process_batch(
            harness,
            visibility,
            event.payload.records,
            deadline,
            config.batch_settings(),
        )
        .await;
        let consumer = config.consumer_name.as_str();
        harness.metrics().flush_emf(
            &mut std::io::stdout().lock(),
            &config.metrics_namespace,
            consumer,
            harness.now(),
        )?;
        Ok::<_, Error>(response)
    }))
    .await
}
