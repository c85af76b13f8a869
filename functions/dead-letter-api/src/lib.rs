//! The dead-letter API's three Lambdas, one per permission, so each role holds only what its
//! routes need: only [`run_replay`] builds an SQS client. The API is [`api`].

use lambda_http::Error;
pub mod api;

use api::{Api, lambda::serve};
use shared::clock::{Clock, SystemClock};
use shared::config::{ApiConfig, Env, or_exit};
use shared::db::Database;
use shared::replay::Replayer;
use std::sync::Arc;
use std::time::Duration;

/// What every API function builds at start: its configuration, the SDK (with timeouts), the
/// database (credentials read at run time), time.
struct Init {
    sdk: aws_config::SdkConfig,
    database: Database,
    clock: Arc<dyn Clock>,
    lock_wait: Duration,
}

async fn init() -> Init {
    shared::telemetry::init();
    let config = or_exit(ApiConfig::from_env(&Env::process()));
    let sdk = shared::aws::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let database = or_exit(Database::new(&config.database, &secrets));
    Init {
        sdk,
        database,
        clock: Arc::new(SystemClock),
        lock_wait: config.lock_wait,
    }
}

/// `GET /v1/core/dead-letters`, `/v1/core/dead-letters/{id}` and the failure groups.
pub async fn run_read() -> Result<(), Error> {
    let i = init().await;
    let api = Api::read(i.database.pool().clone(), i.clock, i.lock_wait);
    serve(api, i.database).await
}

/// `POST /v1/core/dead-letters/{id}/replay`.
pub async fn run_replay() -> Result<(), Error> {
    let i = init().await;
    let sqs = aws_sdk_sqs::Client::new(&i.sdk);
    let api = Api::replay(
        i.database.pool().clone(),
        i.clock,
        i.lock_wait,
        Replayer::new(sqs),
    );
    serve(api, i.database).await
}

/// `POST /v1/core/dead-letters/{id}/discard`.
pub async fn run_discard() -> Result<(), Error> {
    let i = init().await;
    let api = Api::discard(i.database.pool().clone(), i.clock, i.lock_wait);
    serve(api, i.database).await
}
