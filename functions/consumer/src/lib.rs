//! The reference consumer (award points) as a Lambda on its SQS event source, with its own
//! migrations (schema `reference`). Everything but the consumer itself is the library's: see
//! `shared::run::run_consumer`.

mod award;

pub use award::*;

use sqlx::migrate::Migrator;
use std::sync::LazyLock;

/// This consumer's migrations (schema `reference`), tracked in `reference._sqlx_migrations`.
pub static MIGRATOR: LazyLock<Migrator> =
    LazyLock::new(|| shared::own_migrations(sqlx::migrate!("./migrations"), "reference"));

/// The core schema's migrations and this consumer's: a test database of this consumer.
pub static MIGRATOR_WITH_CORE: LazyLock<Migrator> =
    LazyLock::new(|| shared::with_core_migrations(&MIGRATOR));

/// Serves invocations until the runtime stops. A configuration error stops the process with
/// the variable's name (exit status 78).
pub async fn run() -> Result<(), lambda_runtime::Error> {
    Box::pin(shared::run::run_consumer(AwardPoints::new)).await
}
