//! The local stack kept running (`bash scripts/stack.sh up`): every consumer the workspace
//! declares (`migrate::consumers::CONSUMERS`), each its own Lambda binary, and its DLQ ingester
//! on the local SQS API, fed continuously like the event source mappings; the scheduled function
//! on a timer, and its bulk operations' round (`{"work": "operations"}`) again and again beside
//! it, so an operation `dlq` starts is worked within seconds; and the dead-letter API over HTTP
//! through the local gateway, so curl and `dlq` work against it with a development token.
//!
//! It writes `stack.env` in its state directory (`export` lines: the API's URL, the tokens, the
//! queues, the database, the SQS endpoint) and runs until SIGTERM or SIGINT.

use crate::gateway::{DevToken, Gateway};
use crate::stack::{Binaries, Stack, StackSpec};
use futures_util::future::join_all;
use migrate::consumers::CONSUMERS;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// The pause between two rounds of the bulk operations' worker (each works up to 10 s): on AWS
/// its schedule runs it every minute; locally an operation `dlq` follows moves at once.
const OPERATIONS_EVERY: Duration = Duration::from_secs(2);

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
    /// The base of the job queues' names: each consumer's is this followed by its
    /// `local-queue-suffix` (the reference consumer's is this one).
    pub queue: String,
}

/// Starts everything, writes `stack.env`, and serves until told to stop.
pub async fn run(spec: LocalStackSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(&spec.state_dir)?;
    let binaries = Binaries::beside_current_exe();
    binaries.missing(CONSUMERS).map_err(std::io::Error::other)?;
    let mut base = StackSpec::time_scaled(binaries.clone(), &spec.database_url, &spec.queue);
    base.log_dir = Some(spec.state_dir.join("logs"));
    let mut stacks = Vec::with_capacity(CONSUMERS.len());
    for consumer in CONSUMERS {
        let queue = format!("{}{}", spec.queue, consumer.local_queue_suffix);
        let own = base.for_consumer(consumer, &queue, binaries.own_binary(consumer));
        stacks.push(Stack::start(own).await);
    }
    if stacks.is_empty() {
        return Err(std::io::Error::other("the workspace declares no consumer"));
    }
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
    let queues: Vec<&str> = stacks.iter().map(|s| s.jobs.url.as_str()).collect();
    println!(
        "local stack up: API {} (tokens in {}), queues {}",
        gateway.url,
        env_file.display(),
        queues.join(", ")
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut last_run = tokio::time::Instant::now();
    let serve = async {
        loop {
            // A poll is never cut off mid-invocation but by a signal to stop: a batch a function
            // is working on would come back as duplicates.
            let polled = tokio::select! {
                _ = term.recv() => break,
                _ = interrupt.recv() => break,
                polled = join_all(stacks.iter().map(Stack::poll)) => polled,
            };
            for (stack, (jobs, dlq)) in stacks.iter().zip(polled) {
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
    };
    // The bulk operations' worker, in a sandbox of its own beside the polls and the scheduled
    // run (as its own schedule's invocations run on AWS); cut off by a signal to stop, which an
    // operation survives (its next round goes on from its last chunk).
    let operations = async {
        loop {
            match stacks[0].work_operations().await {
                Ok(report) if worked_any(&report) => println!("operations: {report}"),
                Ok(_) => {}
                Err(e) => println!("operations failed: {e}"),
            }
            tokio::time::sleep(OPERATIONS_EVERY).await;
        }
    };
    tokio::select! {
        () = serve => {}
        () = operations => {}
    }
    let _ = std::fs::remove_file(&env_file);
    println!("local stack down");
    Ok(())
}

/// Whether an operations round's report says it did or met anything (an idle one is not
/// printed).
fn worked_any(report: &serde_json::Value) -> bool {
    let round = &report["operations"];
    round.is_null() || round["operations"] != 0 || round["failed"] != 0
}

fn env_lines(
    spec: &LocalStackSpec,
    stacks: &[Stack],
    gateway: &Gateway,
    operator: &DevToken,
    reader: &DevToken,
) -> String {
    let mut out = String::from("# The local stack (bash scripts/stack.sh env prints this).\n");
    let mut vars = vec![
        ("DLQ_API_URL".to_owned(), gateway.url.clone()),
        ("DLQ_TOKEN".to_owned(), operator.token.clone()),
        ("DLQ_READ_TOKEN".to_owned(), reader.token.clone()),
    ];
    // AWARD_POINTS_QUEUE_URL, REDEEM_REWARD_QUEUE_URL, …: one per consumer, by its name.
    vars.extend(stacks.iter().map(|stack| {
        (
            queue_url_variable(&stack.consumer_name),
            stack.jobs.url.clone(),
        )
    }));
    vars.push(("DATABASE_URL".to_owned(), spec.database_url.clone()));
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

/// The `stack.env` variable with the job queue's URL of the consumer `name`:
/// `redeem-reward` → `REDEEM_REWARD_QUEUE_URL`.
pub fn queue_url_variable(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c.to_ascii_uppercase(),
            _ => '_',
        })
        .collect();
    format!("{upper}_QUEUE_URL")
}
