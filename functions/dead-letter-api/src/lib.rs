//! The dead-letter API's three Lambdas, one per permission, so each role holds only what its
//! routes need: only [`run_replay`] builds an SQS client. The API is [`api`].

use lambda_http::Error;
pub mod api;

use api::{Api, lambda::serve};
use shared::clock::{Clock, SystemClock};
use shared::config::{ApiConfig, Env, or_exit};
use shared::replay::Replayer;
use std::sync::Arc;
use std::time::Duration;

fn init() -> (sqlx::PgPool, Arc<dyn Clock>, Duration) {
    shared::telemetry::init();
    let config = or_exit(ApiConfig::from_env(&Env::process()));
    let pool = or_exit(config.database.lazy_pool());
    (pool, Arc::new(SystemClock), config.lock_wait)
}

/// `GET /v1/core/dead-letters` and `GET /v1/core/dead-letters/{id}`.
pub async fn run_read() -> Result<(), Error> {
    let (pool, clock, lock_wait) = init();
    serve(Api::read(pool, clock, lock_wait)).await
}

/// `POST /v1/core/dead-letters/{id}/replay`.
pub async fn run_replay() -> Result<(), Error> {
    let (pool, clock, lock_wait) = init();
    let sqs = aws_sdk_sqs::Client::new(&aws_config::load_from_env().await);
    serve(Api::replay(pool, clock, lock_wait, Replayer::new(sqs))).await
}

/// `POST /v1/core/dead-letters/{id}/discard`.
pub async fn run_discard() -> Result<(), Error> {
    let (pool, clock, lock_wait) = init();
    serve(Api::discard(pool, clock, lock_wait)).await
}
