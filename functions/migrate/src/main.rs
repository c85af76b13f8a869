//! The Lambda entry point; everything is in [`migrate::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(migrate::run()).await
}
