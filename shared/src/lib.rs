//! The job harness every queue consumer of the platform runs on.
//!
//! A consumer implements [`consumer::Consumer`]; [`harness::Harness`] does the rest for each
//! message: it parses the [`envelope::Envelope`] (anything unparsable is poison), claims the
//! idempotency fence in `core.processed_jobs` **inside the same transaction as the work**
//! ([`fence`]), runs the work, commits, and on failure decides between a retry with backoff
//! ([`retry`], [`decision`]) and a row in `core.dead_letters` ([`dead_letter`]).
//! Successes write nothing but their fence; counts go to [`metrics`].
//!
//! Everything that touches core SQL lives in this crate; a consumer's `main` is
//! [`run::run_consumer`], and its tests can use the test kit (the crate `shared-testkit`, in
//! `shared/testkit/`, as a dev-dependency; this crate has no features, so what deploys is what
//! is tested).
#![warn(missing_docs)]

// A message's life: the consumer's contract, the harness that runs each message through its
// steps, the envelope it reads, the fence and the ledger of executions it keeps, the retry
// decision, and the transport (SQS, the Lambda entry point).
pub mod consumer;
pub mod decision;
pub mod envelope;
pub mod fence;
pub mod harness;
pub mod ledger;
pub mod retry;
pub mod run;
pub mod sqs;

// A letter's afterlife: the letters and their failure groups, the DLQ ingester that writes the
// letters the harness never could, the lease-and-loop driver of its background work, bulk
// operations, paging, replay, and the scheduled run's upkeep.
pub mod dead_letter;
pub mod dlq_ingester;
pub(crate) mod lease;
pub mod operations;
pub mod paging;
pub mod replay;
pub mod upkeep;

// The ground: configuration, the database, identifiers, time, secrets, metrics and traces.
pub mod aws;
pub mod clock;
pub mod config;
pub mod db;
pub mod ids;
pub(crate) mod literal;
pub mod metrics;
pub mod secrets;
pub mod telemetry;

use sqlx::migrate::Migrator;
use std::sync::LazyLock;

/// The migrations of schema `core`, embedded at build time, recorded in their own table
/// `core._sqlx_migrations` (never the database's default one, which other code may use).
///
/// A consumer's own tables migrate with the consumer ([`own_migrations`]); a test database of a
/// consumer gets both ([`with_core_migrations`]). Tests use it as
/// `#[sqlx::test(migrator = "shared::MIGRATOR")]`.
pub static MIGRATOR: LazyLock<Migrator> =
    LazyLock::new(|| own_migrations(sqlx::migrate!("../migrations"), "core"));

/// `migrator` recording itself in `<schema>._sqlx_migrations` (the schema is created first if
/// missing), so each owner's migrations are tracked apart from everyone else's.
///
/// It accepts applied migrations it does not know: migrations are additive, so the code of a
/// previous release (a CloudFormation rollback, or an older version deployed again) runs on the
/// newer schema, and its migrate function must succeed there. An applied migration it does know
/// is still checked against its checksum: a changed migration is refused.
pub fn own_migrations(mut migrator: Migrator, schema: &'static str) -> Migrator {
    migrator.dangerous_set_table_name(format!("{schema}._sqlx_migrations"));
    migrator.create_schema(schema);
    migrator.set_ignore_missing(true);
    migrator
}

/// The core migrations and `own`, in version order and one tracking table: the database a
/// consumer's tests need (`#[sqlx::test(migrator = "my_consumer::MIGRATOR_WITH_CORE")]`).
pub fn with_core_migrations(own: &Migrator) -> Migrator {
    let migrations = MIGRATOR.iter().chain(own.iter()).cloned().collect();
    own_migrations(Migrator::with_migrations(migrations), "core")
}
