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

    /// Records one sample of the consumer's own metric `name` in `unit` (a provider call's
    /// time, a card's size); it leaves as EMF with the harness's metrics. For a duration,
    /// [`Job::observe_duration`].
    pub fn observe(&self, name: &'static str, value: f64, unit: crate::metrics::Unit) {
        self.metrics.observe(name, value, unit);
    }

    /// Records `duration` as a sample of the consumer's own metric `name`, in milliseconds.
    pub fn observe_duration(&self, name: &'static str, duration: std::time::Duration) {
        self.metrics.observe_duration(name, duration);
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

    /// A database error inside the work, classified by its SQLSTATE: what the job's own data
    /// caused fails the same way on every retry, so it is **permanent** (a letter at once);
    /// everything else is **transient**, as the plain `?` makes it.
    ///
    /// - Permanent: class `23`, integrity constraint violations (`23505` unique, `23503`
    ///   foreign key, `23514` check, `23502` not null, `23P01` exclusion), and class `22`, data
    ///   exceptions (`22P02` invalid text, `22003` numeric out of range, `22001` string too long,
    ///   `22007`/`22008` dates, `22012` division by zero, …).
    /// - Transient: class `40` (`40001` serialization failure, `40P01` deadlock), `55P03` lock
    ///   not available, `57014` a statement timeout, class `08` and every error that is not the
    ///   server's (a connection refused or lost, a pool timeout), and any other SQLSTATE.
    ///
    /// The message and the source are those of the plain conversion. Use it where the error
    /// comes back: `.execute(&mut *tx).await.map_err(ProcessError::from_database)?`. An error
    /// you know better (a unique violation that means "already done" is `Ok` for you) is yours
    /// to match first.
    pub fn from_database(e: sqlx::Error) -> Self {
        let permanent = e
            .as_database_error()
            .and_then(|db| db.code())
            .is_some_and(|code| is_the_jobs_data(&code));
        match Self::from(e) {
            Self::Transient(cause) if permanent => Self::Permanent(cause),
            other => other,
        }
    }
}

/// Whether `sqlstate` says the statement's data is at fault: integrity constraint violation
/// (class 23) or data exception (class 22).
fn is_the_jobs_data(sqlstate: &str) -> bool {
    sqlstate.starts_with("23") || sqlstate.starts_with("22")
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
    /// retried. [`ProcessError::from_database`] makes a constraint violation or a data exception
    /// permanent instead. The sqlx error is kept as the cause's source.
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

/// [`ProcessError::from_database`] against the errors PostgreSQL itself raises.
#[cfg(test)]
mod database_errors {
    use super::*;
    use sqlx::{Executor, PgPool};

    /// What `sql` fails with, on a connection of its own (never given back: its settings leave
    /// with it).
    async fn error_of(pool: &PgPool, sql: &str) -> ProcessError {
        let mut conn = crate::db::acquire(pool).await.unwrap();
        let e = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut *conn)
            .await
            .expect_err(sql);
        ProcessError::from_database(e)
    }

    fn sqlstate(e: &ProcessError) -> String {
        let sqlx_error = std::error::Error::source(e.cause())
            .and_then(|s| s.downcast_ref::<sqlx::Error>())
            .expect("the sqlx error, kept");
        sqlx_error
            .as_database_error()
            .and_then(|db| db.code())
            .map(|c| c.into_owned())
            .unwrap_or_default()
    }

    const TABLES: &str = "CREATE TABLE parents (id int PRIMARY KEY);
        CREATE TABLE badges (
            job_id int PRIMARY KEY,
            parent int REFERENCES parents (id),
            code varchar(4) NOT NULL UNIQUE,
            points int CHECK (points > 0)
        );
        INSERT INTO parents VALUES (1);
        INSERT INTO badges VALUES (1, 1, 'gold', 5);";

    #[sqlx::test(migrations = false)]
    async fn constraint_violations_and_data_exceptions_are_permanent(pool: PgPool) {
        pool.execute(TABLES).await.unwrap();
        for (sql, expected) in [
            ("INSERT INTO badges VALUES (2, 1, 'gold', 5)", "23505"),
            ("INSERT INTO badges VALUES (2, 9, 'blue', 5)", "23503"),
            ("INSERT INTO badges VALUES (2, 1, 'blue', 0)", "23514"),
            ("INSERT INTO badges VALUES (2, 1, NULL, 5)", "23502"),
            ("INSERT INTO badges VALUES (2, 1, 'platinum', 5)", "22001"),
            ("SELECT 'lots'::int", "22P02"),
            ("SELECT 2147483647::int + 1", "22003"),
            ("SELECT 1 / 0", "22012"),
            ("SELECT '2026-13-01'::date", "22008"),
        ] {
            let e = error_of(&pool, sql).await;
            assert_eq!(sqlstate(&e), expected, "{sql}");
            assert!(matches!(e, ProcessError::Permanent(_)), "{sql}: {e:?}");
            assert!(
                e.to_string().contains(&format!("(SQLSTATE {expected})")),
                "{e}"
            );
        }
    }

    #[sqlx::test(migrations = false)]
    async fn serialization_failures_deadlocks_lock_and_statement_timeouts_are_transient(
        pool: PgPool,
    ) {
        for (sql, expected) in [
            (
                "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$",
                "40001",
            ),
            (
                "DO $$ BEGIN RAISE EXCEPTION 'cycle' USING ERRCODE = 'deadlock_detected'; END $$",
                "40P01",
            ),
            (
                "SET statement_timeout = '10ms'; SELECT pg_sleep(1)",
                "57014",
            ),
            ("SELECT * FROM no_such_table", "42P01"),
        ] {
            let e = error_of(&pool, sql).await;
            assert_eq!(sqlstate(&e), expected, "{sql}");
            assert!(matches!(e, ProcessError::Transient(_)), "{sql}: {e:?}");
        }
        // A lock another transaction holds, for real.
        pool.execute("CREATE TABLE held (id int)").await.unwrap();
        let mut tx = crate::db::begin(&pool).await.unwrap();
        tx.execute("LOCK TABLE held").await.unwrap();
        let e = error_of(&pool, "SET lock_timeout = '10ms'; SELECT * FROM held").await;
        assert_eq!(sqlstate(&e), "55P03");
        assert!(matches!(e, ProcessError::Transient(_)), "{e:?}");
        tx.rollback().await.unwrap();
    }

    /// Errors that are not the server's: the database cannot be reached, or not in time.
    #[tokio::test]
    async fn a_connection_error_is_transient() {
        let refused = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_secs(2))
            .connect("postgres://nobody@127.0.0.1:1/none")
            .await
            .expect_err("nothing listens on port 1");
        for e in [refused, sqlx::Error::PoolTimedOut] {
            let classified = ProcessError::from_database(e);
            assert!(
                matches!(classified, ProcessError::Transient(_)),
                "{classified:?}"
            );
        }
    }
}
