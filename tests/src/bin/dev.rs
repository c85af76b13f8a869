//! `dev`: the consumer author's dev loop, behind `bash scripts/dev.sh` (see `e2e::dev`).

use clap::{Parser, Subcommand};
use e2e::dev::{self, Kind};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    about = "The consumer dev loop: prepare a dev database and queue, send jobs to the consumer cargo lambda watch serves"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Migrates DATABASE_URL, creates the consumer's dev queue, prints its function's environment.
    Prepare {
        /// The consumer: its name, package or binary.
        consumer: String,
    },
    /// Sends jobs to the consumer's dev queue, feeds them to it, says what became of each.
    Send {
        /// The consumer: its name, package or binary.
        consumer: String,
        /// What to send.
        #[arg(value_enum, default_value = "valid")]
        kind: Kind,
        /// The payload (JSON) instead of the consumer's dev-payload / dev-failing-payload.
        #[arg(long)]
        payload: Option<String>,
        /// Where cargo lambda watch listens.
        #[arg(long, env = "DEV_WATCH_ADDR", default_value = "127.0.0.1:9000")]
        watch: String,
        /// How long to wait for every job to settle, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let Ok(database_url) = std::env::var("DATABASE_URL") else {
        eprintln!("dev: DATABASE_URL is not set (bash scripts/dev.sh sets it)");
        return ExitCode::from(78);
    };
    let outcome = match cli.command {
        Command::Prepare { consumer } => match dev::find(&consumer) {
            Ok(c) => dev::prepare(&database_url, c)
                .await
                .map(|env| (dev::exports(&env), true)),
            Err(e) => Err(e),
        },
        Command::Send {
            consumer,
            kind,
            payload,
            watch,
            timeout,
        } => {
            let payload = match payload.as_deref().map(serde_json::from_str).transpose() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("dev: --payload is not JSON: {e}");
                    return ExitCode::from(2);
                }
            };
            match dev::find(&consumer) {
                Ok(c) => {
                    let timeout = Duration::from_secs(timeout);
                    dev::send(&database_url, c, kind, payload, &watch, timeout).await
                }
                Err(e) => Err(e),
            }
        }
    };
    match outcome {
        Ok((text, settled)) => {
            print!("{text}");
            if settled {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("dev: {e}");
            ExitCode::from(1)
        }
    }
}
