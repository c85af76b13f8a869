//! `local-stack`: the local stack kept running, for `bash scripts/stack.sh up` (see
//! `e2e::local_stack`). Migrates `DATABASE_URL` as a deploy does, then serves until SIGTERM.
//! Settings: `LOCAL_STACK_DIR` (state: stack.env and logs), `GATEWAY_ADDR` (127.0.0.1:8787),
//! `SCHEDULE_SECONDS` (60), `LOCAL_QUEUE_NAME` (local-award-points-jobs: not the demo's).

use e2e::local_stack::{LocalStackSpec, run};
use std::time::Duration;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let Ok(database_url) = std::env::var("DATABASE_URL") else {
        eprintln!("local-stack: DATABASE_URL: is not set");
        return std::process::ExitCode::from(78);
    };
    let gateway = match var("GATEWAY_ADDR", "127.0.0.1:8787").parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("local-stack: GATEWAY_ADDR: {e}");
            return std::process::ExitCode::from(78);
        }
    };
    let schedule = match var("SCHEDULE_SECONDS", "60").parse::<u64>() {
        Ok(s) if s > 0 => Duration::from_secs(s),
        _ => {
            eprintln!("local-stack: SCHEDULE_SECONDS: must be a positive number of seconds");
            return std::process::ExitCode::from(78);
        }
    };
    if let Err(e) = e2e::demo::migrate(&database_url).await {
        eprintln!("local-stack: {e}");
        return std::process::ExitCode::from(1);
    }
    let spec = LocalStackSpec {
        database_url,
        state_dir: var("LOCAL_STACK_DIR", ".tools/stack").into(),
        gateway,
        schedule,
        queue: var("LOCAL_QUEUE_NAME", "local-award-points-jobs"),
    };
    match run(spec).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("local-stack: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
