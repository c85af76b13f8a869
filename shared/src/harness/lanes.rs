//! The connections the harness keeps between jobs: a job's transaction and a batch's lookup run
//! on a lane, a connection taken out of the pool and kept by the harness from one job to the
//! next.
//!
//! Why: sqlx's pool tests every connection given back to it with a round trip of its own (a
//! `Sync`, not configurable in sqlx 0.9), so a job on a pooled connection costs one round trip
//! more than its statements, and at RDS latency a round trip is what a job costs. A lane goes
//! back to the harness without one.
//!
//! Invariants:
//! - a lane is kept only when it is known to be outside any transaction (its last statement
//!   ended the transaction, or opened none); one given up inside a transaction, or after an
//!   error that leaves its state unknown, is closed, and the server rolls back what it held;
//! - sqlx counts one transaction on every lane, for its whole life (see [`new_lane`]), so a
//!   handler's `Connection::begin` inside the job's transaction nests as a `SAVEPOINT`, as it
//!   would inside a transaction sqlx began;
//! - a lane is a clean connection for every job: whatever session state a handler left on it
//!   (a `SET`, a read-only default, a temporary table, a session advisory lock, a `LISTEN`) is
//!   reset by [`crate::db::RESET_SESSION`], sent in the same round trip as the statement that ends the
//!   job's transaction (`COMMIT` or `ROLLBACK`), so no job inherits another's session;
//! - at most as many lanes are kept idle as the pool has connections; lanes in use are at most
//!   the records a harness runs at once. New lanes come from the pool (with its credentials,
//!   refreshed as `crate::db` refreshes them) and leave its count, so statements on the pool
//!   never wait for a lane.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use std::sync::Mutex;

/// The harness's idle lanes.
pub(super) struct Lanes {
    idle: Mutex<Vec<PgConnection>>,
    keep: usize,
}

/// A connection in use by one job (or one batch's lookup).
pub(super) struct Lane<'a> {
    conn: Option<PgConnection>,
    home: &'a Lanes,
    /// Kept by the harness before this use (it may have died while idle).
    pub(super) reused: bool,
    /// Known to be outside any transaction: it may go back to the idle lanes.
    idle: bool,
}

impl Lanes {
    /// Lanes for a harness on `pool`, as many kept idle as it has connections.
    pub(super) fn new(pool: &PgPool) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            keep: pool.options().get_max_connections().max(1) as usize,
        }
    }

    /// An idle lane, or a new one from `pool`.
    pub(super) async fn take(&self, pool: &PgPool) -> sqlx::Result<Lane<'_>> {
        let kept = self.idle.lock().expect("lanes lock").pop();
        let reused = kept.is_some();
        let conn = match kept {
            Some(conn) => conn,
            None => new_lane(pool).await?,
        };
        Ok(Lane {
            conn: Some(conn),
            home: self,
            reused,
            idle: true,
        })
    }
}

/// A connection from `pool`, out of its count, on which sqlx counts one transaction.
///
/// sqlx nests a `Connection::begin` as a `SAVEPOINT` only inside a transaction it counts (one
/// it began); otherwise it sends `BEGIN`, which PostgreSQL ignores inside a transaction, and the
/// nested rollback would then roll back the job's whole transaction, fence included, while the
/// work after it went on outside any transaction. The harness begins and ends the job's
/// transaction with statements of its own (the claim with `BEGIN`, the check with `COMMIT`), so
/// it sets sqlx's count once: a `BEGIN` through sqlx, which counts it, and a `ROLLBACK` sqlx
/// does not see. Two round trips, once per connection.
async fn new_lane(pool: &PgPool) -> sqlx::Result<PgConnection> {
    // Detached at once: a lane is closed, never given back to the pool (see `Lane`'s drop).
    #[allow(clippy::disallowed_methods)]
    let mut conn = PoolConnection::<Postgres>::detach(pool.acquire().await?);
    // Forgotten, the transaction handle neither ends the transaction nor lowers the count.
    std::mem::forget(conn.begin().await?);
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;
    Ok(conn)
}

impl Lane<'_> {
    /// The connection.
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a lane in use has its connection")
    }

    /// From now on the connection may be inside a transaction (or in a state not known): it is
    /// closed when given up, unless [`Lane::ended`] says otherwise first.
    pub(super) fn entered(&mut self) {
        self.idle = false;
    }

    /// The connection is outside any transaction again.
    pub(super) fn ended(&mut self) {
        self.idle = true;
    }

    /// Rolls back the transaction the lane is in and resets its session ([`crate::db::RESET_SESSION`]);
    /// the lane is kept if that was answered.
    pub(super) async fn rollback(&mut self) -> sqlx::Result<()> {
        let sql = sqlx::AssertSqlSafe(format!("ROLLBACK; {}", crate::db::RESET_SESSION));
        sqlx::raw_sql(sql).execute(self.conn()).await?;
        self.ended();
        Ok(())
    }

    /// Closes this lane's connection and takes a new one from `pool`: for a lane that died
    /// while idle.
    pub(super) async fn renew(&mut self, pool: &PgPool) -> sqlx::Result<()> {
        self.conn = None;
        self.conn = Some(new_lane(pool).await?);
        self.reused = false;
        self.idle = true;
        Ok(())
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.idle {
            let mut idle = self.home.idle.lock().expect("lanes lock");
            if idle.len() < self.home.keep {
                idle.push(conn);
                return;
            }
        }
        // Dropping the connection closes its socket; the server rolls back what it held.
        drop(conn);
    }
}
