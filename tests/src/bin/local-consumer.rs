//! The consumer function, built as a binary of this package so that the end-to-end tests always
//! run the current code (`CARGO_BIN_EXE_local-consumer`). Same code as `functions/consumer`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(consumer::run()).await
}
