//! `demo [--check]`: migrates `DATABASE_URL`, runs the sample workload through the harness and
//! prints a summary. With `--check` it exits 1 when any count differs from the expected one.

use shared::config::{DatabaseConfig, Env};
use shared::ids::ConsumerName;

#[tokio::main]
async fn main() {
    let check = std::env::args().any(|a| a == "--check");
    let db = DatabaseConfig::from_env(&Env::process()).unwrap_or_else(|e| fail(&e.to_string()));
    let pool = sqlx::PgPool::connect(&db.url)
        .await
        .unwrap_or_else(|e| fail(&format!("cannot connect to DATABASE_URL: {e}")));
    shared::MIGRATOR
        .run(&pool)
        .await
        .unwrap_or_else(|e| fail(&format!("migrations failed: {e}")));
    let summary = e2e::demo::run(pool, ConsumerName::new("award-points").expect("name")).await;

    let expected = e2e::demo::expected();
    println!("\n{:<24} {:>6} {:>9}", "outcome", "count", "expected");
    let mut mismatches = 0;
    for (name, count) in &summary {
        let want = expected.get(name).copied().unwrap_or(0);
        let mark = if *count == want { "" } else { "  ← differs" };
        mismatches += usize::from(*count != want);
        println!("{name:<24} {count:>6} {want:>9}{mark}");
    }
    println!("\nList the dead letters of this run and before:");
    println!(
        "  psql \"$DATABASE_URL\" -c \"SELECT created_at, error_kind, attempts, job_id, last_error FROM core.dead_letters ORDER BY created_at DESC LIMIT 10\""
    );
    if check && mismatches > 0 {
        fail(&format!(
            "{mismatches} outcome(s) differ from the expected ones"
        ));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("demo: {msg}");
    std::process::exit(1)
}
