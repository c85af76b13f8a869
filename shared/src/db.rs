//! The database every function works on: its pool, and, when the credentials live in Secrets
//! Manager, their refresh.
//!
//! Invariant: credentials are read at run time and cached; when the database rejects them (a
//! rotation), the secret is read again and the pool opens every new connection with the new
//! ones, with no deploy and no restart. Connections already open stay as they are (PostgreSQL
//! keeps a session whose password changed).
//!
//! Its settings are `crate::config::DatabaseConfig`, which builds it ([`Database::new`]).

use crate::secrets::{Secret, SecretError};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A function's database.
#[derive(Debug, Clone)]
pub struct Database {
    pool: PgPool,
    credentials: Option<Credentials>,
}

#[derive(Debug, Clone)]
struct Credentials {
    secret: Secret,
    loaded: Arc<AtomicBool>,
}

/// Why the database is not ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// The credentials' secret could not be read.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The secret's value is neither a `postgres://` URL nor RDS's JSON.
    #[error(
        "the database secret holds neither a postgres:// URL nor RDS's JSON (username, password, host, port, dbname): {0}"
    )]
    Unreadable(String),
    /// The database refused or failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The JSON RDS and Secrets Manager's rotation functions keep in a database secret.
#[derive(Deserialize)]
struct RdsSecret {
    username: String,
    password: String,
    host: String,
    port: Option<u16>,
    dbname: Option<String>,
}

/// Connect options from a secret's value: a URL, or RDS's JSON.
fn connect_options(value: &str) -> Result<PgConnectOptions, NotReady> {
    let value = value.trim();
    if value.starts_with("postgres://") || value.starts_with("postgresql://") {
        return PgConnectOptions::from_str(value)
            .map_err(|e| NotReady::Unreadable(format!("not a valid URL ({e})")));
    }
    let rds: RdsSecret = serde_json::from_str(value)
        .map_err(|e| NotReady::Unreadable(format!("not that JSON ({})", e.classify_name())))?;
    let mut options = PgConnectOptions::new()
        .host(&rds.host)
        .port(rds.port.unwrap_or(5432))
        .username(&rds.username)
        .password(&rds.password);
    if let Some(db) = &rds.dbname {
        options = options.database(db);
    }
    Ok(options)
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "a field is missing or of the wrong type",
            serde_json::error::Category::Eof => "cut short",
        }
    }
}

/// Whether `error` is the database rejecting the credentials (`28P01` invalid password, `28000`
/// invalid authorization).
pub(crate) fn is_rejected_credentials(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "28P01" || code == "28000")
}

/// Whether `error` is a pooled connection that died (the server ended it, or its socket is
/// gone): the pool drops it, and another connection may well work.
fn is_lost_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server ended the session.
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|c| matches!(c.as_ref(), "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

impl Database {
    /// A database on `pool`, whose credentials, if any, `secret` holds (read by
    /// [`Database::ready`]). [`Database::new`] builds one from its settings.
    pub(crate) fn on(pool: PgPool, secret: Option<Secret>) -> Self {
        Self {
            pool,
            credentials: secret.map(|secret| Credentials {
                secret,
                loaded: Arc::default(),
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Before an invocation's work: one round trip that proves a connection works. A dead
    /// pooled connection is dropped and another tried; credentials the database rejects are read
    /// again from their secret and tried once more. Returns the last error if none worked (the
    /// work then fails or hands its records back as it would with the database down).
    pub async fn ready(&self) -> Result<(), NotReady> {
        if let Some(credentials) = &self.credentials
            && !credentials.loaded.load(Ordering::Acquire)
        {
            self.apply(&credentials.secret.value().await?)?;
            credentials.loaded.store(true, Ordering::Release);
        }
        let mut refreshed = false;
        let mut last = None;
        // Every pooled connection may have died (a database restart): each is tried and
        // dropped, then a new one (and once more after reading the credentials again).
        let tries = self.pool.size() + 2;
        for _ in 0..tries {
            match sqlx::query!("SELECT 1 AS one").fetch_one(&self.pool).await {
                Ok(_) => return Ok(()),
                Err(e) if is_rejected_credentials(&e) && !refreshed => {
                    let Some(credentials) = &self.credentials else {
                        return Err(e.into());
                    };
                    tracing::warn!(
                        "the database rejected the credentials: reading their secret again"
                    );
                    self.apply(&credentials.secret.refreshed().await?)?;
                    refreshed = true;
                    last = Some(e);
                }
                Err(e) if is_lost_connection(&e) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map(NotReady::from).unwrap_or(NotReady::Unreadable(
            "no connection could be checked".into(),
        )))
    }

    fn apply(&self, value: &str) -> Result<(), NotReady> {
        self.pool.set_connect_options(connect_options(value)?);
        Ok(())
    }
}

/// What ends every use of a harness lane (`harness::lanes`) after its transaction, in the same
/// query string: the session as
/// the connection opened it (its startup parameters are its defaults, kept). Each statement is
/// allowed in a transaction block and in a read-only transaction, which a multi-statement query
/// and a handler's `SET default_transaction_read_only` make it; `DISCARD ALL` is not, and sqlx's
/// prepared statements are kept (`DEALLOCATE` would break its statement cache).
pub(crate) const RESET_SESSION: &str =
    "RESET ALL; DISCARD TEMP; SELECT pg_advisory_unlock_all(); UNLISTEN *";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_a_url_or_rds_json() {
        let url = connect_options("postgres://app:pw@db.internal:6432/points").unwrap();
        assert_eq!(
            (url.get_host(), url.get_port(), url.get_database()),
            ("db.internal", 6432, Some("points"))
        );
        let rds = connect_options(
            r#"{"engine": "postgres", "username": "app", "password": "pw", "host": "proxy.internal", "port": 5432, "dbname": "points"}"#,
        )
        .unwrap();
        assert_eq!(
            (rds.get_host(), rds.get_username(), rds.get_database()),
            ("proxy.internal", "app", Some("points"))
        );
        for bad in ["", "hunter2", r#"{"username": "app"}"#] {
            let err = connect_options(bad).unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
