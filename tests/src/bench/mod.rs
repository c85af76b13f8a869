//! What the benchmark binaries (`src/bin/bench-*.rs`) share: the database they measure on, the
//! baselines' SQL scripts (`bench/*.sql`) run through psql, medians, pools built as the
//! functions build theirs, the functions' binaries driven with SQS events ([`lambda`]), and the
//! primary with a synchronous standby behind the latency proxy ([`standby`]).

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::process::Command;
use std::time::Duration;

pub mod lambda;
pub mod runs;
pub mod standby;

/// The database a benchmark measures on.
pub struct BenchDatabase {
    /// `DATABASE_URL`.
    pub url: String,
    /// A pool on it, migrated.
    pub pool: PgPool,
    /// The server's version.
    pub version: String,
}

/// [`open_at`] `DATABASE_URL`.
pub async fn open(connections: u32, method: &str) -> BenchDatabase {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL: is not set");
    open_at(url, connections, method).await
}

/// Connects to `url` with `connections`, migrates, and prints the machine (cores, PostgreSQL
/// version) and `method`, how the figures are taken.
pub async fn open_at(url: String, connections: u32, method: &str) -> BenchDatabase {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(&url)
        .await
        .expect("connect to DATABASE_URL");
    consumer::MIGRATOR_WITH_CORE
        .run(&pool)
        .await
        .expect("migrate");
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await
        .expect("server version");
    println!(
        "machine: {} cores, PostgreSQL {version}; {method}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    BenchDatabase { url, pool, version }
}

/// The path of `tests/bench/<name>`.
pub fn script(name: &str) -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/bench/").to_owned() + name
}

/// Runs `tests/bench/<file>` with psql, stopping at the first error, with `vars` as `-v k=v`.
pub fn psql(url: &str, file: &str, vars: &[(&str, String)]) {
    let mut cmd = Command::new("psql");
    cmd.args([url, "-q", "-v", "ON_ERROR_STOP=1", "-f", &script(file)]);
    for (k, v) in vars {
        cmd.args(["-v", &format!("{k}={v}")]);
    }
    let status = cmd.status().expect("psql runs");
    assert!(status.success(), "psql -f {file} failed");
}

/// Writes `figures` to `target/bench/<name>.json` (at the workspace root, wherever the benchmark
/// runs from) and says so.
pub fn write_figures(name: &str, figures: &serde_json::Value) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench");
    std::fs::create_dir_all(dir).expect("target/bench");
    let text = serde_json::to_string_pretty(figures).expect("figures as JSON");
    std::fs::write(format!("{dir}/{name}.json"), text).expect("the figures written");
    println!("\nwritten to target/bench/{name}.json");
}

/// The median (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// A pool built as the functions build theirs (`DatabaseConfig::lazy_pool`), with all `size`
/// connections opened before any clock starts, as pgbench does.
pub async fn warm_pool(url: &str, size: usize) -> PgPool {
    let mut config = shared::config::DatabaseConfig::for_url(url, size as u32);
    config.acquire_timeout = Duration::from_secs(30);
    let pool = config.lazy_pool().expect("a valid URL");
    let open: Vec<_> = futures_util::future::join_all((0..size).map(|_| pool.acquire()))
        .await
        .into_iter()
        .map(|c| c.expect("connection"))
        .collect();
    drop(open);
    pool
}
