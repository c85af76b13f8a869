//! Where the benchmarks measure at RDS latency (`bench-latency`, and `bench-storm`'s 1 ms
//! figure): a throwaway primary with a synchronous streaming standby of its own, and the latency
//! proxy ([`crate::latency_proxy`]) between the clients and the primary and between the primary
//! and its standby, so that a commit waits for the way there and back (Lambda → RDS Proxy →
//! PostgreSQL Multi-AZ).

use super::{BenchDatabase, median, psql};
use crate::latency_proxy::LatencyProxy;
use crate::throwaway_pg::ThrowawayCluster;
use std::net::SocketAddr;
use std::time::Duration;

/// The standby's `application_name`, which `synchronous_standby_names` waits for.
const STANDBY: &str = "standby1";

/// The primary, its synchronous standby, and the two proxies (clients → primary, standby →
/// primary), all at the same round-trip time until set otherwise.
pub struct Deployment {
    /// The primary, which every client reaches through [`Deployment::clients`].
    pub primary: ThrowawayCluster,
    _standby: ThrowawayCluster,
    replication: LatencyProxy,
    /// The proxy between the clients and the primary.
    pub clients: LatencyProxy,
}

impl Deployment {
    /// Starts the primary, its standby through the replication proxy, and the clients' proxy,
    /// both at 0 ms; commits wait for the standby.
    pub fn start() -> Self {
        let primary = ThrowawayCluster::start();
        let address: SocketAddr = format!("127.0.0.1:{}", primary.port).parse().unwrap();
        let replication = LatencyProxy::start(address, Duration::ZERO);
        let standby = primary.standby(replication.addr().port(), STANDBY);
        primary.require_synchronous(STANDBY);
        let clients = LatencyProxy::start(address, Duration::ZERO);
        Self {
            primary,
            _standby: standby,
            replication,
            clients,
        }
    }

    /// Started, the bench schema migrated and seeded for the harness on the primary: the
    /// deployment, and the primary as a [`BenchDatabase`] (its own URL, not the proxy's). `how`
    /// opens the machine line, `rounds` (how the figures are taken) ends it.
    pub async fn seeded(how: &str, rounds: &str) -> (Self, BenchDatabase) {
        let deployment = Self::start();
        let primary = super::open_at(
            deployment.primary.url(),
            2,
            &format!("{how}, commits waiting for a synchronous standby; {rounds}"),
        )
        .await;
        psql(
            &primary.url,
            "reset_for_harness.sql",
            &[("dups", super::runs::DUPS.to_string())],
        );
        (deployment, primary)
    }

    /// Sets the round-trip time of both links.
    pub fn set_rtt(&self, rtt: Duration) {
        self.replication.set_rtt(rtt);
        self.clients.set_rtt(rtt);
    }
}

/// The round trip a client gets through the proxy (a `SELECT 1` on one connection, the median
/// of 200) and a commit (an empty-row insert committed, waiting for the standby), in ms.
pub async fn calibrate(url: &str) -> (f64, f64) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS bench_commit (at timestamptz)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut trips = Vec::new();
    let mut commits = Vec::new();
    for _ in 0..200 {
        let started = std::time::Instant::now();
        sqlx::raw_sql("SELECT 1").execute(&mut conn).await.unwrap();
        trips.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    for _ in 0..50 {
        let started = std::time::Instant::now();
        sqlx::raw_sql("INSERT INTO bench_commit VALUES (now())")
            .execute(&mut conn)
            .await
            .unwrap();
        commits.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    (median(trips), median(commits))
}
