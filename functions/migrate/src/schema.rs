//! Every owner's migrations, in the order a deploy applies them: schema `core` first, then each
//! consumer's own. Each owner records its migrations in its own schema's tracking table
//! (`core._sqlx_migrations`, `reference._sqlx_migrations`, …), never the database's default one.
//!
//! Invariant: applying is idempotent (what is recorded is never run again) and serialized (sqlx
//! holds an advisory lock while it migrates, so two deploys cannot run one migration twice). A
//! migration waits at most [`LOCK_TIMEOUT`] for a lock live traffic holds: a deploy that cannot
//! get it fails, instead of stalling the consumers behind it.

use serde::Serialize;
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, Postgres};
use std::time::Duration;

/// How long one migration statement waits for a lock before the deploy fails.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Who owns a set of migrations, and its schema (where its tracking table lives).
pub struct Owner {
    /// For the report.
    pub name: &'static str,
    /// The schema its tracking table is in.
    pub schema: &'static str,
    /// Its migrations.
    pub migrator: &'static Migrator,
}

/// The owners, in the order a deploy applies them. A new consumer adds its own here.
pub fn owners() -> [Owner; 3] {
    [
        Owner {
            name: "core",
            schema: "core",
            migrator: &shared::MIGRATOR,
        },
        Owner {
            name: "award-points (reference consumer)",
            schema: "reference",
            migrator: &consumer::MIGRATOR,
        },
        Owner {
            name: "redeem-reward",
            schema: "rewards",
            migrator: &redeem_reward::MIGRATOR,
        },
    ]
}

/// One migration a run applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Its owner.
    pub owner: &'static str,
    /// Its version.
    pub version: i64,
    /// Its description.
    pub description: String,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
#[error("{owner} migrations failed: {error}")]
pub struct MigrateError {
    /// Whose migration failed.
    pub owner: &'static str,
    /// The error, with the migration's version.
    pub error: sqlx::migrate::MigrateError,
}

/// The versions already recorded in `schema`'s tracking table (none if it does not exist yet).
async fn recorded(conn: &mut PgConnection, schema: &str) -> sqlx::Result<Vec<i64>> {
    let table = format!("{schema}._sqlx_migrations");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar::<Postgres, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE success ORDER BY version"
    )))
    .fetch_all(conn)
    .await
}

/// Applies every owner's pending migrations, in order, on `conn` (with [`LOCK_TIMEOUT`] set on
/// it for the session); returns what it applied (empty when the schema was up to date). Stops
/// at the first failure, which names the owner and the version.
pub async fn apply(conn: &mut PgConnection) -> Result<Vec<Applied>, MigrateError> {
    let setting = format!("SET lock_timeout = '{}ms'", LOCK_TIMEOUT.as_millis());
    sqlx::raw_sql(sqlx::AssertSqlSafe(setting))
        .execute(&mut *conn)
        .await
        .map_err(|e| MigrateError {
            owner: "core",
            error: e.into(),
        })?;
    let mut applied = Vec::new();
    for owner in owners() {
        let failed = |error| MigrateError {
            owner: owner.name,
            error,
        };
        let before = recorded(conn, owner.schema)
            .await
            .map_err(|e| failed(e.into()))?;
        owner.migrator.run(&mut *conn).await.map_err(failed)?;
        applied.extend(
            owner
                .migrator
                .iter()
                .filter(|m| !m.migration_type.is_down_migration())
                .filter(|m| !before.contains(&m.version))
                .map(|m| Applied {
                    owner: owner.name,
                    version: m.version,
                    description: m.description.to_string(),
                }),
        );
    }
    Ok(applied)
}
