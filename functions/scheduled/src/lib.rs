//! The scheduled function (EventBridge): sends queued replays, delivers incident steps still due,
//! escalates failure groups nobody reviewed, and sweeps expired fences. Wiring only; the steps are `shared::scheduled`. It
//! refuses to start when `FENCE_TTL_SECONDS` is below the floor, naming the variable.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use shared::clock::{Clock, SystemClock};
use shared::config::{Env, ScheduledConfig, or_exit};
use shared::db::Database;
use shared::scheduled::{Heartbeat, ScheduledRun};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time kept free before the Lambda deadline: the sweep stops this much earlier.
const DEADLINE_MARGIN: Duration = Duration::from_secs(10);

/// Builds everything once from the environment, then serves scheduled invocations.
pub async fn run() -> Result<(), Error> {
    shared::telemetry::init();
    let config = or_exit(ScheduledConfig::from_env(&Env::process()));
    let sdk = shared::aws::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let database = or_exit(Database::new(&config.database, &secrets));
    let pool = database.pool().clone();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let alerts = config.alerts.as_ref();
    let scheduled = ScheduledRun {
        alerter: alerts.map(|a| or_exit(a.alerter(pool.clone(), clock.clone(), &secrets))),
        page_budget: alerts.map(|a| a.budget).unwrap_or_default(),
        pool,
        clock,
        sweep: config.sweep,
        escalate_after: config.escalate_after,
        // Sends replays that were recorded but whose own send failed.
        replayer: Some(shared::replay::Replayer::new(aws_sdk_sqs::Client::new(
            &sdk,
        ))),
        heartbeat: config.heartbeat_url.clone().map(Heartbeat::new),
    };
    let (scheduled, config, database) = (&scheduled, &config, &database);

    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        if let Err(e) = database.ready().await {
            tracing::error!(error = %e, "the database is not ready");
        }
        let deadline_ms = Duration::from_millis(event.context.deadline);
        let left = deadline_ms.saturating_sub(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
        );
        let deadline = tokio::time::Instant::now() + left.saturating_sub(DEADLINE_MARGIN);
        let report = scheduled.run(Some(deadline)).await;
        println!(
            "{}",
            report.emf(&config.metrics_namespace, scheduled.clock.now())
        );
        Ok::<_, Error>(report.to_json())
    }))
    .await
}
