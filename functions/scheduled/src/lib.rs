//! The scheduled function (EventBridge): sends queued replays, delivers incident steps still due,
//! escalates failure groups nobody reviewed and replays unsent past their bound, and sweeps
//! expired fences, each step within its share of the invocation's deadline. Invoked with
//! `{"work": "operations"}` (its own, more frequent schedule), it settles the letters received
//! and left for a round that did not come, then works the bulk operations operators started
//! instead, until its deadline. Wiring only; the steps are `shared::upkeep`
//! and `shared::operations`. It refuses to start when `FENCE_TTL_SECONDS` is below the floor,
//! naming the variable.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use shared::clock::{Clock, SystemClock};
use shared::config::{Env, ScheduledConfig, or_exit};
use shared::db::Database;
use shared::operations::OperationTools;
use shared::upkeep::{Heartbeat, ScheduledRun};
use std::sync::Arc;
use std::time::Duration;

/// Time kept free before the Lambda deadline: the steps share what is left before it (the sweep
/// stops there), and the measurements and the heartbeat (3 s at most) run in it.
const DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// Bulk operations one invocation works, one after the other, the oldest first.
const OPERATIONS_PER_ROUND: i64 = 10;
/// An operations invocation's time without a deadline.
const OPERATIONS_ROUND: Duration = Duration::from_secs(60);

/// The most an operations invocation spends settling received letters before its operations.
const SETTLE_IN_OPERATIONS: Duration = Duration::from_secs(10);

/// The `work` of the event that makes an invocation work the bulk operations
/// (`{"work": "operations"}`: its own schedule in `template.yaml`, `OperationsSchedule`).
pub const OPERATIONS_WORK: &str = "operations";

/// Whether `event` asks for the bulk operations' round rather than the scheduled run.
pub fn works_operations(event: &Value) -> bool {
    event.get("work").and_then(Value::as_str) == Some(OPERATIONS_WORK)
}

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
    // One SQS client for both kinds of invocation (it is cheap to clone).
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let scheduled = ScheduledRun {
        alerter: alerts.map(|a| or_exit(a.alerter(pool.clone(), clock.clone(), &secrets))),
        pool,
        clock,
        sweep: config.sweep,
        escalate_after: config.escalate_after,
        // Sends replays that were recorded but whose own send failed.
        replayer: Some(shared::replay::Replayer::new(sqs.clone())),
        heartbeat: config.heartbeat_url.clone().map(Heartbeat::new),
        replay_alert_after: config.replay_alert_after,
    };
    let operations = OperationTools {
        pool: scheduled.pool.clone(),
        clock: scheduled.clock.clone(),
        replayer: Some(shared::replay::Replayer::new(sqs.clone())),
    };
    let (scheduled, config, database) = (&scheduled, &config, &database);
    let operations = &operations;

    shared::telemetry::otel::serve(
        lambda_runtime::layers::OpenTelemetryFaasTrigger::Timer,
        service_fn(move |event: LambdaEvent<Value>| async move {
            if let Err(e) = database.ready().await {
                tracing::error!(error = %e, "the database is not ready");
            }
            // A deadline already past cannot be real (a local emulator sends a duration): none then.
            let now = scheduled.clock.now();
            let deadline =
                shared::sqs::invocation_deadline(event.context.deadline, now).map(|at| {
                    let left = (at - now).to_std().unwrap_or_default();
                    tokio::time::Instant::now() + left.saturating_sub(DEADLINE_MARGIN)
                });
            if works_operations(&event.payload) {
                // Without a deadline (a local emulator's), a minute.
                let until =
                    deadline.unwrap_or_else(|| tokio::time::Instant::now() + OPERATIONS_ROUND);
                // First the letters received and left for a round that did not come: every
                // minute, so a stream's last rows wait at most that long.
                // Boxed: unboxed, the service future overflows the compiler's layout query depth
                // in optimized builds (as the consumer's and the ingester's services do).
                let settled = Box::pin(scheduled.settle_received_and_page(SETTLE_IN_OPERATIONS));
                let settled = settled.await;
                let round = shared::operations::work(operations, until, OPERATIONS_PER_ROUND).await;
                return Ok(match round {
                    Ok(round) => serde_json::json!({ "operations": round, "settled": settled }),
                    Err(e) => {
                        tracing::error!(error = %e, "could not claim the bulk operations due");
                        serde_json::json!({ "operations": null, "error": e.to_string(), "settled": settled })
                    }
                });
            }
            let report = scheduled.run(deadline).await;
            println!(
                "{}",
                report.emf(&config.metrics_namespace, scheduled.clock.now())
            );
            Ok::<_, Error>(report.to_json())
        }),
    )
    .await
}
