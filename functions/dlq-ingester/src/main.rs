//! The Lambda entry point; everything is in [`dlq_ingester::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    dlq_ingester::run().await
}
