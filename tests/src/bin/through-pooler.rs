//! `through-pooler [--pool-size N] -- COMMAND...`: runs COMMAND with `DATABASE_URL` pointed at a
//! PgBouncer of its own in transaction mode in front of `DATABASE_URL`'s server (the local analog
//! of RDS Proxy), then stops the pooler and drops the `#[sqlx::test]` databases the command left
//! (through a pooler their drop can fail while the pooler still holds a server connection to
//! them: sqlx only prints so; they are dropped here, directly, once it has let go). Exits with
//! COMMAND's status.

use clap::Parser;
use e2e::pooler::Pooler;
use sqlx::Connection;
use std::process::{Command, ExitCode};

#[derive(Parser)]
struct Args {
    /// Server connections per database and user.
    #[arg(long, default_value_t = 20)]
    pool_size: u32,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let Ok(upstream) = std::env::var("DATABASE_URL") else {
        eprintln!("through-pooler: DATABASE_URL is not set");
        return ExitCode::FAILURE;
    };
    let started = chrono::Utc::now();
    let pooler = Pooler::start(&upstream, args.pool_size);
    let through = pooler.url_for(&upstream);
    eprintln!(
        "through-pooler: PgBouncer in transaction mode on 127.0.0.1:{} ({} server connections a database)",
        pooler.port, args.pool_size
    );
    let status = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("DATABASE_URL", &through)
        .status();
    drop(pooler);
    if let Err(e) = drop_left_test_databases(&upstream, started).await {
        eprintln!("through-pooler: could not drop the test databases left behind: {e}");
    }
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8),
        Err(e) => {
            eprintln!("through-pooler: could not run {:?}: {e}", args.command);
            ExitCode::FAILURE
        }
    }
}

/// Drops the test databases `#[sqlx::test]` registered since `since` and could not drop.
async fn drop_left_test_databases(
    upstream: &str,
    since: chrono::DateTime<chrono::Utc>,
) -> sqlx::Result<()> {
    let mut conn = sqlx::PgConnection::connect(upstream).await?;
    let registry: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_test.databases')::text")
            .fetch_one(&mut conn)
            .await?;
    if registry.is_none() {
        return Ok(());
    }
    let names: Vec<String> =
        sqlx::query_scalar("SELECT db_name FROM _sqlx_test.databases WHERE created_at >= $1")
            .bind(since)
            .fetch_all(&mut conn)
            .await?;
    for name in &names {
        let quoted = name.replace('"', "\"\"");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{quoted}\" WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        sqlx::query("DELETE FROM _sqlx_test.databases WHERE db_name = $1")
            .bind(name)
            .execute(&mut conn)
            .await?;
    }
    eprintln!(
        "through-pooler: dropped {} test databases left behind",
        names.len()
    );
    Ok(())
}
