//! The dead-letter API functions, built as one binary of this package so the end-to-end tests
//! always run the current code. It serves as the function named by `AWS_LAMBDA_FUNCTION_NAME`
//! (`dead-letters-read`, `-replay` or `-discard`), with the same code as the real binaries.

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let name = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    match name.as_str() {
        "dead-letters-read" => Box::pin(dead_letter_api::run_read()).await,
        "dead-letters-replay" => Box::pin(dead_letter_api::run_replay()).await,
        "dead-letters-discard" => Box::pin(dead_letter_api::run_discard()).await,
        other => Err(format!("unknown API function {other:?}").into()),
    }
}
