//! The DLQ ingester function, built as a binary of this package so that the end-to-end tests
//! always run the current code. Same code as `functions/dlq-ingester`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(dlq_ingester::run()).await
}
