//! The operators' tool `dlq`, built as a binary of this package so that the end-to-end tests and
//! the demo always run the current code (`CARGO_BIN_EXE_local-dlq`). Same code as `tools/dlq`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dlq::run(dlq::args::Cli::parse()).await
}
