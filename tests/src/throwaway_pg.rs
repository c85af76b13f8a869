//! A PostgreSQL cluster of the test's own, for the tests that must restart or kill a database
//! server: `initdb` in a temporary directory, a free port on 127.0.0.1, trust auth, removed when
//! dropped. The machine's own PostgreSQL is never restarted or reconfigured.
//!
//! The server binaries come from `PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`
//! (Debian's layout; `scripts/test.sh` installs the `postgresql` package where they are missing).
//! PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` user.

use std::path::PathBuf;
use std::process::Command;

/// A running throwaway cluster.
#[derive(Debug)]
pub struct ThrowawayCluster {
    bindir: PathBuf,
    dir: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

impl ThrowawayCluster {
    /// Initializes and starts a cluster; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster whose TCP connections need a password (`scram-sha-256`): the superuser
    /// `postgres` has `password`. For the tests of credentials that are rejected and rotated.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(Some(password))
    }

    fn start_with(password: Option<&str>) -> Self {
        let bindir = server_bindir();
        let dir = std::env::temp_dir().join(format!("pg-throwaway-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        if is_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir));
        }
        let port = free_port();
        let cluster = Self { bindir, dir, port };
        let data = cluster.data_dir();
        let mut initdb = cluster.server_command("initdb");
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-E", "UTF8", "--no-instructions"]);
        match password {
            None => {
                initdb.arg("--auth=trust");
            }
            Some(password) => {
                let file = cluster.dir.join("pwfile");
                std::fs::write(&file, password).expect("the password file");
                if is_root() {
                    run(Command::new("chown").arg("postgres:postgres").arg(&file));
                }
                initdb
                    .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
                    .arg(format!("--pwfile={}", file.display()));
            }
        }
        run(&mut initdb);
        cluster.start_server();
        cluster
    }

    fn start_server(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200",
            self.port,
            self.dir.display()
        );
        run(self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-l"])
            .arg(self.dir.join("server.log"))
            .args(["-o", &options, "start"]));
    }

    /// A streaming standby of this cluster on a port of its own, named `name`, which receives
    /// the WAL through `upstream` (a port on 127.0.0.1 that forwards to this cluster's: a
    /// latency proxy, so that a synchronous commit waits for the way there and back).
    pub fn standby(&self, upstream: u16, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("pg-standby-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("standby directory");
        if is_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir));
        }
        let standby = Self {
            bindir: self.bindir.clone(),
            dir,
            port: free_port(),
        };
        let conninfo =
            format!("host=127.0.0.1 port={upstream} user=postgres application_name={name}");
        run(standby
            .server_command("pg_basebackup")
            .args(["-d", &conninfo, "-X", "stream", "-R", "-c", "fast", "-D"])
            .arg(standby.data_dir()));
        standby.start_server();
        standby
    }

    /// Makes every commit wait until the standby `name` has flushed it
    /// (`synchronous_standby_names`, `synchronous_commit = on`), once the standby streams.
    pub fn require_synchronous(&self, name: &str) {
        self.psql(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{name}'"
        ));
        self.psql("SELECT pg_reload_conf()");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.psql("SELECT sync_state FROM pg_stat_replication") != "sync" {
            assert!(
                std::time::Instant::now() < deadline,
                "the standby {name} did not become synchronous"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Runs `sql` with psql; its output, unaligned and trimmed.
    pub fn psql(&self, sql: &str) -> String {
        let output = Command::new("psql")
            .args([
                &self.url(),
                "-X",
                "-Atq",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        assert!(
            output.status.success(),
            "psql -c {sql}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A shell command that restarts the server (fast shutdown: every connection is cut) and
    /// waits until it accepts connections again.
    pub fn restart_command(&self) -> String {
        let pg_ctl = self.bindir.join("pg_ctl");
        let inner = format!(
            "{} -D {} -m fast -w -l {} restart",
            pg_ctl.display(),
            self.data_dir().display(),
            self.dir.join("server.log").display()
        );
        if is_root() {
            format!("runuser -u postgres -- {inner}")
        } else {
            inner
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn server_command(&self, program: &str) -> Command {
        let path = self.bindir.join(program);
        if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }
}

impl Drop for ThrowawayCluster {
    fn drop(&mut self) {
        let _ = self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server_bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return dir.into();
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).expect(
        "no PostgreSQL server binaries (initdb) under /usr/lib/postgresql/*/bin: install the \
         `postgresql` package (scripts/test.sh does) or set PG_BINDIR",
    )
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A TCP port free on 127.0.0.1 just now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(crate) fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
