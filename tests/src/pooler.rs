//! A PgBouncer of the test's own in transaction mode: the local analog of RDS Proxy's
//! multiplexing, where each transaction of a client may run on a different server connection
//! and nothing of a session outlives its transaction.
//!
//! The binary is `PGBOUNCER`, else `.tools/pgbouncer/bin/pgbouncer` (built by `scripts/lib.sh`'s
//! `ensure_pgbouncer`: Debian 12's 1.18 cannot carry named prepared statements across a
//! transaction pool, 1.21 and later can with `max_prepared_statements`). It listens on a free
//! port of 127.0.0.1, forwards every database name to the upstream server, and is stopped and
//! removed when dropped. PgBouncer refuses to run as root, so as root it runs as `postgres`.

use crate::latency_proxy::{on_local_port, password_of};
use crate::throwaway_pg::{free_port, is_root, run};
use sqlx::postgres::PgConnectOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A running PgBouncer.
#[derive(Debug)]
pub struct Pooler {
    child: Child,
    dir: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

/// What the pooler's admin console says of one pool (`SHOW POOLS`): one database and user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCounts {
    /// The pool's database.
    pub database: String,
    /// Client connections waiting for a server connection (`cl_waiting`): more clients
    /// wanted one at once than the pool has.
    pub waiting: u32,
    /// Server connections open, busy or idle.
    pub servers: u32,
}

impl Pooler {
    /// PgBouncer in transaction mode in front of the server of `upstream` (a `postgres://` URL:
    /// its host, port, user and password; any database name), at most `pool_size` server
    /// connections per database and user. Panics with the reason if it does not start.
    pub fn start(upstream: &str, pool_size: u32) -> Self {
        let options = PgConnectOptions::from_str(upstream).expect("a postgres:// URL");
        let binary = binary();
        let dir = std::env::temp_dir().join(format!("pgbouncer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("the pooler's directory");
        let port = free_port();
        let user = options.get_username();
        // With `auth_type = trust` clients are not asked for a password; the file names who may
        // connect, and its password is what PgBouncer logs in to the server with.
        let password = password_of(upstream);
        assert!(
            !password.contains(['"', '%']),
            "the upstream URL's password must be written plainly (no quote, no percent-escape)"
        );
        std::fs::write(
            dir.join("users.txt"),
            format!("\"{user}\" \"{password}\"\n"),
        )
        .expect("the pooler's auth file");
        let config = format!(
            "[databases]\n\
             * = host={host} port={upstream_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             admin_users = {user}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 2000\n\
             max_prepared_statements = 500\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_idle_timeout = 2\n\
             query_wait_timeout = 60\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            host = options.get_host(),
            upstream_port = options.get_port(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("the pooler's config");
        let mut command = Command::new(&binary);
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir));
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let pooler = Self { child, dir, port };
        pooler.wait_until_listening();
        pooler
    }

    /// `options` pointed at the pooler instead of the server (same database, user, password).
    pub fn connect_options(&self, options: &PgConnectOptions) -> PgConnectOptions {
        options.clone().host("127.0.0.1").port(self.port)
    }

    /// `url` (a `postgres://` URL of the upstream server) pointed at the pooler.
    pub fn url_for(&self, url: &str) -> String {
        on_local_port(url, self.port)
    }

    /// What the binary says of itself (`PgBouncer 1.24.1`).
    pub fn version() -> String {
        let output = Command::new(binary()).arg("--version").output();
        output
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|v| v.lines().next().map(str::to_string))
            .unwrap_or_default()
    }

    /// The pools' counts now (`SHOW POOLS` on the admin console), the admin console's own left out.
    pub fn pools(&self) -> Vec<PoolCounts> {
        let output = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U"])
            .arg(self.user())
            .args([
                "-d",
                "pgbouncer",
                "-AF",
                "\t",
                "-P",
                "footer=off",
                "-c",
                "SHOW POOLS",
            ])
            .output()
            .expect("psql for the pooler's admin console");
        assert!(
            output.status.success(),
            "SHOW POOLS: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8_lossy(&output.stdout);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
        let column = |name: &str| header.iter().position(|h| *h == name);
        let (database, waiting, servers) = (
            column("database").expect("SHOW POOLS has a database column"),
            [column("cl_waiting")],
            ["sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"].map(column),
        );
        let sum = |f: &[&str], columns: &[Option<usize>]| -> u32 {
            columns
                .iter()
                .flatten()
                .map(|&i| f.get(i).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0))
                .sum()
        };
        lines
            .map(|line| line.split('\t').collect::<Vec<_>>())
            .filter(|f| f.len() == header.len() && f[database] != "pgbouncer")
            .map(|f| PoolCounts {
                database: f[database].to_string(),
                waiting: sum(&f, &waiting),
                servers: sum(&f, &servers),
            })
            .collect()
    }

    /// What the pooler logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn user(&self) -> String {
        let users = std::fs::read_to_string(self.dir.join("users.txt")).unwrap_or_default();
        users.split('"').nth(1).unwrap_or("postgres").to_string()
    }

    fn wait_until_listening(&self) {
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "PgBouncer did not listen on 127.0.0.1:{} within 10 s:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PGBOUNCER") {
        return path.into();
    }
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/pgbouncer/bin/pgbouncer");
    assert!(
        built.exists(),
        "no PgBouncer at {}: `bash scripts/test.sh` builds it (scripts/lib.sh's ensure_pgbouncer), \
         or set PGBOUNCER to a PgBouncer 1.21 or later",
        built.display()
    );
    built
}
