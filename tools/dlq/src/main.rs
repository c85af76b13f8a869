//! `dlq`: see [`dlq`] (the crate's documentation) and `docs/operations.md`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dlq::run(dlq::args::Cli::parse()).await
}
