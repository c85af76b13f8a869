//! The command line: what an operator can ask for, and the selection a bulk command works on.
//!
//! Invariant: every number and every reason is checked here, by clap, before anything is
//! asked of the API: a rate is finite and within the API's throttle, a limit and a group id
//! are within what the API takes, a time is RFC 3339, a reason is what the API keeps. A bad
//! value is a usage error (exit 2) naming the flag, never a panic.

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// The fastest `--rate`, letters per second: the API's throttle (`ThrottlingRateLimit` in
/// `template.yaml`, 20 requests/s), one request per letter.
pub const MAX_RATE: f64 = 20.0;
/// The slowest `--rate`: one letter every 1,000 s.
pub const MIN_RATE: f64 = 0.001;
/// The most letters `dlq list` reads (page by page).
pub const MAX_LIST: usize = 10_000;
/// The most groups `dlq groups` shows: one page of the API (its `limit` maximum).
pub const MAX_GROUPS: usize = 200;
/// The longest reason the API keeps, in characters (after trimming).
pub const MAX_REASON_CHARS: usize = 1000;

/// `--rate`: letters per second, a finite number from [`MIN_RATE`] to [`MAX_RATE`].
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of letters per second, such as 5 or 0.5"))?;
    if !rate.is_finite() || rate <= 0.0 {
        return Err(format!(
            "{s:?} is not a positive finite number of letters per second; give one from \
             {MIN_RATE} to {MAX_RATE}"
        ));
    }
    if rate > MAX_RATE {
        return Err(format!(
            "{s} letters per second is faster than the API's throttle ({MAX_RATE} requests/s, \
             one per letter); give at most {MAX_RATE}"
        ));
    }
    if rate < MIN_RATE {
        return Err(format!(
            "{s} letters per second is slower than one letter every {:.0} s; give at least \
             {MIN_RATE}",
            1.0 / MIN_RATE
        ));
    }
    Ok(rate)
}

fn count_in(s: &str, max: usize) -> Result<usize, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 && n <= max as u64 => Ok(n as usize),
        _ => Err(format!("{s:?} is not a whole number from 1 to {max}")),
    }
}

/// `dlq list --limit`: 1 to [`MAX_LIST`].
pub fn parse_list_limit(s: &str) -> Result<usize, String> {
    count_in(s, MAX_LIST)
}

/// `dlq groups --limit`: 1 to [`MAX_GROUPS`].
pub fn parse_group_limit(s: &str) -> Result<usize, String> {
    count_in(s, MAX_GROUPS)
}

/// A group id: a positive whole number (an `i64`, as the API's ids are).
pub fn parse_group_id(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a group id, a positive whole number such as 42 (see `dlq groups`)"
        )),
    }
}

/// A letter named on the command line: its whole id, or the first hex digits of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterId {
    /// A whole id.
    Whole(uuid::Uuid),
    /// The first 4 to 31 hex digits (dashes allowed).
    Prefix(String),
}

/// A letter id, or at least its first 4 hex digits.
pub fn parse_letter_id(s: &str) -> Result<LetterId, String> {
    let s = s.trim();
    if let Ok(id) = uuid::Uuid::try_parse(s) {
        return Ok(LetterId::Whole(id));
    }
    let digits = s.chars().filter(|c| *c != '-').count();
    if (4..32).contains(&digits) && s.chars().all(|c| c == '-' || c.is_ascii_hexdigit()) {
        return Ok(LetterId::Prefix(s.to_ascii_lowercase()));
    }
    Err(format!(
        "{s:?} is not a letter id: give the whole id (481e82ee-0733-4a23-bad4-7a61e82b1778) or at \
         least its first 4 hex digits (481e82ee)"
    ))
}

/// `--from` / `--before`: an RFC 3339 time, such as 2026-11-30T08:00:00Z.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| format!("{s:?} is not an RFC 3339 time such as 2026-11-30T08:00:00Z"))
}

/// `--reason`: what the API keeps (trimmed): plain text with something visible in it (no NUL,
/// no control character but tab and line breaks), at most [`MAX_REASON_CHARS`] characters. The
/// API checks again, more finely (invisible format characters).
pub fn parse_reason(s: &str) -> Result<String, String> {
    let reason = s.trim();
    if let Some(c) = reason
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(format!(
            "the reason contains the control character U+{:04X}; write plain text",
            u32::from(c)
        ));
    }
    if !reason.chars().any(|c| !c.is_whitespace()) {
        return Err(
            "the reason is blank: say why, for the next person who reads the letter".into(),
        );
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(format!(
            "the reason is {chars} characters; the API keeps at most {MAX_REASON_CHARS} (link \
             to a ticket for more)"
        ));
    }
    Ok(reason.to_owned())
}

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
    /// Replay letters pending review (same job id: a job that already committed is not sent).
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
    /// Discard letters pending review, with a reason.
    Discard {
        /// Which letters.
        #[command(flatten)]
        bulk: Bulk,
        /// Why they need no replay (kept on every letter; at most 1000 characters). Required
        /// unless --dry-run.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<String>,
    },
}

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
