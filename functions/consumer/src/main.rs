//! The Lambda entry point; everything is in [`consumer::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    consumer::run().await
}
