//! `demo [--check]`: the README's main job. Migrates `DATABASE_URL`, runs the sample workload
//! through the local stack, and prints a summary. With `--check` it exits 1 when any outcome
//! differs from the expected one. The job queue is `DEMO_QUEUE_NAME` (default
//! `points-award-jobs`).

use shared::config::{DatabaseConfig, DatabaseSource, Env};

#[tokio::main]
async fn main() {
    let check = std::env::args().any(|a| a == "--check");
    let db = DatabaseConfig::from_env(&Env::process()).unwrap_or_else(|e| fail(&e.to_string()));
    let DatabaseSource::Url(url) = db.source else {
        fail("the demo runs on DATABASE_URL, a local database");
    };
    e2e::demo::migrate(&url).await.unwrap_or_else(|e| fail(&e));
    let queue = std::env::var("DEMO_QUEUE_NAME").unwrap_or_else(|_| e2e::demo::QUEUE.into());
    let logs = std::env::temp_dir().join("job-harness-demo");
    std::fs::create_dir_all(&logs)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", logs.display())));
    let counts = e2e::demo::run(&url, &queue, logs).await;

    let expected = e2e::demo::expected();
    println!("\n{:<34} {:>6} {:>9}", "outcome", "count", "expected");
    let names: std::collections::BTreeSet<&str> = counts
        .keys()
        .chain(expected.keys())
        .map(String::as_str)
        .collect();
    let mut mismatches = 0;
    for name in names {
        let (got, want) = (
            counts.get(name).copied().unwrap_or(0),
            expected.get(name).copied().unwrap_or(0),
        );
        mismatches += usize::from(got != want);
        println!(
            "{name:<34} {got:>6} {want:>9}{}",
            if got == want { "" } else { "  ← differs" }
        );
    }
    println!("\nList the dead letters waiting for review:");
    println!(
        "  psql \"{}\" -c \"SELECT created_at, error_kind, attempts, job_id, left(last_error, 60) FROM core.dead_letters WHERE status = 'pending_review' ORDER BY created_at DESC LIMIT 20\"",
        url
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
