//! `dlq`, the on-call operator's tool over the dead-letter API: find a letter from what a ticket
//! names (job, correlation id, tenant, message), see failures grouped as they page, and replay
//! or discard a whole group (or any filter) in bulk: a dry run first, then one operation worked
//! server-side, followed with a progress bar (its rate, the time left) until it ends, a summary
//! and an exit status a script can use.
//!
//! Invariant: nothing is changed but through the API: its one-letter edit route, and its bulk
//! operations, which review each letter with every guarantee of a one-letter review (same job
//! id, the fence, a letter reviewed once). Following an operation only reads it: interrupting
//! `dlq` never stops one; `dlq cancel` does.

#![warn(missing_docs)]

pub mod args;
pub mod bulk;
pub mod client;
mod commands;
pub mod edit;
pub mod exit;
pub mod table;
pub mod terminal;

use args::Cli;
use std::process::ExitCode;
use terminal::{Newlines, shown};

/// Runs the command line; the exit status says how it went.
pub async fn run(cli: Cli) -> ExitCode {
    match commands::run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("dlq: {}", shown(&message, Newlines::Keep));
            ExitCode::from(exit::USAGE)
        }
    }
}
