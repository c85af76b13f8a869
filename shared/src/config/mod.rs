//! Configuration from environment variables, read once at start-up and validated.
//!
//! Invariant: a function with a bad configuration does not start. Every error names the
//! variable and says what is wrong, including a fence TTL that could let a late copy of a job
//! through (below [`crate::fence::ttl_floor`]) and a retry-policy override without a rationale.

mod alerts;
mod database;
mod fence;
mod functions;

pub use alerts::AlertConfig;
pub use database::{DatabaseConfig, DatabaseSource};
pub use fence::{FenceConfig, least_receive_count};
pub use functions::{
    ApiConfig, CommitMode, ConsumerConfig, DlqIngesterConfig, REPLAY_ALERT_AFTER, ScheduledConfig,
};

use crate::ids::ConsumerName;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The PostgreSQL connection URL (locally; deployed functions read [`DATABASE_SECRET_ARN`]).
pub const DATABASE_URL: &str = "DATABASE_URL";
/// The Secrets Manager secret holding the database credentials, read at run time.
pub const DATABASE_SECRET_ARN: &str = "DATABASE_SECRET_ARN";
/// Connections the function's pool may open (and so records processed at once).
pub const DATABASE_POOL_SIZE: &str = "DATABASE_POOL_SIZE";
/// How long a record waits for a database connection before failing transiently, in ms.
pub const DATABASE_ACQUIRE_TIMEOUT_MS: &str = "DATABASE_ACQUIRE_TIMEOUT_MS";
/// The fence's consumer name.
pub const CONSUMER_NAME: &str = "CONSUMER_NAME";
/// Attempts before a transiently failing job is dead-lettered.
pub const RETRY_MAX_ATTEMPTS: &str = "RETRY_MAX_ATTEMPTS";
/// The backoff's base delay, in seconds.
pub const RETRY_BASE_SECONDS: &str = "RETRY_BASE_SECONDS";
/// The backoff's cap, in seconds.
pub const RETRY_CAP_SECONDS: &str = "RETRY_CAP_SECONDS";
/// Why this queue overrides the platform retry policy; required when it does.
pub const RETRY_OVERRIDE_RATIONALE: &str = "RETRY_OVERRIDE_RATIONALE";
/// How long a fence row lives, in seconds.
pub const FENCE_TTL_SECONDS: &str = "FENCE_TTL_SECONDS";
/// The job queue's `MessageRetentionPeriod`, in seconds.
pub(crate) const QUEUE_RETENTION_SECONDS: &str = "QUEUE_RETENTION_SECONDS";
/// The job queue's DLQ's `MessageRetentionPeriod`, in seconds.
pub(crate) const DLQ_RETENTION_SECONDS: &str = "DLQ_RETENTION_SECONDS";
/// How long a copy of a job waits for a concurrent copy's fence, in milliseconds.
pub(crate) const FENCE_LOCK_TIMEOUT_MS: &str = "FENCE_LOCK_TIMEOUT_MS";
/// The CloudWatch namespace of the EMF metrics.
pub const METRICS_NAMESPACE: &str = "METRICS_NAMESPACE";
/// A record is started only with at least this many milliseconds left before the Lambda deadline.
pub const DEADLINE_MARGIN_MS: &str = "DEADLINE_MARGIN_MS";
/// Consumer: `per-job` (one transaction per job) or `batch` (one per SQS batch's new jobs).
pub const COMMIT_MODE: &str = "COMMIT_MODE";
/// Consumer: how long after its newest letter a writer of poison settles behind its rows in the
/// letters' intake, in milliseconds (default 0: every writer settles behind its own; at most
/// 60000). See `shared::dead_letter::SETTLE_DUE`.
pub const LETTER_SETTLE_DUE_MS: &str = "LETTER_SETTLE_DUE_MS";
/// The job queue a DLQ belongs to (the backstop ingester's letters name it; replay sends there).
pub const JOB_QUEUE_NAME: &str = "JOB_QUEUE_NAME";
/// The job queue's redrive `maxReceiveCount`.
pub const REDRIVE_MAX_RECEIVE_COUNT: &str = "REDRIVE_MAX_RECEIVE_COUNT";
/// The payload fields that make up a job (the consumer's `Consumer::job_fields`), comma-separated;
/// empty for the whole payload. The DLQ ingester digests its letters with them, and the consumer
/// refuses to start unless its code names the same.
pub const JOB_FIELDS: &str = "JOB_FIELDS";
/// `true` when the job queue and its DLQ are FIFO queues (the stanza's `Fifo`).
pub const QUEUE_FIFO: &str = "QUEUE_FIFO";
/// The most records the event source hands the consumer at once (its `BatchSize`).
pub const CONSUMER_BATCH_SIZE: &str = "CONSUMER_BATCH_SIZE";

/// `true` runs without BetterStack alerts (the local stack); anything else requires the token.
pub const ALERTING_DISABLED: &str = "ALERTING_DISABLED";
/// The BetterStack Uptime API token (team-scoped), locally; deployed functions read
/// [`BETTERSTACK_TOKEN_SECRET_ARN`].
pub const BETTERSTACK_API_TOKEN: &str = "BETTERSTACK_API_TOKEN";
/// The Secrets Manager secret holding the BetterStack token, read at run time.
pub const BETTERSTACK_TOKEN_SECRET_ARN: &str = "BETTERSTACK_TOKEN_SECRET_ARN";
/// Scheduled: the BetterStack heartbeat URL each run pings (optional; a stopped scheduler pages).
pub const BETTERSTACK_HEARTBEAT_URL: &str = "BETTERSTACK_HEARTBEAT_URL";
/// The BetterStack Uptime API base URL.
pub const BETTERSTACK_BASE_URL: &str = "BETTERSTACK_BASE_URL";
/// The e-mail incidents are requested as (optional).
pub(crate) const BETTERSTACK_REQUESTER_EMAIL: &str = "BETTERSTACK_REQUESTER_EMAIL";
/// How long one alert delivery round may take, in ms.
pub(crate) const ALERT_TIMEOUT_MS: &str = "ALERT_TIMEOUT_MS";
/// How often at most an open incident is updated with its group's count, in seconds.
pub(crate) const ALERT_UPDATE_INTERVAL_SECONDS: &str = "ALERT_UPDATE_INTERVAL_SECONDS";
/// The BetterStack escalation policy incidents page by default (optional).
pub(crate) const BETTERSTACK_POLICY_ID: &str = "BETTERSTACK_POLICY_ID";
/// The BetterStack team that owns the incidents (needed with a global API token; optional).
pub(crate) const BETTERSTACK_TEAM_NAME: &str = "BETTERSTACK_TEAM_NAME";
/// Per-queue routes, JSON: `{"<queue>": {"policy_id": "…", "team_name": "…"}}` (optional).
pub(crate) const BETTERSTACK_QUEUE_ROUTES: &str = "BETTERSTACK_QUEUE_ROUTES";
/// The escalation policy escalations of unreviewed letters page (optional; else the default).
pub(crate) const BETTERSTACK_ESCALATION_POLICY_ID: &str = "BETTERSTACK_ESCALATION_POLICY_ID";

/// API: how long a review waits for a concurrent review of the same letter, in milliseconds.
pub(crate) const API_LOCK_WAIT_MS: &str = "API_LOCK_WAIT_MS";
/// Fences deleted per sweep statement.
pub const SWEEP_BATCH_SIZE: &str = "SWEEP_BATCH_SIZE";
/// How long one scheduled run may sweep, in seconds.
pub(crate) const SWEEP_TIME_BUDGET_SECONDS: &str = "SWEEP_TIME_BUDGET_SECONDS";
/// Milliseconds the sweep rests between batches (its share of the database vs the consumers').
pub const SWEEP_PAUSE_MS: &str = "SWEEP_PAUSE_MS";
/// Days a dead letter may stay `pending_review` before it is escalated (and again every as many).
pub(crate) const ESCALATE_AFTER_DAYS: &str = "ESCALATE_AFTER_DAYS";
/// Scheduled: seconds a replay may stay recorded but unsent before it alerts (metric, incident,
/// failed heartbeat).
pub const REPLAY_UNSENT_ALERT_SECONDS: &str = "REPLAY_UNSENT_ALERT_SECONDS";

/// Unwraps a configuration, or stops the process with the error (which names the variable).
/// A Lambda function that stops here fails its init, and the message is in its log.
pub fn or_exit<T>(loaded: Result<T, ConfigError>) -> T {
    loaded.unwrap_or_else(|e| {
        tracing::error!(variable = e.variable, error = %e, "configuration error");
        eprintln!("configuration error: {e}");
        std::process::exit(78) // EX_CONFIG
    })
}

/// A configuration error: which variable, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub variable: &'static str,
    /// What is wrong, in a sentence.
    pub problem: String,
}

type Lookup<'a> = Box<dyn Fn(&str) -> Option<String> + 'a>;

/// Reads variables through a lookup function, so tests need not touch the process environment.
pub struct Env<'a> {
    lookup: Lookup<'a>,
}

impl fmt::Debug for Env<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Env")
    }
}

impl Env<'static> {
    /// The process environment.
    pub fn process() -> Self {
        Self::from_fn(|k| std::env::var(k).ok())
    }
}

impl<'a> Env<'a> {
    /// Variables from `lookup`; `None` means unset.
    pub fn from_fn(lookup: impl Fn(&str) -> Option<String> + 'a) -> Self {
        Self {
            lookup: Box::new(lookup),
        }
    }

    /// Variables from a list of pairs (the configuration's tests).
    #[cfg(test)]
    pub(crate) fn from_pairs(pairs: &'a [(&'a str, &'a str)]) -> Self {
        Self::from_fn(move |k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// An optional variable; blank counts as unset.
    pub fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    /// A required variable.
    pub fn required(&self, name: &'static str) -> Result<String, ConfigError> {
        self.get(name).ok_or_else(|| ConfigError {
            variable: name,
            problem: "is not set".into(),
        })
    }

    /// An optional variable parsed as `T`, or `default`.
    pub(crate) fn parsed<T: FromStr>(
        &self,
        name: &'static str,
        default: T,
    ) -> Result<T, ConfigError>
    where
        T::Err: fmt::Display,
    {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|e| ConfigError {
                variable: name,
                problem: format!("{raw:?} is not valid: {e}"),
            }),
        }
    }

    /// An optional number of seconds, or `default`.
    pub fn seconds(&self, name: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        self.parsed(name, default.as_secs())
            .map(Duration::from_secs)
    }
}

/// Reads and validates [`CONSUMER_NAME`].
pub(crate) fn consumer_name(env: &Env<'_>) -> Result<ConsumerName, ConfigError> {
    ConsumerName::new(env.required(CONSUMER_NAME)?).map_err(|problem| ConfigError {
        variable: CONSUMER_NAME,
        problem,
    })
}

#[cfg(test)]
mod tests;
