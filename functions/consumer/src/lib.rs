//! The reference consumer (award points) as a Lambda on its SQS event source. Everything but
//! the consumer itself is the library's: see `shared::run::run_consumer`.

use shared::reference::AwardPoints;

/// Serves invocations until the runtime stops. A configuration error stops the process with
/// the variable's name (exit status 78).
pub async fn run() -> Result<(), lambda_runtime::Error> {
    shared::run::run_consumer(AwardPoints::new).await
}
