//! The retry policy, fence TTL and queue settings every function that touches fences must agree
//! on, with the checks that stop a function whose settings would lose or double a message.

use super::*;
use crate::fence::ttl_floor;
use crate::retry::RetryPolicy;

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
    /// Its DLQ's retention (counted from the original send).
    pub dlq_retention: Duration,
    /// The job queue's redrive `maxReceiveCount` (default: the policy's attempts + 2).
    pub max_receive_count: u32,
    /// How long a copy of a job waits for a concurrent copy's fence (default 2 s); settling a
    /// job's fence before a letter waits as long.
    pub lock_timeout: Duration,
    /// Whether the job queue and its DLQ are FIFO queues ([`QUEUE_FIFO`]).
    pub fifo: bool,
    /// The payload fields that make up a job ([`JOB_FIELDS`]; empty: the whole payload).
    pub job_fields: Vec<String>,
}

/// The fence TTL when [`FENCE_TTL_SECONDS`] is unset: above the floor of the default
/// retentions (5 + 5 days + the retry window + a day).
pub(crate) const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(14 * 86_400);

/// The fence TTL of a FIFO consumer when [`FENCE_TTL_SECONDS`] is unset: above the FIFO floor
/// of the default retentions (2 × (4 + 5 days) + the retry window + a day), where each DLQ stay
/// counts from the move.
pub(crate) const DEFAULT_FIFO_FENCE_TTL: Duration = Duration::from_secs(21 * 86_400);

/// The DLQ retention when [`DLQ_RETENTION_SECONDS`] is unset (the template's default): five
/// days for an ingester that fails to be mended (its alarm fires in 15 minutes).
pub(crate) const DEFAULT_DLQ_RETENTION: Duration = Duration::from_secs(5 * 86_400);

/// SQS must keep a message this much longer than its retry window: time for the last attempt
/// to run and for deliveries handed back on the way (deadline near, fence contended).
pub(crate) const RETENTION_MARGIN: Duration = Duration::from_secs(60 * 60);

impl FenceConfig {
    /// Reads the retry policy, [`FENCE_TTL_SECONDS`] (default 14 days),
    /// [`QUEUE_RETENTION_SECONDS`] (default 4 days, the SQS default),
    /// [`DLQ_RETENTION_SECONDS`] (default 5 days),
    /// [`REDRIVE_MAX_RECEIVE_COUNT`] and [`FENCE_LOCK_TIMEOUT_MS`], and refuses settings that
    /// lose messages: a retention shorter than the retry window (SQS would delete a message
    /// mid-retry, and an expired message is never redriven), a `maxReceiveCount` that does not
    /// exceed the attempts (the redrive would pre-empt the harness), and a TTL below its floor.
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let (policy, override_rationale) = retry_policy(env)?;
        let (queue_retention, dlq_retention) = retentions(env, &policy)?;
        let fifo = env.parsed(QUEUE_FIFO, false)?;
        let job_fields = job_fields(env.get(JOB_FIELDS).as_deref().unwrap_or_default())?;
        let max_receive_count = max_receive_count(env, fifo, policy.max_attempts())?;
        let lock_timeout = Duration::from_millis(env.parsed(FENCE_LOCK_TIMEOUT_MS, 2_000u64)?);
        if lock_timeout.is_zero() {
            return Err(ConfigError {
                variable: FENCE_LOCK_TIMEOUT_MS,
                problem: "must be at least 1".into(),
            });
        }
        let ttl = fence_ttl(env, fifo, queue_retention, dlq_retention, &policy)?;
        Ok(Self {
            policy,
            override_rationale,
            ttl,
            queue_retention,
            dlq_retention,
            max_receive_count,
            lock_timeout,
            fifo,
            job_fields,
        })
    }

    /// Stops a consumer whose code names other job fields than [`JOB_FIELDS`] says: its DLQ
    /// ingester digests letters with the variable's, and a letter whose digest is not the
    /// consumer's would be taken for another job (or another job for it).
    pub fn agree_on_job_fields(&self, named: &[&str]) -> Result<(), ConfigError> {
        let mut code: Vec<&str> = named.to_vec();
        code.sort_unstable();
        code.dedup();
        if code
            == self
                .job_fields
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        {
            return Ok(());
        }
        Err(ConfigError {
            variable: JOB_FIELDS,
            problem: format!(
                "is {:?}, but the consumer's code names {:?} (Consumer::job_fields): set the \
                 stanza's JobFields to the same, so that its DLQ ingester digests letters as the \
                 consumer does",
                self.job_fields.join(","),
                code.join(",")
            ),
        })
    }
}

/// The retry policy, and the rationale required when it is not the platform default.
fn retry_policy(env: &Env<'_>) -> Result<(RetryPolicy, Option<String>), ConfigError> {
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
    Ok((policy, override_rationale))
}

/// The job queue's and its DLQ's retentions: each in SQS's range, the queue's longer than the
/// retry window, the DLQ's at least the queue's.
fn retentions(env: &Env<'_>, policy: &RetryPolicy) -> Result<(Duration, Duration), ConfigError> {
    let queue_retention = env.seconds(QUEUE_RETENTION_SECONDS, Duration::from_secs(4 * 86_400))?;
    if !(60..=1_209_600).contains(&queue_retention.as_secs()) {
        return Err(ConfigError {
            variable: QUEUE_RETENTION_SECONDS,
            problem: format!(
                "must be 60 to 1209600 (SQS's range), got {}",
                queue_retention.as_secs()
            ),
        });
    }
    let needed = policy.max_retry_window() + RETENTION_MARGIN;
    if queue_retention < needed {
        return Err(ConfigError {
            variable: QUEUE_RETENTION_SECONDS,
            problem: format!(
                "{} s is shorter than the retry window {} s + margin {} s: SQS would delete a \
                 message between its attempts, and an expired message is never redriven, so \
                 its failure would leave no record",
                queue_retention.as_secs(),
                policy.max_retry_window().as_secs(),
                RETENTION_MARGIN.as_secs()
            ),
        });
    }
    let dlq_retention = env.seconds(DLQ_RETENTION_SECONDS, DEFAULT_DLQ_RETENTION)?;
    if !(60..=1_209_600).contains(&dlq_retention.as_secs()) || dlq_retention < queue_retention {
        return Err(ConfigError {
            variable: DLQ_RETENTION_SECONDS,
            problem: format!(
                "must be 60 to 1209600 (SQS's range) and at least {QUEUE_RETENTION_SECONDS} ({} s), got {}: a standard queue's DLQ counts retention from the original send, so a shorter one deletes a late-redriven message before it becomes a letter",
                queue_retention.as_secs(),
                dlq_retention.as_secs()
            ),
        });
    }
    Ok((queue_retention, dlq_retention))
}

/// The redrive `maxReceiveCount`: above the attempts, and on a FIFO queue at least
/// [`least_receive_count`].
fn max_receive_count(env: &Env<'_>, fifo: bool, attempts: u32) -> Result<u32, ConfigError> {
    let batch_size: u32 = env.parsed(CONSUMER_BATCH_SIZE, 10)?;
    let least_receive_count = least_receive_count(fifo, batch_size, attempts);
    let max_receive_count = env.parsed(REDRIVE_MAX_RECEIVE_COUNT, least_receive_count)?;
    if fifo && max_receive_count < least_receive_count {
        return Err(ConfigError {
            variable: REDRIVE_MAX_RECEIVE_COUNT,
            problem: format!(
                "{max_receive_count} is below {least_receive_count} ({CONSUMER_BATCH_SIZE} \
                 {batch_size} x ({attempts} attempts + 2)) on a FIFO queue: every receive of \
                 a group's failing head receives the records behind it too, held back \
                 unprocessed, so a record could be redriven to the DLQ without ever running"
            ),
        });
    }
    if max_receive_count <= attempts {
        return Err(ConfigError {
            variable: REDRIVE_MAX_RECEIVE_COUNT,
            problem: format!(
                "{max_receive_count} must exceed the retry policy's {attempts} attempts: \
                 otherwise the queue redrives a job to its DLQ before the harness has run it \
                 {attempts} times"
            ),
        });
    }
    Ok(max_receive_count)
}

/// The fence TTL, at or above the floor every copy of a job can still arrive within.
fn fence_ttl(
    env: &Env<'_>,
    fifo: bool,
    queue_retention: Duration,
    dlq_retention: Duration,
    policy: &RetryPolicy,
) -> Result<Duration, ConfigError> {
    let default_ttl = if fifo {
        DEFAULT_FIFO_FENCE_TTL
    } else {
        DEFAULT_FENCE_TTL
    };
    let ttl = env.seconds(FENCE_TTL_SECONDS, default_ttl)?;
    let floor = ttl_floor(queue_retention, dlq_retention, policy, fifo);
    if ttl >= floor {
        return Ok(ttl);
    }
    let (q, d) = (queue_retention.as_secs(), dlq_retention.as_secs());
    let paths = if fifo {
        format!(
            "twice ({QUEUE_RETENTION_SECONDS} {q} s + {DLQ_RETENTION_SECONDS} {d} s): a \
             FIFO queue's DLQ counts its retention from the move, so a copy lives the \
             queue's retention, then the DLQ's, and again both when it is redriven back"
        )
    } else {
        format!(
            "twice {DLQ_RETENTION_SECONDS} {d} s: a copy redriven from the DLQ back to its \
             queue at the end of the DLQ's retention lives a queue's or a DLQ's retention \
             again"
        )
    };
    Err(ConfigError {
        variable: FENCE_TTL_SECONDS,
        problem: format!(
            "{} s is below the safe floor of {} s ({paths}; + max retry window {} s + \
             margin {} s): a copy of a job arriving after its fence expired would apply \
             its effect twice",
            ttl.as_secs(),
            floor.as_secs(),
            policy.max_retry_window().as_secs(),
            crate::fence::TTL_MARGIN.as_secs()
        ),
    })
}

/// [`JOB_FIELDS`] read: comma-separated field names, sorted and without repeats; each of 1 to
/// 128 characters without spaces or commas.
fn job_fields(value: &str) -> Result<Vec<String>, ConfigError> {
    let mut fields: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(bad) = fields
        .iter()
        .find(|f| f.len() > 128 || f.chars().any(char::is_whitespace))
    {
        return Err(ConfigError {
            variable: JOB_FIELDS,
            problem: format!("{bad:?} is no field name (1 to 128 characters, no spaces)"),
        });
    }
    fields.sort_unstable();
    fields.dedup();
    Ok(fields)
}

/// The least redrive `maxReceiveCount` that never redrives a record the harness did not run
/// out of its attempts. On a standard queue: the attempts + 2 (hand-backs on the way). On a
/// FIFO queue, a record is received again with every receive of each record ahead of it in
/// its group's batch, held back unprocessed, and at most `batch_size - 1` records are ahead of
/// it while it is in the batch at all, each received at most its attempts + 2 times: so
/// `batch_size` x (attempts + 2), whatever the group's depth.
pub fn least_receive_count(fifo: bool, batch_size: u32, attempts: u32) -> u32 {
    if fifo {
        batch_size.max(1).saturating_mul(attempts + 2)
    } else {
        attempts + 2
    }
}
