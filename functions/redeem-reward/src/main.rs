//! The Lambda entry point: the library runs the consumer.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(shared::run::run_consumer(redeem_reward::RedeemReward::new)).await
}
