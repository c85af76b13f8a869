//! The consumer function as the demo, the soak and the end-to-end tests run it: the reference
//! consumer's harness and effect, current code (`CARGO_BIN_EXE_local-consumer`), with failures on
//! request ([`e2e::faulty_award`]). The deployed `consumer` binary has no such failures; see
//! `tests/tests/deployed_consumer.rs`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Box::pin(shared::run::run_consumer(
        e2e::faulty_award::AwardPointsWithFaults::new,
    ))
    .await
}
