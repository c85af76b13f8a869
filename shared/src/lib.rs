//! The job harness every queue consumer of the platform runs on.
//!
//! A consumer implements [`consumer::Consumer`]; [`harness::Harness`] does the rest for each
//! message: it parses the [`envelope::Envelope`] (anything unparsable is poison), claims the
//! idempotency fence in `core.processed_jobs` **inside the same transaction as the work**
//! ([`fence`]), runs the work, commits, and on failure decides between a retry with backoff
//! ([`retry`], [`decision`]) and a row in `core.dead_letters` ([`dead_letter`]).
//! Successes write nothing but their fence; counts go to [`metrics`].
//!
//! Everything that touches SQL lives in this crate; the Lambda binaries only wire it up.
#![warn(missing_docs)]

pub mod alert_store;
pub mod alerting;
pub mod backstop;
pub mod clock;
pub mod config;
pub mod consumer;
pub mod dead_letter;
pub mod decision;
pub mod envelope;
pub mod escalation;
pub mod execution;
pub mod fence;
pub mod harness;
pub mod ids;
pub mod metrics;
pub mod reference;
pub mod replay;
pub mod retry;
pub mod review;
pub mod run;
pub mod scheduled;
pub mod sqs;
pub mod sweeper;
pub mod telemetry;

/// The migrations of schema `core` (and the reference consumer's table), embedded at build time.
///
/// Tests use it as `#[sqlx::test(migrator = "shared::MIGRATOR")]`; binaries run it at start-up
/// when asked to.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
