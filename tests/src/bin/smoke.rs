//! `smoke`: the deployer's smoke test against a deployed stack or the local one, behind
//! `bash scripts/smoke.sh` (see `e2e::smoke`).

use clap::Parser;
use e2e::smoke::{SmokeSpec, report, run};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    about = "After a deploy: a canary job to its fence, a poison job to its letter (discarded), the API read with a token"
)]
struct Cli {
    /// The consumer's job queue URL (a stack output: AwardPointsJobQueueUrl, …).
    #[arg(long, env = "SMOKE_QUEUE_URL")]
    queue_url: String,
    /// The operators' API (the stack output DeadLetterApiUrl).
    #[arg(long, env = "DLQ_API_URL")]
    api: String,
    /// A token with the scopes core.dead_letters.read and .discard.
    #[arg(long, env = "DLQ_TOKEN", hide_env_values = true)]
    token: String,
    /// The consumer (its CONSUMER_NAME).
    #[arg(long, default_value = "award-points")]
    consumer: String,
    /// The canary's payload (JSON); its effect is real, so make it harmless.
    #[arg(long, default_value = r#"{"account_id": "smoke-test", "points": 1}"#)]
    payload: String,
    /// Leave out the poison job and its letter (and so its incident).
    #[arg(long)]
    no_letter: bool,
    /// How long each step may take, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let payload = match serde_json::from_str(&cli.payload) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("smoke: --payload is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let spec = SmokeSpec {
        queue_url: cli.queue_url,
        api_url: cli.api,
        token: cli.token,
        consumer: cli.consumer,
        payload,
        with_letter: !cli.no_letter,
        timeout: Duration::from_secs(cli.timeout),
    };
    let sqs = aws_sdk_sqs::Client::new(&aws_config::load_from_env().await);
    let (text, passed) = report(&run(&spec, &sqs).await);
    print!("{text}");
    if passed {
        println!("smoke test passed");
        ExitCode::SUCCESS
    } else {
        println!("smoke test FAILED");
        ExitCode::from(1)
    }
}
