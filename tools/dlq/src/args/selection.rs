//! The selection a list or a bulk command works on: its filters, and how a bulk command goes.

use super::values::{parse_group_id, parse_time, rfc3339, shell_word};
use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};

/// Filters that narrow a list or a bulk selection.
#[derive(Debug, Clone, Default, Args)]
pub struct Filter {
    /// Letters of this failure group.
    #[arg(long, value_parser = parse_group_id)]
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
    #[arg(long, value_parser = parse_time)]
    pub from: Option<DateTime<Utc>>,
    /// Written strictly before (RFC 3339). A bulk operation takes only letters written before
    /// it started, whatever this says: letters written while it runs are not picked up.
    #[arg(long, value_parser = parse_time)]
    pub before: Option<DateTime<Utc>>,
}

impl Filter {
    /// Whether any filter is set (a bulk command refuses to touch every letter unasked; the API
    /// too).
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

    /// The bulk operation's `filter`: the list's query parameters as a JSON object of strings.
    pub fn operation_filter(&self) -> serde_json::Map<String, serde_json::Value> {
        self.query()
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect()
    }

    /// The same filter as command-line flags, to say how to run a command on it.
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

/// How a bulk command runs.
#[derive(Debug, Clone, Args)]
pub struct Bulk {
    /// Which letters (always only those pending review).
    #[command(flatten)]
    pub filter: Filter,
    /// Show the plan (how many letters, of which kinds) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Start the operation and exit without following it (it runs server-side either way).
    #[arg(long)]
    pub detach: bool,
    /// How the progress shows.
    #[arg(long, value_enum, default_value_t = Progress::Auto)]
    pub progress: Progress,
}

/// Whether to draw a progress bar while following an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Progress {
    /// A bar on a terminal; nothing until the summary otherwise.
    Auto,
    /// A line on stderr each time the operation moves instead (for logs).
    Lines,
    /// Nothing until the summary.
    None,
}
