//! The command line: what an operator can ask for, and the selection a bulk command works on.
//!
//! Invariant: every number and every reason is checked here, by clap, before anything is
//! asked of the API: a limit and a group id are within what the API takes, a time is RFC 3339,
//! an id is a UUID or its first hex digits, a reason is what the API keeps. A bad value is a
//! usage error (exit 2) naming the flag, never a panic.

mod selection;
mod values;

pub use selection::{Bulk, Filter, Progress};
pub use values::{
    LetterId, MAX_GROUPS, MAX_LIST, MAX_REASON_CHARS, OperationId, parse_group_id,
    parse_group_limit, parse_letter_id, parse_list_limit, parse_operation_id, parse_reason,
    parse_time, rfc3339, shell_word,
};

use clap::{Parser, Subcommand};

/// Find dead letters, see their failure groups, and replay or discard them one by one or in
/// bulk, through the dead-letter API.
#[derive(Debug, Parser)]
#[command(name = "dlq", version, about, long_about = None)]
pub struct Cli {
    /// The API's base URL (the stack's DeadLetterApiUrl output; locally http://127.0.0.1:8787).
    #[arg(long, env = "DLQ_API_URL", global = true)]
    pub api: Option<String>,
    /// An access token with the scopes the command needs (core.dead_letters.read, .replay,
    /// .discard, .edit). Prefer the environment: a flag shows in the shell's history.
    #[arg(long, env = "DLQ_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// JSON on stdout instead of tables (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List letters, newest first.
    List {
        /// Which letters.
        #[command(flatten)]
        filter: Filter,
        /// Only this review status (pending_review, replayed, discarded).
        #[arg(long)]
        status: Option<String>,
        /// At most this many, 1 to 10000 (all pages are read up to it).
        #[arg(long, default_value_t = 50, value_parser = parse_list_limit)]
        limit: usize,
    },
    /// Show one letter whole: payload, errors, fence, its group.
    Show {
        /// The letter's id, or its first hex digits (at least 4) if no other letter's id starts
        /// with them, as git takes a commit's: `dlq show 481e82ee`.
        #[arg(value_parser = parse_letter_id)]
        id: LetterId,
    },
    /// List failure groups, the latest first.
    Groups {
        /// open (default), resolved or all.
        #[arg(long, default_value = "open")]
        status: String,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only this error kind.
        #[arg(long)]
        kind: Option<String>,
        /// At most this many, 1 to 200.
        #[arg(long, default_value_t = 50, value_parser = parse_group_limit)]
        limit: usize,
    },
    /// Show one failure group and its pending letters.
    Group {
        /// The group's id.
        #[arg(value_parser = parse_group_id)]
        id: i64,
    },
    /// Replay the letters pending review a filter selects, as one bulk operation worked
    /// server-side (same job id: a job that already committed is not sent), and follow it.
    Replay {
        /// Which letters.
        #[command(flatten)]
        bulk: Bulk,
        /// Why (kept on every letter; at most 1000 characters). Required unless --dry-run.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<String>,
    },
    /// Correct one letter's body in $EDITOR and replay it under the same job (as `kubectl
    /// edit`): the diff and the API's plan first, then a confirmation. Needs the scope
    /// core.dead_letters.edit.
    Edit {
        /// The letter's id, or its first hex digits (at least 4).
        #[arg(value_parser = parse_letter_id)]
        id: LetterId,
        /// What was wrong and why the edit fixes it (kept with the replay; at most 1000
        /// characters). Required unless --dry-run.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<String>,
        /// Read the edited envelope from this file instead of opening $VISUAL / $EDITOR.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// Show the diff and the plan (the API checks the edit), change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask before replaying.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Discard the letters pending review a filter selects, with a reason, as one bulk
    /// operation worked server-side, and follow it.
    Discard {
        /// Which letters.
        #[command(flatten)]
        bulk: Bulk,
        /// Why they need no replay (kept on every letter; at most 1000 characters). Required
        /// unless --dry-run.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<String>,
    },
    /// List the latest bulk operations (replays and discards), newest first, with their
    /// progress.
    Operations,
    /// Show one bulk operation and its progress; --follow shows it until it ends.
    Operation {
        /// The operation's id, or its first hex digits (at least 4) among the latest ones.
        #[arg(value_parser = parse_operation_id)]
        id: OperationId,
        /// Follow its progress until it ends (Ctrl-C stops following, not the operation).
        #[arg(long, short = 'f')]
        follow: bool,
        /// How the progress shows with --follow.
        #[arg(long, value_enum, default_value_t = Progress::Auto)]
        progress: Progress,
    },
    /// Stop a running bulk operation, with a reason: what it did stays done, the rest of its
    /// letters stay pending. Needs the scope of its action (replay or discard).
    Cancel {
        /// The operation's id, or its first hex digits (at least 4) among the latest ones.
        #[arg(value_parser = parse_operation_id)]
        id: OperationId,
        /// Why it is stopped (kept on the operation; at most 1000 characters).
        #[arg(long, value_parser = parse_reason)]
        reason: String,
    },
}
