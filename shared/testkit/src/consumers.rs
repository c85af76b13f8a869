//! A consumer around a real one, counting how often its work was entered and, if told, doing
//! more after that work on the job's transaction: failing in a controlled way (the work then
//! rolls back), or a step of the test's own (ignoring an SQL error, losing the session).

use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::ConsumerName;
use sqlx::PgConnection;
use std::future::Future;
use std::pin::Pin;
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

/// A step of [`Counting::then`] on the job's transaction: a future borrowing it, boxed (write
/// it `|tx| Box::pin(async move { .. })`).
pub type OnTx<'t> = Pin<Box<dyn Future<Output = Result<(), ProcessError>> + Send + 't>>;

type Step = Box<dyn for<'t> Fn(&'t mut PgConnection) -> OnTx<'t> + Send + Sync>;

/// What runs after the work.
enum After {
    Nothing,
    Fault(Fault),
    Step(Step),
}

/// `inner`, counting how often its handler was entered, and doing what it was told after its
/// work. In batch mode its batch work is the default one (each job through
/// [`Consumer::handle`]), so every job of a batch counts.
pub struct Counting<C> {
    /// The consumer whose work runs.
    pub inner: C,
    after: After,
    calls: AtomicUsize,
}

impl<C> Counting<C> {
    /// `inner`, not yet called, doing nothing more.
    pub fn new(inner: C) -> Self {
        Self {
            inner,
            after: After::Nothing,
            calls: AtomicUsize::new(0),
        }
    }

    /// `inner`, failing with `fault` after its work.
    pub fn failing(inner: C, fault: Fault) -> Self {
        Self {
            after: After::Fault(fault),
            ..Self::new(inner)
        }
    }

    /// `inner`, then `step` on the same transaction before the harness commits: a consumer
    /// that misbehaves after its real effect. `step`'s error is the job's.
    pub fn then<F>(inner: C, step: F) -> Self
    where
        F: for<'t> Fn(&'t mut PgConnection) -> OnTx<'t> + Send + Sync + 'static,
    {
        Self {
            after: After::Step(Box::new(step)),
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
        match &self.after {
            After::Nothing => Ok(()),
            After::Step(step) => step(tx).await,
            After::Fault(Fault::TransientUntilAttempt(n)) if job.attempt >= *n => Ok(()),
            After::Fault(Fault::AlwaysTransient | Fault::TransientUntilAttempt(_)) => Err(
                ProcessError::transient(format!("provider timeout on attempt {}", job.attempt)),
            ),
            After::Fault(Fault::Permanent) => Err(ProcessError::permanent("account is closed")),
        }
    }
}
