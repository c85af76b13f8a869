//! The consumer author's dev loop as `docs/consumers.md` gives it (issue 26): `bash
//! scripts/dev.sh award-points` in one terminal, `bash scripts/dev.sh send award-points all` in
//! another, on a database of the test's own. The scripts are run as written: they start what is
//! missing, migrate, create the queue, run the consumer under `cargo lambda watch`, and send
//! through the real queue.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `bash scripts/dev.sh <args>` from the repository, on `database` and `port`.
fn dev_sh(args: &[&str], database: &str, port: u16) -> Command {
    let mut command = Command::new("bash");
    command
        .arg("scripts/dev.sh")
        .args(args)
        .current_dir(repository())
        .env("DEV_DATABASE", database)
        .env("DEV_PORT", port.to_string());
    command
}

/// The watch, in a process group of its own, killed whole when dropped.
struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: signals the process group this test started (its pid is the group's id).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_guides_dev_loop_runs_as_written_fence_effect_and_letters() {
    let database = format!(
        "dev_loop_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let port = e2e::throwaway_pg::free_port();
    let log = std::env::temp_dir().join(format!("{database}.log"));
    let watch = Watch(
        dev_sh(&["award-points"], &database, port)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::File::options().append(true).open(&log).unwrap(),
            ))
            .process_group(0)
            .spawn()
            .expect("bash scripts/dev.sh award-points"),
    );
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!text.contains("FAILED"), "dev.sh stopped: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "cargo lambda watch did not listen on {port}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let sent = dev_sh(&["send", "award-points", "all"], &database, port)
        .output()
        .expect("bash scripts/dev.sh send");
    let out = String::from_utf8_lossy(&sent.stdout);
    let err = String::from_utf8_lossy(&sent.stderr);
    let watch_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        sent.status.success(),
        "send failed: {out}\n{err}\nwatch: {watch_log}"
    );
    for said in [
        "Valid job",
        "Duplicate job",
        "Poison job",
        "Failing job",
        "  fence:  processed at",
        "poison, 1 attempt(s): payload does not match",
        "poison, 1 attempt(s): points must be positive",
        "reference.point_awards: 0 → 2 rows (+2)",
    ] {
        assert!(out.contains(said), "the report says {said:?}: {out}");
    }
    drop(watch);

    // What the report said is what the database holds.
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let url = format!("{}/{database}", server.rsplit_once('/').unwrap().0);
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM core.processed_jobs WHERE consumer = 'award-points'").await,
        2,
        "the valid job and the duplicated one, each fenced once"
    );
    assert_eq!(
        count("SELECT count(*) FROM reference.point_awards").await,
        2
    );
    assert_eq!(
        count("SELECT count(*) FROM core.dead_letters WHERE error_kind = 'poison'").await,
        2
    );
    pool.close().await;
    let admin = sqlx::PgPool::connect(&server).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let _ = std::fs::remove_file(&log);
}
