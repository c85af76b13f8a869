//! A consumer around a real one, counting how often its work was entered and, if told, failing
//! in a controlled way after doing it (the work then rolls back with the job's transaction).

use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::ConsumerName;
use sqlx::PgConnection;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How [`Counting::failing`] fails after its consumer's real work.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Transiently ("provider timeout on attempt N"), on every attempt.
    AlwaysTransient,
    /// Transiently on attempts before this one, then it succeeds.
    TransientUntilAttempt(u32),
    /// Permanently ("account is closed").
    Permanent,
}

/// `inner`, counting how often its handler was entered, failing after its work if it has a
/// [`Fault`]. In batch mode its batch work is the default one (each job through
/// [`Consumer::handle`]), so every job of a batch counts.
pub struct Counting<C> {
    /// The consumer whose work runs.
    pub inner: C,
    /// How it fails after the work, if it does.
    pub fault: Option<Fault>,
    calls: AtomicUsize,
}

impl<C> Counting<C> {
    /// `inner`, not yet called, never failing.
    pub fn new(inner: C) -> Self {
        Self {
            inner,
            fault: None,
            calls: AtomicUsize::new(0),
        }
    }

    /// `inner`, not yet called, failing with `fault` after its work.
    pub fn failing(inner: C, fault: Fault) -> Self {
        Self {
            fault: Some(fault),
            ..Self::new(inner)
        }
    }

    /// How often the handler was entered.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl<C: Consumer> Consumer for Counting<C> {
    type Payload = C::Payload;

    fn name(&self) -> &ConsumerName {
        self.inner.name()
    }

    fn job_fields(&self) -> &[&str] {
        self.inner.job_fields()
    }

    async fn handle(
        &self,
        job: &Job<C::Payload>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.handle(job, tx).await?;
        match self.fault {
            None => Ok(()),
            Some(Fault::TransientUntilAttempt(n)) if job.attempt >= n => Ok(()),
            Some(Fault::AlwaysTransient | Fault::TransientUntilAttempt(_)) => Err(
                ProcessError::transient(format!("provider timeout on attempt {}", job.attempt)),
            ),
            Some(Fault::Permanent) => Err(ProcessError::permanent("account is closed")),
        }
    }
}
