//! The Lambda entry point; everything is in [`dead_letter_api::run_discard`].

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    Box::pin(dead_letter_api::run_discard()).await
}
