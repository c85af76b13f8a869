//! What a platform engineer implements: one [`Consumer`] per queue consumer.
//!
//! Invariant: the handler receives the **open transaction** in which the harness has already
//! claimed the job's fence. Everything it writes through that connection commits together with
//! the fence or not at all; it must not commit, and it must not write through another connection.

use crate::envelope::Envelope;
use crate::ids::ConsumerName;
use crate::metrics::Metrics;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sqlx::PgConnection;
use std::future::Future;
use std::sync::Arc;

/// One job handed to a consumer.
#[derive(Debug, Clone)]
pub struct Job<P> {
    /// The parsed envelope with the typed payload.
    pub envelope: Envelope<P>,
    /// Which execution of the work this is, from 1, counted by the harness (not SQS receives).
    pub attempt: u32,
    /// When this attempt started, from the harness's clock; use it instead of `now()` in SQL.
    pub started_at: DateTime<Utc>,
    /// What makes up the job, kept with its fence: a copy with another digest is a conflict.
    pub(crate) digest: crate::envelope::JobDigest,
    pub(crate) metrics: Arc<Metrics>,
}

impl<P> Job<P> {
    /// Counts `n` into the consumer's own metric `name`; it leaves as EMF with the harness's
    /// metrics at the end of the invocation. Counted whether or not the job then commits.
    pub fn count(&self, name: &'static str, n: u64) {
        self.metrics.count(name, n);
    }
}

/// How a handler failed. The class decides between retry and dead letter; the [`Cause`] keeps
/// the error that caused it, whole, for the logs (`std::error::Error::source` walks to it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessError {
    /// May succeed later (a timeout, a lock, a provider's 503): retried with backoff, then
    /// dead-lettered as `exhausted` on the last attempt.
    #[error("{0}")]
    Transient(#[source] Cause),
    /// Can never succeed (the account is closed, the provider said 4xx): dead-lettered at once.
    #[error("{0}")]
    Permanent(#[source] Cause),
    /// The payload parsed but is meaningless (negative points): dead-lettered at once as poison.
    #[error("{0}")]
    Poison(#[source] Cause),
}

impl ProcessError {
    /// A transient failure saying `message`.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient(Cause::new(message))
    }

    /// A permanent failure saying `message`.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent(Cause::new(message))
    }

    /// Poison: the payload is meaningless, as `message` says.
    pub fn poison(message: impl Into<String>) -> Self {
        Self::Poison(Cause::new(message))
    }

    /// The cause, whatever the class.
    pub fn cause(&self) -> &Cause {
        match self {
            Self::Transient(c) | Self::Permanent(c) | Self::Poison(c) => c,
        }
    }
}

/// What went wrong: a sentence for the letter and the log, and the error behind it, kept.
#[derive(Debug, Clone)]
pub struct Cause {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Cause {
    /// A cause that is only a sentence.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// `context` caused by `source`; it reads `context: source`.
    pub fn with_source(
        context: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: format!("{context}: {source}"),
            source: Some(Arc::new(source)),
        }
    }

    /// The sentence.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Causes compare by what they say: the error behind them is for the logs.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for Cause {}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl From<sqlx::Error> for ProcessError {
    /// A database error inside the work is transient: the transaction rolls back and the job is
    /// retried. Return [`ProcessError::Permanent`] yourself for errors you know are final. The
    /// sqlx error is kept as the cause's source.
    fn from(e: sqlx::Error) -> Self {
        // The server's own words and its SQLSTATE, which an operator can look up and the
        // failure groups keep apart; the sqlx error stays the source.
        let message = match e.as_database_error() {
            Some(db) => format!(
                "database: {} (SQLSTATE {})",
                db.message(),
                db.code().as_deref().unwrap_or("?")
            ),
            None => format!("database: {e}"),
        };
        ProcessError::Transient(Cause {
            message,
            source: Some(Arc::new(e)),
        })
    }
}

/// A queue consumer: a stable name, a payload type, and the work.
pub trait Consumer: Send + Sync {
    /// The payload inside the envelope; anything that does not deserialize into it is poison.
    type Payload: DeserializeOwned + Send + Sync;

    /// The fence's consumer name. It must never change for a deployed consumer.
    fn name(&self) -> &ConsumerName;

    /// The payload's fields that make up a job (as Powertools' `payload_validation_jmespath`):
    /// a copy of a processed job whose named fields differ is not a duplicate but another job
    /// under a reused id, and becomes a `conflict` letter. Empty (the default): the whole
    /// payload. Name them when producers add fields that change between sends of one job (a
    /// send time, a trace note).
    fn job_fields(&self) -> &[&str] {
        &[]
    }

    /// Does the job's work on `tx`, the transaction that already holds the job's fence.
    /// A panic is treated as a transient failure.
    fn handle(
        &self,
        job: &Job<Self::Payload>,
        tx: &mut PgConnection,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Batch mode (`COMMIT_MODE=batch`): does the work of a batch's new jobs together on `tx`,
    /// which already holds all their fences, committed once for all of them. Write it
    /// set-based (one statement for the batch's rows) where that helps; the default runs
    /// [`Consumer::handle`] for each job on the one transaction.
    ///
    /// Any error (of any class) or panic rolls the whole batch back, and the harness then runs
    /// each job on its own through [`Consumer::handle`]: one bad job costs only itself, and its
    /// classification, retries and letter are exactly as without batch mode. So validate what
    /// would make a job poison or permanent the same way in both.
    fn handle_batch(
        &self,
        jobs: &[Job<Self::Payload>],
        tx: &mut PgConnection,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send {
        async move {
            for job in jobs {
                self.handle(job, tx).await?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_database_error_is_transient_and_kept_as_the_source() {
        let e: ProcessError = sqlx::Error::PoolTimedOut.into();
        assert!(matches!(e, ProcessError::Transient(_)));
        assert!(e.to_string().starts_with("database: "), "{e}");
        let cause = e.source().expect("the cause");
        let sqlx_error = cause.source().expect("the sqlx error, kept");
        assert!(sqlx_error.downcast_ref::<sqlx::Error>().is_some());
        assert_eq!(ProcessError::poison("x"), ProcessError::Poison("x".into()));
    }
}
