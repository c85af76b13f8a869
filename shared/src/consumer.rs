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
    pub(crate) metrics: Arc<Metrics>,
}

impl<P> Job<P> {
    /// Counts `n` into the consumer's own metric `name`; it leaves as EMF with the harness's
    /// metrics at the end of the invocation. Counted whether or not the job then commits.
    pub fn count(&self, name: &'static str, n: u64) {
        self.metrics.count(name, n);
    }
}

/// How a handler failed. The class decides between retry and dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessError {
    /// May succeed later (a timeout, a lock, a provider's 503): retried with backoff, then
    /// dead-lettered as `exhausted` on the last attempt.
    #[error("{0}")]
    Transient(String),
    /// Can never succeed (the account is closed, the provider said 4xx): dead-lettered at once.
    #[error("{0}")]
    Permanent(String),
    /// The payload parsed but is meaningless (negative points): dead-lettered at once as poison.
    #[error("{0}")]
    Poison(String),
}

impl From<sqlx::Error> for ProcessError {
    /// A database error inside the work is transient: the transaction rolls back and the job is
    /// retried. Return [`ProcessError::Permanent`] yourself for errors you know are final.
    fn from(e: sqlx::Error) -> Self {
        ProcessError::Transient(format!("database: {e}"))
    }
}

/// A queue consumer: a stable name, a payload type, and the work.
pub trait Consumer: Send + Sync {
    /// The payload inside the envelope; anything that does not deserialize into it is poison.
    type Payload: DeserializeOwned + Send + Sync;

    /// The fence's consumer name. It must never change for a deployed consumer.
    fn name(&self) -> &ConsumerName;

    /// Does the job's work on `tx`, the transaction that already holds the job's fence.
    /// A panic is treated as a transient failure.
    fn handle(
        &self,
        job: &Job<Self::Payload>,
        tx: &mut PgConnection,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;
}
