//! The migrate function, built as a binary of this package so that the end-to-end tests always
//! run the current code (`CARGO_BIN_EXE_local-migrate`). Same code as `functions/migrate`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(migrate::run()).await
}
