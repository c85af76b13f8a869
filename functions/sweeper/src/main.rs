//! The Lambda entry point; everything is in [`sweeper::run`].

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    sweeper::run().await
}
