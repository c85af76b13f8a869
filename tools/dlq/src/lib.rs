//! `dlq`, the on-call operator's tool over the dead-letter API: find a letter from what a ticket
//! names (job, correlation id, tenant, message), see failures grouped as they page, and replay
//! or discard a whole group (or any filter) in bulk: a dry run first, a pinned set, a rate, a
//! progress bar, a summary and an exit status a script can use.
//!
//! Invariant: nothing is changed but through the API's one-letter replay, edit and discard
//! routes, so every guarantee of a single replay (same job id, the fence, a 409 for a letter
//! already reviewed) holds for every letter of a bulk run and for an edit.

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
