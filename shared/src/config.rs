//! Configuration from environment variables, read once at start-up and validated.
//!
//! Invariant: a function with a bad configuration does not start. Every error names the
//! variable and says what is wrong, including a fence TTL that could let a late copy of a job
//! through (below [`crate::fence::ttl_floor`]) and a retry-policy override without a rationale.

use crate::fence::ttl_floor;
use crate::ids::ConsumerName;
use crate::retry::RetryPolicy;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The PostgreSQL connection URL.
pub const DATABASE_URL: &str = "DATABASE_URL";
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
pub const QUEUE_RETENTION_SECONDS: &str = "QUEUE_RETENTION_SECONDS";
/// How long a copy of a job waits for a concurrent copy's fence, in milliseconds.
pub const FENCE_LOCK_TIMEOUT_MS: &str = "FENCE_LOCK_TIMEOUT_MS";
/// The CloudWatch namespace of the EMF metrics.
pub const METRICS_NAMESPACE: &str = "METRICS_NAMESPACE";
/// A record is started only with at least this many milliseconds left before the Lambda deadline.
pub const DEADLINE_MARGIN_MS: &str = "DEADLINE_MARGIN_MS";
/// The job queue a DLQ belongs to (the backstop ingester's letters name it; replay sends there).
pub const JOB_QUEUE_NAME: &str = "JOB_QUEUE_NAME";
/// The job queue's redrive `maxReceiveCount`.
pub const REDRIVE_MAX_RECEIVE_COUNT: &str = "REDRIVE_MAX_RECEIVE_COUNT";

/// `true` runs without BetterStack alerts (the local stack); anything else requires the token.
pub const ALERTING_DISABLED: &str = "ALERTING_DISABLED";
/// The BetterStack Uptime API token (team-scoped), from Secrets Manager in production.
pub const BETTERSTACK_API_TOKEN: &str = "BETTERSTACK_API_TOKEN";
/// The BetterStack Uptime API base URL.
pub const BETTERSTACK_BASE_URL: &str = "BETTERSTACK_BASE_URL";
/// The e-mail incidents are requested as (optional).
pub const BETTERSTACK_REQUESTER_EMAIL: &str = "BETTERSTACK_REQUESTER_EMAIL";
/// How long one alert delivery round may take, in ms.
pub const ALERT_TIMEOUT_MS: &str = "ALERT_TIMEOUT_MS";

/// BetterStack alerting settings.
#[derive(Clone)]
pub struct AlertConfig {
    /// The API base URL.
    pub base_url: String,
    /// The API token; never logged.
    token: String,
    /// The requester e-mail, if any.
    pub requester_email: Option<String>,
    /// Time budget of one delivery round.
    pub budget: Duration,
}

impl fmt::Debug for AlertConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlertConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl AlertConfig {
    /// Alerting settings, or `None` when [`ALERTING_DISABLED`] is `true`. Without that, a
    /// missing [`BETTERSTACK_API_TOKEN`] is an error: silence must be chosen, never defaulted.
    pub fn from_env(env: &Env<'_>) -> Result<Option<Self>, ConfigError> {
        if env.parsed(ALERTING_DISABLED, false)? {
            return Ok(None);
        }
        let token = env.get(BETTERSTACK_API_TOKEN).ok_or_else(|| ConfigError {
            variable: BETTERSTACK_API_TOKEN,
            problem: format!(
                "is not set; set {ALERTING_DISABLED}=true to run without alerts (locally only)"
            ),
        })?;
        let base_url = env.parsed(
            BETTERSTACK_BASE_URL,
            "https://uptime.betterstack.com".to_owned(),
        )?;
        if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
            return Err(ConfigError {
                variable: BETTERSTACK_BASE_URL,
                problem: "must be an http(s) URL".into(),
            });
        }
        let budget = Duration::from_millis(env.parsed(ALERT_TIMEOUT_MS, 2_000u64)?);
        Ok(Some(Self {
            base_url,
            token,
            requester_email: env.get(BETTERSTACK_REQUESTER_EMAIL),
            budget,
        }))
    }

    /// The BetterStack client these settings describe.
    pub fn client(&self) -> Result<crate::alerting::BetterStack, ConfigError> {
        crate::alerting::BetterStack::new(
            &self.base_url,
            self.token.clone(),
            self.requester_email.clone(),
        )
        .map_err(|e| ConfigError {
            variable: BETTERSTACK_BASE_URL,
            problem: format!("cannot build an HTTP client: {e}"),
        })
    }

    /// The alerter these settings describe, over `pool`.
    pub fn alerter(
        &self,
        pool: sqlx::PgPool,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Result<crate::alerting::Alerter, ConfigError> {
        Ok(crate::alerting::Alerter::new(
            pool,
            self.client()?,
            clock,
            self.budget,
        ))
    }
}

/// Fences deleted per sweep statement.
pub const SWEEP_BATCH_SIZE: &str = "SWEEP_BATCH_SIZE";
/// How long one scheduled run may sweep, in seconds.
pub const SWEEP_TIME_BUDGET_SECONDS: &str = "SWEEP_TIME_BUDGET_SECONDS";
/// Milliseconds the sweep rests between batches (its share of the database vs the consumers').
pub const SWEEP_PAUSE_MS: &str = "SWEEP_PAUSE_MS";
/// Days a dead letter may stay `pending_review` before it is escalated (and again every as many).
pub const ESCALATE_AFTER_DAYS: &str = "ESCALATE_AFTER_DAYS";

/// Everything the scheduled function (sweep, escalation, alert retries) needs at start-up.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// The fence TTL, checked against its floor: the sweeper refuses to run below it.
    pub fence: FenceConfig,
    /// Sweep bounds.
    pub sweep: crate::sweeper::SweepSettings,
    /// Escalation threshold.
    pub escalate_after: Duration,
    /// BetterStack, unless disabled.
    pub alerts: Option<AlertConfig>,
    /// The EMF namespace.
    pub metrics_namespace: String,
}

impl SweeperConfig {
    /// Reads and validates every variable the scheduled function needs.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let batch_size = env.parsed(SWEEP_BATCH_SIZE, 5_000i64)?;
        if !(1..=100_000).contains(&batch_size) {
            return Err(ConfigError {
                variable: SWEEP_BATCH_SIZE,
                problem: format!("must be 1 to 100000, got {batch_size}"),
            });
        }
        let days = env.parsed(ESCALATE_AFTER_DAYS, 3.0f64)?;
        if !(days.is_finite() && days > 0.0) {
            return Err(ConfigError {
                variable: ESCALATE_AFTER_DAYS,
                problem: format!("must be a positive number of days, got {days}"),
            });
        }
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            fence: FenceConfig::from_env(env)?,
            sweep: crate::sweeper::SweepSettings {
                batch_size,
                budget: env.seconds(SWEEP_TIME_BUDGET_SECONDS, Duration::from_secs(240))?,
                pause: Duration::from_millis(env.parsed(SWEEP_PAUSE_MS, 20u64)?),
            },
            escalate_after: Duration::from_secs_f64(days * 86_400.0),
            alerts: AlertConfig::from_env(env)?,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
        })
    }
}

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

    /// Variables from a list of pairs.
    pub fn from_pairs(pairs: &'a [(&'a str, &'a str)]) -> Self {
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
    pub fn parsed<T: FromStr>(&self, name: &'static str, default: T) -> Result<T, ConfigError>
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
fn consumer_name(env: &Env<'_>) -> Result<ConsumerName, ConfigError> {
    ConsumerName::new(env.required(CONSUMER_NAME)?).map_err(|problem| ConfigError {
        variable: CONSUMER_NAME,
        problem,
    })
}

/// The database connection settings.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `postgres://` or `postgresql://` URL.
    pub url: String,
    /// Pool size.
    pub pool_size: u32,
    /// How long to wait for a connection.
    pub acquire_timeout: Duration,
}

impl DatabaseConfig {
    /// Reads [`DATABASE_URL`], [`DATABASE_POOL_SIZE`] (default 5) and
    /// [`DATABASE_ACQUIRE_TIMEOUT_MS`] (default 5000).
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let url = env.required(DATABASE_URL)?;
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError {
                variable: DATABASE_URL,
                problem: "must be a postgres:// or postgresql:// URL".into(),
            });
        }
        let pool_size = env.parsed(DATABASE_POOL_SIZE, 5u32)?;
        if !(1..=100).contains(&pool_size) {
            return Err(ConfigError {
                variable: DATABASE_POOL_SIZE,
                problem: format!("must be 1 to 100, got {pool_size}"),
            });
        }
        let acquire_timeout =
            Duration::from_millis(env.parsed(DATABASE_ACQUIRE_TIMEOUT_MS, 5_000u64)?);
        Ok(Self {
            url,
            pool_size,
            acquire_timeout,
        })
    }

    /// A lazily connecting pool: a function starts even while the database is down, and each
    /// record then fails transiently instead of the whole function failing its init.
    ///
    /// Connections are not pinged before each use (sqlx's default would add a round trip to
    /// every job, a third more than the transaction itself needs): a connection that died is
    /// discarded on its first error, and that record fails transiently and is retried.
    pub fn lazy_pool(&self) -> Result<sqlx::PgPool, ConfigError> {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(self.pool_size)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy(&self.url)
            .map_err(|e| ConfigError {
                variable: DATABASE_URL,
                problem: format!("is not a valid connection URL: {e}"),
            })
    }
}

/// The retry policy and fence settings every function that touches fences must agree on.
#[derive(Debug, Clone)]
pub struct FenceConfig {
    /// The retry policy (platform default unless overridden with a rationale).
    pub policy: RetryPolicy,
    /// Why the policy differs from the platform default, when it does.
    pub override_rationale: Option<String>,
    /// Fence lifetime.
    pub ttl: Duration,
    /// The job queue's retention.
    pub queue_retention: Duration,
}

impl FenceConfig {
    /// Reads the retry policy, [`FENCE_TTL_SECONDS`] (default 7 days) and
    /// [`QUEUE_RETENTION_SECONDS`] (default 4 days, the SQS default), and checks the TTL floor.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let default = RetryPolicy::default();
        let attempts = env.parsed(RETRY_MAX_ATTEMPTS, default.max_attempts())?;
        let base = env.seconds(RETRY_BASE_SECONDS, default.base())?;
        let cap = env.seconds(RETRY_CAP_SECONDS, default.cap())?;
        let policy = RetryPolicy::new(attempts, base, cap).map_err(|e| ConfigError {
            variable: match e {
                crate::retry::PolicyError::Attempts(_) => RETRY_MAX_ATTEMPTS,
                crate::retry::PolicyError::Base => RETRY_BASE_SECONDS,
                crate::retry::PolicyError::Cap { .. } => RETRY_CAP_SECONDS,
            },
            problem: e.to_string(),
        })?;
        let override_rationale = env.get(RETRY_OVERRIDE_RATIONALE);
        if policy != default && override_rationale.is_none() {
            return Err(ConfigError {
                variable: RETRY_OVERRIDE_RATIONALE,
                problem: format!(
                    "is required because the retry policy ({attempts} attempts, base {} s, cap {} s) \
                     overrides the platform default ({} attempts, base {} s, cap {} s); say why",
                    base.as_secs(),
                    cap.as_secs(),
                    default.max_attempts(),
                    default.base().as_secs(),
                    default.cap().as_secs()
                ),
            });
        }
        let queue_retention =
            env.seconds(QUEUE_RETENTION_SECONDS, Duration::from_secs(4 * 86_400))?;
        if !(60..=1_209_600).contains(&queue_retention.as_secs()) {
            return Err(ConfigError {
                variable: QUEUE_RETENTION_SECONDS,
                problem: format!(
                    "must be 60 to 1209600 (SQS's range), got {}",
                    queue_retention.as_secs()
                ),
            });
        }
        let ttl = env.seconds(FENCE_TTL_SECONDS, Duration::from_secs(7 * 86_400))?;
        let floor = ttl_floor(queue_retention, &policy);
        if ttl < floor {
            return Err(ConfigError {
                variable: FENCE_TTL_SECONDS,
                problem: format!(
                    "{} s is below the safe floor of {} s ({QUEUE_RETENTION_SECONDS} {} s + max retry window {} s \
                     + margin {} s): a copy of a job arriving after its fence expired would apply its effect twice",
                    ttl.as_secs(),
                    floor.as_secs(),
                    queue_retention.as_secs(),
                    policy.max_retry_window().as_secs(),
                    crate::fence::TTL_MARGIN.as_secs()
                ),
            });
        }
        Ok(Self {
            policy,
            override_rationale,
            ttl,
            queue_retention,
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
    /// Retry policy and fence TTL.
    pub fence: FenceConfig,
    /// How long a copy waits for a concurrent copy's fence (default 2 s).
    pub lock_timeout: Duration,
    /// The EMF namespace (default `JobHarness`).
    pub metrics_namespace: String,
    /// Time to keep free before the Lambda deadline (default 5 s).
    pub deadline_margin: Duration,
    /// BetterStack alerting, unless disabled.
    pub alerts: Option<AlertConfig>,
}

impl ConsumerConfig {
    /// Reads and validates every variable a consumer needs; the first problem is returned.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let consumer_name = consumer_name(env)?;
        let lock_timeout = Duration::from_millis(env.parsed(FENCE_LOCK_TIMEOUT_MS, 2_000u64)?);
        if lock_timeout.is_zero() {
            return Err(ConfigError {
                variable: FENCE_LOCK_TIMEOUT_MS,
                problem: "must be at least 1".into(),
            });
        }
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            consumer_name,
            fence: FenceConfig::from_env(env)?,
            lock_timeout,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
            deadline_margin: Duration::from_millis(env.parsed(DEADLINE_MARGIN_MS, 5_000u64)?),
            alerts: AlertConfig::from_env(env)?,
        })
    }

    /// The harness settings this configuration describes. A contended fence is retried after
    /// the lock timeout plus a second, when the copy holding it has usually finished.
    pub fn harness_settings(&self) -> crate::harness::HarnessSettings {
        crate::harness::HarnessSettings {
            policy: self.fence.policy,
            fence_ttl: self.fence.ttl,
            lock_timeout: self.lock_timeout,
            contended_retry_after: self.lock_timeout + Duration::from_secs(1),
        }
    }

    /// How batches are processed: as many records at once as the pool has connections.
    pub fn batch_settings(&self) -> crate::sqs::BatchSettings {
        crate::sqs::BatchSettings {
            concurrency: self.database.pool_size as usize,
            deadline_margin: self.deadline_margin,
        }
    }
}

/// Everything the backstop DLQ ingester needs at start-up.
#[derive(Debug, Clone)]
pub struct BackstopConfig {
    /// The database.
    pub database: DatabaseConfig,
    /// The consumer whose DLQ this is.
    pub consumer_name: ConsumerName,
    /// The job queue the DLQ belongs to.
    pub job_queue: String,
    /// The job queue's redrive `maxReceiveCount` (default: the policy's attempts + 2).
    pub max_receive_count: u32,
    /// The EMF namespace.
    pub metrics_namespace: String,
    /// BetterStack alerting, unless disabled.
    pub alerts: Option<AlertConfig>,
}

impl BackstopConfig {
    /// Reads and validates every variable the ingester needs. `maxReceiveCount` must exceed the
    /// retry policy's attempts, or the backstop would pre-empt the harness's own retries.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let consumer_name = consumer_name(env)?;
        let fence = FenceConfig::from_env(env)?;
        let attempts = fence.policy.max_attempts();
        let max_receive_count = env.parsed(REDRIVE_MAX_RECEIVE_COUNT, attempts + 2)?;
        if max_receive_count <= attempts {
            return Err(ConfigError {
                variable: REDRIVE_MAX_RECEIVE_COUNT,
                problem: format!(
                    "{max_receive_count} must exceed the retry policy's {attempts} attempts"
                ),
            });
        }
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            consumer_name,
            job_queue: env.required(JOB_QUEUE_NAME)?,
            max_receive_count,
            metrics_namespace: env.parsed(METRICS_NAMESPACE, "JobHarness".to_owned())?,
            alerts: AlertConfig::from_env(env)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: [(&str, &str); 3] = [
        (DATABASE_URL, "postgres://localhost/db"),
        (CONSUMER_NAME, "award-points"),
        (BETTERSTACK_API_TOKEN, "t0ken"),
    ];

    fn load(extra: &[(&'static str, &'static str)]) -> Result<ConsumerConfig, ConfigError> {
        let pairs: Vec<_> = BASE.iter().chain(extra).copied().collect();
        ConsumerConfig::from_env(&Env::from_pairs(&pairs))
    }

    #[test]
    fn defaults_are_the_platform_policy() {
        let c = load(&[]).unwrap();
        assert_eq!(c.fence.policy, RetryPolicy::default());
        assert_eq!(c.fence.ttl, Duration::from_secs(7 * 86_400));
        assert_eq!(c.database.pool_size, 5);
        assert_eq!(c.consumer_name.as_str(), "award-points");
    }

    #[test]
    fn a_ttl_under_the_floor_is_rejected_naming_the_variable() {
        let err = load(&[(FENCE_TTL_SECONDS, "86400")]).unwrap_err();
        assert_eq!(err.variable, FENCE_TTL_SECONDS);
        assert!(
            err.to_string()
                .starts_with("FENCE_TTL_SECONDS: 86400 s is below the safe floor"),
            "{err}"
        );
        // Raising the retention raises the floor too.
        let err = load(&[(QUEUE_RETENTION_SECONDS, "1209600")]).unwrap_err();
        assert_eq!(err.variable, FENCE_TTL_SECONDS, "{err}");
        assert!(
            load(&[
                (QUEUE_RETENTION_SECONDS, "1209600"),
                (FENCE_TTL_SECONDS, "1400000")
            ])
            .is_ok()
        );
    }

    #[test]
    fn a_policy_override_without_rationale_is_rejected_naming_the_variable() {
        let err = load(&[(RETRY_MAX_ATTEMPTS, "8")]).unwrap_err();
        assert_eq!(err.variable, RETRY_OVERRIDE_RATIONALE);
        assert!(
            err.to_string().contains("overrides the platform default"),
            "{err}"
        );
        let ok = load(&[
            (RETRY_MAX_ATTEMPTS, "8"),
            (RETRY_OVERRIDE_RATIONALE, "provider outages last hours"),
        ])
        .unwrap();
        assert_eq!(ok.fence.policy.max_attempts(), 8);
        // Stating the default explicitly is not an override.
        assert!(load(&[(RETRY_BASE_SECONDS, "30")]).is_ok());
    }

    #[test]
    fn alerting_needs_a_token_unless_explicitly_disabled() {
        let pairs = [(DATABASE_URL, "postgres://h/d"), (CONSUMER_NAME, "c")];
        let err = ConsumerConfig::from_env(&Env::from_pairs(&pairs)).unwrap_err();
        assert_eq!(err.variable, BETTERSTACK_API_TOKEN);
        assert!(err.to_string().contains("ALERTING_DISABLED=true"), "{err}");
        let disabled = [pairs[0], pairs[1], (ALERTING_DISABLED, "true")];
        assert!(
            ConsumerConfig::from_env(&Env::from_pairs(&disabled))
                .unwrap()
                .alerts
                .is_none()
        );
        let on = load(&[]).unwrap().alerts.expect("alerting on");
        assert_eq!(on.base_url, "https://uptime.betterstack.com");
        assert!(
            !format!("{on:?}").contains("t0ken"),
            "the token never shows in Debug"
        );
        assert_eq!(
            load(&[(BETTERSTACK_BASE_URL, "ftp://x")])
                .unwrap_err()
                .variable,
            BETTERSTACK_BASE_URL
        );
    }

    #[test]
    fn the_sweeper_refuses_a_ttl_under_the_floor_naming_the_variable() {
        let pairs = [
            (DATABASE_URL, "postgres://h/d"),
            (ALERTING_DISABLED, "true"),
            (FENCE_TTL_SECONDS, "86400"),
        ];
        let err = SweeperConfig::from_env(&Env::from_pairs(&pairs)).unwrap_err();
        assert_eq!(err.variable, FENCE_TTL_SECONDS);
        assert!(
            err.to_string().contains("would apply its effect twice"),
            "{err}"
        );
        let ok = SweeperConfig::from_env(&Env::from_pairs(&pairs[..2])).unwrap();
        assert_eq!(
            (ok.sweep.batch_size, ok.escalate_after),
            (5_000, Duration::from_secs(3 * 86_400))
        );
        let bad = [pairs[0], pairs[1], (ESCALATE_AFTER_DAYS, "0")];
        assert_eq!(
            SweeperConfig::from_env(&Env::from_pairs(&bad))
                .unwrap_err()
                .variable,
            ESCALATE_AFTER_DAYS
        );
    }

    #[test]
    fn the_redrive_count_must_exceed_the_attempts() {
        let base = [
            (DATABASE_URL, "postgres://h/d"),
            (CONSUMER_NAME, "award-points"),
            (JOB_QUEUE_NAME, "jobs"),
            (ALERTING_DISABLED, "true"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let pairs: Vec<_> = base.iter().chain(extra).copied().collect();
            BackstopConfig::from_env(&Env::from_pairs(&pairs))
        };
        assert_eq!(with(&[]).unwrap().max_receive_count, 7);
        assert_eq!(
            with(&[(REDRIVE_MAX_RECEIVE_COUNT, "5")])
                .unwrap_err()
                .variable,
            REDRIVE_MAX_RECEIVE_COUNT
        );
        let no_queue =
            BackstopConfig::from_env(&Env::from_pairs(&[base[0], base[1], base[3]])).unwrap_err();
        assert_eq!(no_queue.variable, JOB_QUEUE_NAME);
    }

    #[test]
    fn missing_and_malformed_variables_name_themselves() {
        let err = ConsumerConfig::from_env(&Env::from_pairs(&[(CONSUMER_NAME, "x")])).unwrap_err();
        assert_eq!(err.to_string(), "DATABASE_URL: is not set");
        let err = ConsumerConfig::from_env(&Env::from_pairs(&[(DATABASE_URL, "postgres://h/d")]))
            .unwrap_err();
        assert_eq!(err.variable, CONSUMER_NAME);
        assert_eq!(
            load(&[(RETRY_BASE_SECONDS, "soon")]).unwrap_err().variable,
            RETRY_BASE_SECONDS
        );
        assert_eq!(
            load(&[
                (RETRY_CAP_SECONDS, "99999999"),
                (RETRY_OVERRIDE_RATIONALE, "r")
            ])
            .unwrap_err()
            .variable,
            RETRY_CAP_SECONDS
        );
        assert_eq!(
            load(&[(DATABASE_POOL_SIZE, "0")]).unwrap_err().variable,
            DATABASE_POOL_SIZE
        );
        assert_eq!(
            load(&[(QUEUE_RETENTION_SECONDS, "5")])
                .unwrap_err()
                .variable,
            QUEUE_RETENTION_SECONDS
        );
        let bad_url = ConsumerConfig::from_env(&Env::from_pairs(&[
            (CONSUMER_NAME, "x"),
            (DATABASE_URL, "mysql://x"),
        ]));
        assert_eq!(bad_url.unwrap_err().variable, DATABASE_URL);
    }
}
