//! Every owner's migrations, in the order a deploy applies them: schema `core` first, then each
//! consumer's own. Each owner records its migrations in its own schema's tracking table
//! (`core._sqlx_migrations`, `reference._sqlx_migrations`, …), never the database's default one.
//!
//! Invariant: applying is idempotent (what is recorded is never run again) and serialized (the
//! run holds sqlx's migration advisory lock throughout, so two deploys cannot run one migration
//! twice, nor repair one index twice). A migration waits at most [`LOCK_TIMEOUT`] for a lock live
//! traffic holds: a deploy that cannot get it fails, instead of stalling the consumers behind it.
//!
//! Invariant: a rollback and a re-deploy of an older version succeed. Migrations are additive,
//! so applied migrations this code does not know (a newer release's) are accepted and reported
//! ([`Report::unknown`]); a known migration whose recorded checksum differs is still refused.
//! An index that an interrupted `CREATE INDEX CONCURRENTLY` left invalid (which `IF NOT EXISTS`
//! would skip for ever) is rebuilt before the migrations run ([`repair_invalid_indexes`]).

use serde::Serialize;
use sqlx::migrate::{Migrate, Migrator};
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

/// The owners, in the order a deploy applies them: schema `core`, then each consumer the
/// workspace declares ([`crate::consumers::CONSUMERS`], in member order). A new consumer is
/// found from its own manifest; nothing here names one.
pub fn owners() -> Vec<Owner> {
    let core = Owner {
        name: "core",
        schema: "core",
        migrator: &shared::MIGRATOR,
    };
    std::iter::once(core)
        .chain(crate::consumers::CONSUMERS.iter().map(|c| Owner {
            name: c.label,
            schema: c.schema,
            migrator: c.migrator(),
        }))
        .collect()
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

/// An applied migration this code does not know: a newer release's, seen on a rollback or a
/// re-deploy of an older version. Accepted (migrations are additive), and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unknown {
    /// The owner whose tracking table records it.
    pub owner: &'static str,
    /// Its version.
    pub version: i64,
}

/// An index a run found invalid (left by an interrupted concurrent build) and repaired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repaired {
    /// `schema.index`.
    pub index: String,
    /// `rebuilt` (`REINDEX INDEX CONCURRENTLY`), or `dropped` (the leftover `_ccnew`/`_ccold`
    /// index of an interrupted rebuild).
    pub action: &'static str,
}

/// A migration whose content changed after a database may have applied it, and the content it
/// had there (its checksum). The run records it anew under today's checksum rather than refuse
/// it, because a later migration (`by`) brings a database migrated with either content to the
/// same schema. Any other checksum is still refused.
pub struct Superseded {
    /// The schema whose tracking table records it.
    pub schema: &'static str,
    /// Its version.
    pub version: i64,
    /// The checksum of the content it had (SHA-384, hex), as `_sqlx_migrations` records it.
    pub checksum: &'static str,
    /// The migration that makes either content the same schema.
    pub by: i64,
}

/// Every superseded content of a migration.
pub const SUPERSEDED: &[Superseded] = &[Superseded {
    schema: "core",
    // 0028 (`core.record_letters`) was corrected in place by a session that took it for not yet
    // landed; the corrections moved to 0029, which replaces the function. This is the in-place
    // content's checksum.
    version: 20261205000028,
    checksum: "73f5cc4bc519b4ed40b856394653fd8f7edbb65c187d4a75ae26fa2f5f195b5330379bf461ba5e43be4c89e21a46467c",
    by: 20261206000029,
}];

/// A migration a run recorded anew (see [`Superseded`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rebaselined {
    /// Its owner.
    pub owner: &'static str,
    /// Its version.
    pub version: i64,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The migrations it applied (empty when the schema was up to date).
    pub applied: Vec<Applied>,
    /// Migrations recorded with a superseded content, recorded anew.
    pub rebaselined: Vec<Rebaselined>,
    /// The invalid indexes it repaired.
    pub repaired: Vec<Repaired>,
    /// Applied migrations it does not know (a newer release's).
    pub unknown: Vec<Unknown>,
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
    // Dynamic: the tracking table is named by the owner's schema, and a name cannot be bound.
    sqlx::query_scalar::<Postgres, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE success ORDER BY version"
    )))
    .fetch_all(conn)
    .await
}

/// Applies every owner's pending migrations, in order, on `conn` (with [`LOCK_TIMEOUT`] set on
/// it for the session), after repairing the owners' invalid indexes; returns what it did. Stops
/// at the first failure, which names the owner and the version.
pub async fn apply(conn: &mut PgConnection) -> Result<Report, MigrateError> {
    let setting = format!("SET lock_timeout = '{}ms'", LOCK_TIMEOUT.as_millis());
    // Dynamic: `SET` takes no parameters, so the timeout is written into its text.
    sqlx::raw_sql(sqlx::AssertSqlSafe(setting))
        .execute(&mut *conn)
        .await
        .map_err(|e| MigrateError {
            owner: "core",
            error: e.into(),
        })?;
    // sqlx's own migration lock (session-level, so each migrator's run takes it again), held
    // from the repair to the last owner.
    conn.lock().await.map_err(|error| MigrateError {
        owner: "core",
        error,
    })?;
    let report = apply_locked(conn).await;
    // Every advisory lock of the session: sqlx's runs leave theirs taken when they fail, and the
    // connection goes back to the pool.
    let unlocked = sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut *conn)
        .await;
    let report = report?;
    unlocked.map_err(|e| MigrateError {
        owner: "core",
        error: e.into(),
    })?;
    Ok(report)
}

async fn apply_locked(conn: &mut PgConnection) -> Result<Report, MigrateError> {
    let mut report = Report::default();
    let schemas: Vec<&str> = owners().iter().map(|o| o.schema).collect();
    report.repaired = repair_invalid_indexes(conn, &schemas)
        .await
        .map_err(|e| MigrateError {
            owner: "core",
            error: e.into(),
        })?;
    for owner in owners() {
        let failed = |error| MigrateError {
            owner: owner.name,
            error,
        };
        let before = recorded(conn, owner.schema)
            .await
            .map_err(|e| failed(e.into()))?;
        report.rebaselined.extend(
            rebaseline(conn, &owner, &before)
                .await
                .map_err(|e| failed(e.into()))?,
        );
        report.unknown.extend(
            before
                .iter()
                .filter(|v| !owner.migrator.version_exists(**v))
                .map(|&version| Unknown {
                    owner: owner.name,
                    version,
                }),
        );
        owner.migrator.run(&mut *conn).await.map_err(failed)?;
        report.applied.extend(
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
    if !report.unknown.is_empty() {
        tracing::warn!(unknown = ?report.unknown, "applied migrations this release does not know \
            (a newer release's: a rollback or an older version deployed); accepted, as migrations \
            are additive");
    }
    Ok(report)
}

/// Records anew, under today's checksum, each of `owner`'s migrations its tracking table records
/// (`before`: the versions it records) with a [`Superseded`] content; returns them.
async fn rebaseline(
    conn: &mut PgConnection,
    owner: &Owner,
    before: &[i64],
) -> sqlx::Result<Vec<Rebaselined>> {
    let mut done = Vec::new();
    for old in SUPERSEDED
        .iter()
        .filter(|s| s.schema == owner.schema && before.contains(&s.version))
    {
        let Some(now) = owner.migrator.iter().find(|m| m.version == old.version) else {
            continue;
        };
        // Dynamic: the tracking table is named by the owner's schema, and a name cannot be bound.
        let changed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}._sqlx_migrations SET checksum = $1
              WHERE version = $2 AND checksum = decode($3, 'hex')",
            owner.schema
        )))
        .bind(&*now.checksum)
        .bind(old.version)
        .bind(old.checksum)
        .execute(&mut *conn)
        .await?;
        if changed.rows_affected() > 0 {
            tracing::warn!(
                owner = owner.name,
                version = old.version,
                by = old.by,
                "a migration recorded with a superseded content is recorded anew: a later \
                 migration makes either content the same schema"
            );
            done.push(Rebaselined {
                owner: owner.name,
                version: old.version,
            });
        }
    }
    Ok(done)
}

/// Repairs every invalid index in `schemas`, which an interrupted `CREATE INDEX CONCURRENTLY`
/// (a deploy that timed out, a lock timeout, a killed session) leaves behind: the migration's
/// `IF NOT EXISTS` skips it on the rerun, which then records the migration as applied over an
/// index that is never used. Each is rebuilt with `REINDEX INDEX CONCURRENTLY` (from its own
/// definition, so the index is never missing while it is rebuilt); a leftover of an interrupted
/// rebuild (`…_ccnew`, `…_ccold`) is dropped, concurrently. An index another session is building
/// right now is left to it. Returns what it repaired.
///
/// Needs `conn` outside a transaction block (both statements refuse to run in one).
pub async fn repair_invalid_indexes(
    conn: &mut PgConnection,
    schemas: &[&str],
) -> sqlx::Result<Vec<Repaired>> {
    let schemas: Vec<String> = schemas.iter().map(|s| (*s).to_owned()).collect();
    let invalid: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.nspname::text, c.relname::text
         FROM pg_index i
         JOIN pg_class c ON c.oid = i.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE NOT i.indisvalid AND n.nspname = ANY($1)
           AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index p
                           WHERE p.index_relid = i.indexrelid)
         -- leftovers of an interrupted rebuild first, then the indexes to rebuild
         ORDER BY c.relname !~ '_cc(new|old)[0-9]*$', n.nspname, c.relname",
    )
    .bind(&schemas)
    .fetch_all(&mut *conn)
    .await?;
    let mut repaired = Vec::with_capacity(invalid.len());
    for (schema, index) in invalid {
        let name = format!("{}.{}", quote_ident(&schema), quote_ident(&index));
        let leftover = is_rebuild_leftover(&index);
        let (statement, action) = if leftover {
            (
                format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"),
                "dropped",
            )
        } else {
            (format!("REINDEX INDEX CONCURRENTLY {name}"), "rebuilt")
        };
        tracing::warn!(index = %format!("{schema}.{index}"), action, "repairing an invalid index");
        // Dynamic: the statement names its index (a name cannot be bound), built just above.
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await?;
        repaired.push(Repaired {
            index: format!("{schema}.{index}"),
            action,
        });
    }
    Ok(repaired)
}

/// Whether `index` is the transient index of a `REINDEX CONCURRENTLY` that did not finish.
fn is_rebuild_leftover(index: &str) -> bool {
    ["_ccnew", "_ccold"].iter().any(|suffix| {
        index.rfind(suffix).is_some_and(|at| {
            index[at + suffix.len()..]
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
    })
}

/// `ident` as a quoted SQL identifier.
fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_transient_indexes_of_a_rebuild_are_leftovers() {
        for leftover in ["x_ccnew", "x_ccnew1", "x_ccold", "x_ccold12"] {
            assert!(is_rebuild_leftover(leftover), "{leftover}");
        }
        for index in ["x", "x_ccnewer", "ccnew_x", "dead_letters_message_idx"] {
            assert!(!is_rebuild_leftover(index), "{index}");
        }
        assert_eq!(quote_ident(r#"a"b"#), r#""a""b""#);
    }
}
