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

/// A connection taken out of a pool ([`acquire`]) for work that may open transactions on it,
/// given back with [`Held::give_back`] once that work has ended (well or not: sqlx has by then
/// rolled back, or queued the rollback of, whatever transaction it knows of). Dropped before
/// (its holder cut off at an await: a timeout, a `select!`, an aborted task), it is closed
/// instead, and the server rolls back what it was inside of, as if the process had died there.
/// For why a cut-off connection must not go back to the pool, see [`begin`].
pub struct Held {
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
    given_back: bool,
}

/// A connection of `pool` held for work that may open transactions on it ([`Held`]).
#[allow(clippy::disallowed_methods)] // the one place a connection leaves the pool unguarded
pub async fn acquire(pool: &PgPool) -> sqlx::Result<Held> {
    Ok(Held {
        conn: pool.acquire().await?,
        given_back: false,
    })
}

impl Held {
    /// The work on the connection has ended: it goes back to the pool.
    pub fn give_back(mut self) {
        self.given_back = true;
    }
}

impl std::ops::Deref for Held {
    type Target = sqlx::PgConnection;

    fn deref(&self) -> &Self::Target {
        &self.conn
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.conn
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.given_back {
            self.conn.close_on_drop();
        }
    }
}

/// A transaction on a connection of `pool`, begun so that a caller cut off while it begins
/// (its future dropped: a timeout, a `select!`, an aborted task) leaves no connection inside a
/// transaction in the pool.
///
/// Why: sqlx 0.9's `begin` sends `BEGIN`, then waits for its answer; dropped while it waits,
/// its guard rolls back only a transaction sqlx already counts, and this one it counts only
/// once answered. The connection goes back to the pool with the `BEGIN` sent (or still in its
/// buffer, flushed by the pool's test on return) and the server inside a transaction sqlx does
/// not know of: every statement the pool runs on it afterwards commits nothing and holds its
/// locks, until the connection closes and the server rolls all of it back. Here the `BEGIN` is
/// sent by a task of its own, which ends whether or not its caller is still waiting: the
/// transaction it began, if nobody takes it, is dropped there (sqlx counts it by then, so it is
/// rolled back before the connection is used again).
#[allow(clippy::disallowed_methods)] // the one place a pool's begin is called
pub async fn begin(pool: &PgPool) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => begun,
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        // The runtime is shutting down: the task never ran, or ran no further than its caller.
        Err(_) => Err(sqlx::Error::WorkerCrashed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP proxy to the server `connect` names, whose answers can be held back: while
    /// `hold` is set, what the server sends waits in the proxy.
    async fn holding_proxy(
        connect: &sqlx::postgres::PgConnectOptions,
        hold: Arc<AtomicBool>,
    ) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = format!("{}:{}", connect.get_host(), connect.get_port());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = tokio::net::TcpStream::connect(&server).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let hold = hold.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                        while hold.load(Ordering::SeqCst) {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    /// After `cut_off` (given the pool) was cut off while it waited for the answer to a
    /// `BEGIN` (the answer held back by a proxy, the caller's future dropped by a timeout), the
    /// pool's next statement is committed (seen from another connection) and its connection is
    /// not idle in a transaction after it.
    async fn no_transaction_left_after<F, Fut>(
        connect: sqlx::postgres::PgConnectOptions,
        cut_off: F,
    ) where
        F: FnOnce(PgPool) -> Fut,
        Fut: Future<Output = ()>,
    {
        let hold = Arc::new(AtomicBool::new(false));
        let port = holding_proxy(&connect, hold.clone()).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            // The pool's own test of an idle connection would wait on the held answers first.
            .test_before_acquire(false)
            .connect_with(connect.clone().host("127.0.0.1").port(port))
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE written (n int)")
            .execute(&pool)
            .await
            .unwrap();
        let mut observer = <sqlx::PgConnection as sqlx::Connection>::connect_with(&connect)
            .await
            .unwrap();
        hold.store(true, Ordering::SeqCst);
        let cut =
            tokio::time::timeout(std::time::Duration::from_millis(200), cut_off(pool.clone()))
                .await;
        assert!(
            cut.is_err(),
            "the BEGIN was answered while its answer was held"
        );
        hold.store(false, Ordering::SeqCst);
        let pid: i32 =
            sqlx::query_scalar("INSERT INTO written VALUES (1) RETURNING pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .unwrap();
        let (state, seen): (Option<String>, i64) = sqlx::query_as(
            "SELECT (SELECT state FROM pg_stat_activity WHERE pid = $1),
                    (SELECT count(*) FROM written)",
        )
        .bind(pid)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        // Not `idle in transaction` (through a transaction pooler the backend may be serving
        // the observer's own statement by now: `active`).
        let in_transaction = state
            .as_deref()
            .is_some_and(|s| s.starts_with("idle in transaction"));
        assert!(
            !in_transaction && seen == 1,
            "after a begin cut off, the pool's connection is {state:?} and its insert was seen \
             from outside {seen} times"
        );
    }

    /// [`begin`] cut off while its `BEGIN` waits for its answer (sqlx's own leaves the
    /// connection in the pool inside a transaction: this failed so, `Some("idle in
    /// transaction")`, its insert seen 0 times).
    #[sqlx::test(migrations = false)]
    async fn a_begin_cut_off_leaves_no_connection_inside_a_transaction(
        _: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        no_transaction_left_after(connect, |pool| async move {
            let _ = begin(&pool).await;
        })
        .await;
    }

    /// A [`Held`] connection's holder cut off in a `BEGIN` of its own (sqlx's, on the held
    /// connection): the connection is closed, not given back.
    #[sqlx::test(migrations = false)]
    async fn a_held_connection_cut_off_in_its_begin_is_closed_not_given_back(
        _: sqlx::postgres::PgPoolOptions,
        connect: sqlx::postgres::PgConnectOptions,
    ) {
        no_transaction_left_after(connect, |pool| async move {
            let mut held = acquire(&pool).await.unwrap();
            let tx = sqlx::Connection::begin(&mut *held).await.unwrap();
            tx.commit().await.unwrap();
            held.give_back();
        })
        .await;
    }

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
