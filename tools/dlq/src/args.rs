//! The command line: what an operator can ask for, and the selection a bulk command works on.

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Find dead letters, see their failure groups, and replay or discard them one by one or in
/// bulk, through the dead-letter API.
#[derive(Debug, Parser)]
#[command(name = "dlq", version, about, long_about = None)]
pub struct Cli {
    /// The API's base URL (the stack's DeadLetterApiUrl output; locally http://127.0.0.1:8787).
    #[arg(long, env = "DLQ_API_URL", global = true)]
    pub api: Option<String>,
    /// An access token with the scopes the command needs (core.dead_letters.read, .replay,
    /// .discard). Prefer the environment: a flag shows in the shell's history.
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
        /// At most this many (all pages are read up to it).
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one letter whole: payload, errors, fence, its group.
    Show {
        /// The letter's id.
        id: uuid::Uuid,
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
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one failure group and its pending letters.
    Group {
        /// The group's id.
        id: i64,
    },
    /// Replay letters pending review (same job id: a job that already committed is not sent).
    Replay {
        /// Which letters.
        #[command(flatten)]
        bulk: Bulk,
        /// Why (kept on every letter). Required unless --dry-run.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Discard letters pending review, with a reason.
    Discard {
        /// Which letters.
        #[command(flatten)]
        bulk: Bulk,
        /// Why they need no replay (kept on every letter). Required unless --dry-run.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Filters that narrow a list or a bulk selection.
#[derive(Debug, Clone, Default, Args)]
pub struct Filter {
    /// Letters of this failure group.
    #[arg(long)]
    pub group: Option<i64>,
    /// Of this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Of this consumer.
    #[arg(long)]
    pub consumer: Option<String>,
    /// Of this error kind (poison, permanent, exhausted, crashed).
    #[arg(long)]
    pub kind: Option<String>,
    /// Of this job.
    #[arg(long)]
    pub job_id: Option<uuid::Uuid>,
    /// With this correlation id.
    #[arg(long)]
    pub correlation_id: Option<String>,
    /// Of this tenant.
    #[arg(long)]
    pub tenant_id: Option<uuid::Uuid>,
    /// Written for this SQS message.
    #[arg(long)]
    pub message_id: Option<String>,
    /// Written at or after (RFC 3339).
    #[arg(long)]
    pub from: Option<DateTime<Utc>>,
    /// Written strictly before (RFC 3339). A bulk command pins its set here (now, if not
    /// given), so letters written while it runs are not picked up; rerun with the same value to
    /// finish an interrupted run.
    #[arg(long)]
    pub before: Option<DateTime<Utc>>,
}

impl Filter {
    /// Whether any filter is set (a bulk command refuses to touch every letter unasked).
    pub fn is_empty(&self) -> bool {
        self.group.is_none()
            && self.queue.is_none()
            && self.consumer.is_none()
            && self.kind.is_none()
            && self.job_id.is_none()
            && self.correlation_id.is_none()
            && self.tenant_id.is_none()
            && self.message_id.is_none()
            && self.from.is_none()
            && self.before.is_none()
    }

    /// The list endpoint's query pairs for this filter.
    pub fn query(&self) -> Vec<(String, String)> {
        let mut q = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                q.push((k.to_owned(), v));
            }
        };
        put("group_id", self.group.map(|g| g.to_string()));
        put("queue", self.queue.clone());
        put("consumer", self.consumer.clone());
        put("error_kind", self.kind.clone());
        put("job_id", self.job_id.map(|j| j.to_string()));
        put("correlation_id", self.correlation_id.clone());
        put("tenant_id", self.tenant_id.map(|t| t.to_string()));
        put("message_id", self.message_id.clone());
        put("created_from", self.from.map(rfc3339));
        put("created_before", self.before.map(rfc3339));
        q
    }

    /// The same filter as command-line flags, to say how to rerun a command.
    pub fn flags(&self) -> String {
        let mut f = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                f.push(format!("--{k} {}", shell_word(&v)));
            }
        };
        put("group", self.group.map(|g| g.to_string()));
        put("queue", self.queue.clone());
        put("consumer", self.consumer.clone());
        put("kind", self.kind.clone());
        put("job-id", self.job_id.map(|j| j.to_string()));
        put("correlation-id", self.correlation_id.clone());
        put("tenant-id", self.tenant_id.map(|t| t.to_string()));
        put("message-id", self.message_id.clone());
        put("from", self.from.map(rfc3339));
        put("before", self.before.map(rfc3339));
        f.join(" ")
    }
}

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+=@".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A time as the API takes it, to the microsecond (a pin must not round).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// How a bulk command runs.
#[derive(Debug, Clone, Args)]
pub struct Bulk {
    /// Which letters (always only those pending review).
    #[command(flatten)]
    pub filter: Filter,
    /// Say what would happen and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Letters per second at most.
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// How the progress shows.
    #[arg(long, value_enum, default_value_t = Progress::Auto)]
    pub progress: Progress,
}

/// Whether to draw a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Progress {
    /// On a terminal only.
    Auto,
    /// A line per letter on stderr instead (for logs).
    Lines,
    /// Nothing until the summary.
    None,
}
