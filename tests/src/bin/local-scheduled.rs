//! The scheduled function, built as a binary of this package so the end-to-end tests always run
//! the current code. Same code as `functions/scheduled`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(scheduled::run()).await
}
