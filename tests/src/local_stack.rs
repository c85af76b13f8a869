//! The local stack kept running (`bash scripts/stack.sh up`): both consumers and their DLQ
//! ingesters as real Lambda binaries on the local SQS API, fed continuously like the event
//! source mappings; the scheduled function on a timer; and the dead-letter API over HTTP through
//! the local gateway, so curl and `dlq` work against it with a development token.
//!
//! It writes `stack.env` in its state directory (`export` lines: the API's URL, the tokens, the
//! queues, the database, the SQS endpoint) and runs until SIGTERM or SIGINT.

use crate::gateway::{DevToken, Gateway};
use crate::stack::{Binaries, Stack, StackSpec};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// How the local stack runs.
#[derive(Debug, Clone)]
pub struct LocalStackSpec {
    /// The database (already migrated).
    pub database_url: String,
    /// Where `stack.env` and the functions' logs go.
    pub state_dir: PathBuf,
    /// Where the gateway listens.
    pub gateway: SocketAddr,
    /// How often the scheduled function runs.
    pub schedule: Duration,
    /// The reference consumer's job queue; redeem-reward's is `<it>-redeem`.
    pub queue: String,
}

/// Starts everything, writes `stack.env`, and serves until told to stop.
pub async fn run(spec: LocalStackSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(&spec.state_dir)?;
    let mut award = StackSpec::time_scaled(
        Binaries::beside_current_exe(),
        &spec.database_url,
        &spec.queue,
    );
    award.log_dir = Some(spec.state_dir.join("logs"));
    let redeem = award.redeem_reward(&format!("{}{}", spec.queue, crate::demo::REDEEM_SUFFIX));
    let stacks = [Stack::start(award).await, Stack::start(redeem).await];
    let (operator, reader) = DevToken::local_pair();
    let gateway = Gateway::start(
        stacks[0].api.clone(),
        &[operator.clone(), reader.clone()],
        spec.gateway,
    )
    .await?;
    let env_file = spec.state_dir.join("stack.env");
    std::fs::write(
        &env_file,
        env_lines(&spec, &stacks, &gateway, &operator, &reader),
    )?;
    println!(
        "local stack up: API {} (tokens in {}), queues {} and {}",
        gateway.url,
        env_file.display(),
        stacks[0].jobs.url,
        stacks[1].jobs.url
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut last_run = tokio::time::Instant::now();
    loop {
        // A poll is never cut off mid-invocation but by a signal to stop: a batch a function
        // is working on would come back as duplicates.
        let polled = tokio::select! {
            _ = term.recv() => break,
            _ = interrupt.recv() => break,
            polled = async { tokio::join!(stacks[0].poll(), stacks[1].poll()) } => polled,
        };
        for (stack, (jobs, dlq)) in stacks.iter().zip([polled.0, polled.1]) {
            if jobs.received + dlq.received > 0 {
                println!(
                    "{}: {} record(s) in, {} done, {} back; its DLQ: {} in",
                    stack.jobs.name, jobs.received, jobs.deleted, jobs.left, dlq.received
                );
            }
        }
        if last_run.elapsed() >= spec.schedule {
            last_run = tokio::time::Instant::now();
            match stacks[0].tick().await {
                Ok(report) => println!("scheduled: {report}"),
                Err(e) => println!("scheduled failed: {e}"),
            }
        }
    }
    let _ = std::fs::remove_file(&env_file);
    println!("local stack down");
    Ok(())
}

fn env_lines(
    spec: &LocalStackSpec,
    stacks: &[Stack; 2],
    gateway: &Gateway,
    operator: &DevToken,
    reader: &DevToken,
) -> String {
    let mut out = String::from("# The local stack (bash scripts/stack.sh env prints this).\n");
    let vars = [
        ("DLQ_API_URL", gateway.url.clone()),
        ("DLQ_TOKEN", operator.token.clone()),
        ("DLQ_READ_TOKEN", reader.token.clone()),
        ("AWARD_POINTS_QUEUE_URL", stacks[0].jobs.url.clone()),
        ("REDEEM_REWARD_QUEUE_URL", stacks[1].jobs.url.clone()),
        ("DATABASE_URL", spec.database_url.clone()),
    ];
    for (name, value) in vars {
        let _ = writeln!(out, "export {name}={}", crate::shell_word(&value));
    }
    for name in [
        "AWS_ENDPOINT_URL_SQS",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        if let Ok(value) = std::env::var(name) {
            let _ = writeln!(out, "export {name}={}", crate::shell_word(&value));
        }
    }
    out
}
