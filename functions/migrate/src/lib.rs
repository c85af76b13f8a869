//! The migrate function: applies the schema on deploy, once, before the new code serves.
//!
//! `template.yaml` runs it as a CloudFormation custom resource whose properties change with the
//! function's version, so every deploy that changes the migrations runs them, and every other
//! function depends on it: CloudFormation updates them only after it answered `SUCCESS`. A
//! failed migration answers `FAILED` with its error, which fails and rolls back the deploy. It
//! reaches the database as every function does (the VPC, the secret). Invoked directly (any
//! event without a `RequestType`), it migrates and returns what it applied: the way to rerun it
//! by hand.
//!
//! Invariant: migrations are additive (see `docs/deploy.md`), so the old functions keep working
//! while a deploy rolls out, and the old migrate function accepts the newer schema on a rollback
//! (it refuses only a known migration whose content changed); the schema is never dropped,
//! deleting the stack included.

pub mod consumers;
pub mod custom_resource;
pub mod schema;

use custom_resource::{Request, RequestType, Response};
use futures_util::FutureExt;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};
use shared::config::{DatabaseConfig, Env, or_exit};
use shared::db::Database;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time kept free before the Lambda deadline to answer CloudFormation.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Migrates, within `budget`: what it applied, the invalid indexes it repaired and the applied
/// migrations it does not know (a newer release's, on a rollback) as JSON, or the reason it
/// failed.
pub async fn migrate(database: &Database, budget: Duration) -> Result<Value, String> {
    let work = async {
        database
            .ready()
            .await
            .map_err(|e| format!("the database is not reachable: {e}"))?;
        // Cut off by the budget, the connection is closed, not given back inside a migration's
        // transaction: a warm function's next invocation would migrate inside it.
        let mut conn = shared::db::acquire(database.pool())
            .await
            .map_err(|e| format!("no database connection: {e}"))?;
        let applied = schema::apply(&mut conn).await;
        conn.give_back();
        let report = applied.map_err(|e| e.to_string())?;
        Ok::<_, String>(json!({
            "Applied": report.applied.len(),
            "Migrations": report.applied,
            "RepairedIndexes": report.repaired,
            "UnknownApplied": report.unknown,
            "Rebaselined": report.rebaselined,
        }))
    };
    match tokio::time::timeout(budget, AssertUnwindSafe(work).catch_unwind()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err("the migrate function panicked; see its log".into()),
        Err(_) => Err(format!(
            "the migrations did not finish within {} s (a lock held by live traffic?); nothing \
             that did not finish was recorded",
            budget.as_secs()
        )),
    }
}

/// Handles one invocation: a CloudFormation request (answered at its `ResponseURL`), or a
/// direct invoke (answered in the response).
pub async fn handle(
    event: Value,
    database: &Database,
    http: &reqwest::Client,
    budget: Duration,
) -> Result<Value, Error> {
    if event.get("RequestType").is_none() {
        return migrate(database, budget).await.map_err(Error::from);
    }
    let request: Request = serde_json::from_value(event)
        .map_err(|e| format!("not a CloudFormation custom resource request: {e}"))?;
    let outcome = match request.request_type {
        RequestType::Delete => {
            Ok(json!({ "Deleted": "nothing: the schema and its data stay when the stack goes" }))
        }
        RequestType::Create | RequestType::Update => migrate(database, budget).await,
    };
    match &outcome {
        Ok(data) => tracing::info!(request = ?request.request_type, %data, "migrated"),
        Err(reason) => tracing::error!(request = ?request.request_type, reason, "migration failed"),
    }
    let response = Response::to(&request, outcome);
    custom_resource::send(http, &request.response_url, &response)
        .await
        .map_err(|e| format!("answering CloudFormation failed: {e}"))?;
    Ok(json!({ "Status": response.status }))
}

/// Builds everything once from the environment, then serves invocations.
pub async fn run() -> Result<(), Error> {
    shared::telemetry::init();
    let config = or_exit(DatabaseConfig::from_env(&Env::process()));
    let sdk = shared::aws::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let database = or_exit(Database::new(&config, &secrets));
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .build()?;
    let (database, http) = (&database, &http);
    // Boxed, as every function's service: the futures are deep enough to overflow the
    // compiler's layout query depth.
    Box::pin(shared::telemetry::otel::serve(
        lambda_runtime::layers::OpenTelemetryFaasTrigger::Other,
        service_fn(move |event: LambdaEvent<Value>| async move {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let left = Duration::from_millis(event.context.deadline).saturating_sub(now);
            // A deadline already past is a local emulator's (see shared::sqs::invocation_deadline).
            let left = if left.is_zero() {
                Duration::from_secs(300)
            } else {
                left
            };
            Box::pin(handle(
                event.payload,
                database,
                http,
                left.saturating_sub(ANSWER_MARGIN),
            ))
            .await
        }),
    ))
    .await
}
