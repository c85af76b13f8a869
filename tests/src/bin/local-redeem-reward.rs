//! The redeem-reward consumer, built as a binary of this package so that the end-to-end runs
//! always use the current code (`CARGO_BIN_EXE_local-redeem-reward`). Same code as
//! `functions/redeem-reward`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(shared::run::run_consumer(redeem_reward::RedeemReward::new)).await
}
