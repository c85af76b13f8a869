//! The selection a list or a bulk command works on: its filters, and how a bulk run goes.

use super::values::{parse_group_id, parse_rate, parse_time, rfc3339, shell_word};
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
    /// Written strictly before (RFC 3339). A bulk command pins its set here (now, if not
    /// given), so letters written while it runs are not picked up; rerun with the same value to
    /// finish an interrupted run.
    #[arg(long, value_parser = parse_time)]
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
    /// Letters per second at most: from 0.001 to 20, the API's throttle.
    #[arg(long, default_value_t = 5.0, value_parser = parse_rate)]
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
