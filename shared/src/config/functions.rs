//! What each Lambda function reads at start-up, built from the shared parts.

use super::*;

/// The default of [`ScheduledConfig::replay_alert_after`] ([`REPLAY_UNSENT_ALERT_SECONDS`]).
pub const REPLAY_ALERT_AFTER: Duration = Duration::from_secs(3_600);

/// Everything the scheduled function (sweep, escalation, alert retries) needs at start-up.
#[derive(Debug, Clone)]
pub struct ScheduledConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// The fence TTL, checked against its floor: the sweeper refuses to run below it.
    pub fence: FenceConfig,
    /// Sweep bounds.
    pub sweep: crate::upkeep::sweep::SweepSettings,
    /// Escalation threshold.
    pub escalate_after: Duration,
    /// BetterStack, unless disabled.
    pub alerts: Option<AlertConfig>,
    /// The EMF namespace.
    pub metrics_namespace: String,
    /// The heartbeat each run pings, if any.
    pub heartbeat_url: Option<String>,
    /// A replay recorded this long ago and still unsent alerts ([`REPLAY_UNSENT_ALERT_SECONDS`]).
    pub replay_alert_after: Duration,
}

impl ScheduledConfig {
    /// Reads and validates every variable the scheduled function needs.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let batch_size = env.parsed(SWEEP_BATCH_SIZE, 5_000i64)?;
        if !(1..=100_000).contains(&batch_size) {
            return Err(ConfigError {
                variable: SWEEP_BATCH_SIZE,
                problem: format!("must be 1 to 100000, got {batch_size}"),
            });
        }
        let days = escalate_after_days(env)?;
        let replay_alert_after = replay_alert_after(env)?;
        let database = DatabaseConfig::from_env(env)?;
        let fence = FenceConfig::from_env(env)?;
        let heartbeat_url = env.get(BETTERSTACK_HEARTBEAT_URL);
        if let Some(url) = &heartbeat_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(ConfigError {
                variable: BETTERSTACK_HEARTBEAT_URL,
                problem: "must be an http(s) URL (BetterStack's heartbeat URL)".into(),
            });
        }
        Ok(Self {
            database,
            heartbeat_url,
            replay_alert_after,
            sweep: crate::upkeep::sweep::SweepSettings {
                batch_size,
                budget: env.seconds(SWEEP_TIME_BUDGET_SECONDS, Duration::from_secs(240))?,
                pause: Duration::from_millis(env.parsed(SWEEP_PAUSE_MS, 20u64)?),
                ledger_ttl: fence.ttl,
            },
            fence,
            escalate_after: Duration::from_secs_f64(days * 86_400.0),
            alerts: AlertConfig::from_env(env)?,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
        })
    }
}

/// Everything a consumer function needs at start-up.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// The fence's consumer name.
    pub consumer_name: ConsumerName,
    /// Retry policy, fence TTL, queue settings and the fence's lock timeout.
    pub fence: FenceConfig,
    /// The EMF namespace (default `JobHarness`).
    pub metrics_namespace: String,
    /// Time to keep free before the Lambda deadline (default 5 s).
    pub deadline_margin: Duration,
    /// BetterStack alerting, unless disabled.
    pub alerts: Option<AlertConfig>,
    /// One transaction per job, or per batch ([`COMMIT_MODE`]).
    pub commit: CommitMode,
    /// How long after its consumer's newest letter a writer of poison settles behind its rows
    /// ([`LETTER_SETTLE_DUE_MS`], default zero: at once).
    pub settle_due: Duration,
}

/// How a consumer commits its new jobs, as `COMMIT_MODE` spells it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
pub enum CommitMode {
    /// One transaction per job (the default).
    #[default]
    PerJob,
    /// One transaction for an SQS batch's new jobs ([`crate::consumer::Consumer::handle_batch`]), falling back
    /// to one per job when it does not commit.
    Batch,
}

crate::dead_letter::text_enum!(CommitMode);

impl ConsumerConfig {
    /// Reads and validates every variable a consumer needs; the first problem is returned.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let deadline_margin = Duration::from_millis(env.parsed(DEADLINE_MARGIN_MS, 5_000u64)?);
        // A record started just inside the margin may still make its SQS call (the visibility
        // of a retry) after its work: the call's own timeout must fit in what is left.
        let needed = crate::aws::SDK_OPERATION_TIMEOUT + Duration::from_millis(500);
        if deadline_margin < needed {
            return Err(ConfigError {
                variable: DEADLINE_MARGIN_MS,
                problem: format!(
                    "{} ms leaves no room for the SQS call after a record's work ({} ms at most, \
                     its timeout, plus 500 ms); use at least {}",
                    deadline_margin.as_millis(),
                    crate::aws::SDK_OPERATION_TIMEOUT.as_millis(),
                    needed.as_millis()
                ),
            });
        }
        Ok(Self {
            consumer_name: consumer_name(env)?,
            database: DatabaseConfig::from_env(env)?,
            fence: FenceConfig::from_env(env)?,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
            deadline_margin,
            alerts: AlertConfig::from_env(env)?,
            commit: commit_mode(env)?,
            settle_due: settle_due(env)?,
        })
    }
}

/// [`LETTER_SETTLE_DUE_MS`]: 0 (the default) to 60000, no longer than the scheduled function's
/// bulk operations schedule (every minute), whose settle takes what no writer's round took.
fn settle_due(env: &Env<'_>) -> Result<Duration, ConfigError> {
    let ms = env.parsed(LETTER_SETTLE_DUE_MS, 0u64)?;
    if ms > 60_000 {
        return Err(ConfigError {
            variable: LETTER_SETTLE_DUE_MS,
            problem: format!(
                "{ms} ms is longer than the minute within which the scheduled function settles \
                 what writers left; use 0 to 60000"
            ),
        });
    }
    Ok(Duration::from_millis(ms))
}

/// [`COMMIT_MODE`]: `per-job` (the default) or `batch`.
fn commit_mode(env: &Env<'_>) -> Result<CommitMode, ConfigError> {
    match env.get(COMMIT_MODE) {
        None => Ok(CommitMode::PerJob),
        Some(raw) => CommitMode::parse(raw.trim()).ok_or_else(|| ConfigError {
            variable: COMMIT_MODE,
            problem: format!("must be per-job or batch, got {raw:?}"),
        }),
    }
}

/// Everything the backstop DLQ ingester needs at start-up.
#[derive(Debug, Clone)]
pub struct DlqIngesterConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// The consumer whose DLQ this is.
    pub consumer_name: ConsumerName,
    /// The job queue the DLQ belongs to.
    pub job_queue: String,
    /// Retry policy, queue settings and the fence's lock timeout.
    pub fence: FenceConfig,
    /// The EMF namespace.
    pub metrics_namespace: String,
    /// BetterStack alerting, unless disabled.
    pub alerts: Option<AlertConfig>,
    /// How long letters may wait in the intake before a writer settles them
    /// ([`LETTER_SETTLE_DUE_MS`], as the consumer's).
    pub settle_due: Duration,
}

impl DlqIngesterConfig {
    /// Reads and validates every variable the ingester needs, with the same queue checks as
    /// the consumer's ([`FenceConfig`]).
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        Ok(Self {
            consumer_name: consumer_name(env)?,
            database: DatabaseConfig::from_env(env)?,
            fence: FenceConfig::from_env(env)?,
            job_queue: env.required(JOB_QUEUE_NAME)?,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
            alerts: AlertConfig::from_env(env)?,
            settle_due: settle_due(env)?,
        })
    }
}

/// Settings of the API functions.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// How long a review waits for a concurrent review of the same letter (`API_LOCK_WAIT_MS`,
    /// default 2000) before answering 409.
    pub lock_wait: Duration,
}

impl ApiConfig {
    /// Reads the database settings and [`API_LOCK_WAIT_MS`] (1 to 30000).
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let wait = env.parsed(API_LOCK_WAIT_MS, 2_000u64)?;
        if !(1..=30_000).contains(&wait) {
            return Err(ConfigError {
                variable: API_LOCK_WAIT_MS,
                problem: format!("must be 1 to 30000 milliseconds, got {wait}"),
            });
        }
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            lock_wait: Duration::from_millis(wait),
        })
    }
}

/// [`ESCALATE_AFTER_DAYS`]: a positive number of days.
fn escalate_after_days(env: &Env<'_>) -> Result<f64, ConfigError> {
    let days = env.parsed(ESCALATE_AFTER_DAYS, 3.0f64)?;
    if !(days.is_finite() && days > 0.0) {
        return Err(ConfigError {
            variable: ESCALATE_AFTER_DAYS,
            problem: format!("must be a positive number of days, got {days}"),
        });
    }
    Ok(days)
}

/// [`REPLAY_UNSENT_ALERT_SECONDS`]: past a replay's first retries, within a fence's lifetime.
fn replay_alert_after(env: &Env<'_>) -> Result<Duration, ConfigError> {
    let after = env.seconds(REPLAY_UNSENT_ALERT_SECONDS, REPLAY_ALERT_AFTER)?;
    if !(120..=7 * 86_400).contains(&after.as_secs()) {
        return Err(ConfigError {
            variable: REPLAY_UNSENT_ALERT_SECONDS,
            problem: format!(
                "must be 120 to 604800 seconds (past the first retries of a replay, within a \
                 fence's lifetime), got {}",
                after.as_secs()
            ),
        });
    }
    Ok(after)
}
