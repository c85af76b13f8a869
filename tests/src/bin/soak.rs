//! `soak [jobs] [seed] [per-job|batch|fifo-per-job|fifo-batch]`: the chaos soak's long form
//! (default 10,000 jobs, per-job commits) on a throwaway PostgreSQL cluster of its own
//! (restarted halfway, removed at the end) and the local SQS API; `fifo-…` on a FIFO queue, the
//! jobs in 50 message groups, whose order the checker verifies too. The functions get the settle
//! due as deployed unless `LETTER_SETTLE_DUE_MS` is set. Prints the counts and exits non-zero if
//! any invariant broke.

use e2e::soak::{Restart, SoakSpec, run};
use e2e::stack::{Binaries, StackSpec};
use e2e::throwaway_pg::ThrowawayCluster;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let jobs = args
        .next()
        .map_or(10_000, |a| a.parse().expect("jobs: a number"));
    let seed = args
        .next()
        .map_or(1, |a| a.parse().expect("seed: a number"));
    let mode_arg = args.next().unwrap_or_else(|| "per-job".into());
    let fifo = mode_arg.starts_with("fifo-");
    let mode = shared::harness::CommitMode::parse(mode_arg.trim_start_matches("fifo-"))
        .expect("mode: per-job, batch, fifo-per-job or fifo-batch");
    let cluster = ThrowawayCluster::start();
    let url = cluster.url();
    let admin = sqlx::PgPool::connect(&url).await.expect("connect");
    consumer::MIGRATOR_WITH_CORE
        .run(&admin)
        .await
        .expect("migrate");
    // The scheduled function settles what writers with a settle due leave: without it the
    // checker would count their records lost.
    let binaries = Binaries::beside_current_exe();
    if !binaries.scheduled.exists() {
        eprintln!(
            "soak: {} is missing: cargo build --profile perf -p e2e --bin local-scheduled",
            binaries.scheduled.display()
        );
        std::process::exit(1);
    }
    let mut stack = StackSpec::time_scaled(
        binaries,
        &url,
        &format!(
            "soak-{}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12],
            if fifo { ".fifo" } else { "" }
        ),
    );
    stack
        .consumer_env
        .push(("COMMIT_MODE".into(), mode.as_str().into()));
    // The settle due as deployed (templates/consumer.yaml's LetterSettleDueMs), unless this run's
    // environment sets LETTER_SETTLE_DUE_MS (0: every record's letter before its ack).
    let due = std::env::var("LETTER_SETTLE_DUE_MS")
        .unwrap_or_else(|_| shared::dead_letter::SETTLE_DUE.as_millis().to_string());
    stack
        .function_env
        .push(("LETTER_SETTLE_DUE_MS".into(), due.clone()));
    stack.log_dir = Some(std::env::temp_dir().join("job-harness-soak"));
    std::fs::create_dir_all(stack.log_dir.as_ref().unwrap()).expect("log dir");
    let spec = SoakSpec {
        jobs,
        seed,
        consumers: 4,
        kill_every: Duration::from_secs(2),
        delete_loss: 0.03,
        restart: Restart::Command(cluster.restart_command()),
        timeout: Duration::from_secs(1800),
        fifo_groups: fifo.then_some(50),
    };
    println!(
        "soak ({} commits{}, settle due {due} ms): {jobs} jobs, seed {seed}, {} consumer sandboxes, a SIGKILL every ~{:?}, {:.0}% of deletes lost, PostgreSQL: {:?}",
        mode.as_str(),
        if fifo { ", FIFO queue, 50 groups" } else { "" },
        spec.consumers,
        spec.kill_every,
        spec.delete_loss * 100.0,
        spec.restart
    );
    let report = run(&spec, stack, &admin).await;
    println!("{report}");
    if !report.holds() {
        eprintln!("FAILED: the promise broke");
        drop(cluster);
        std::process::exit(1);
    }
}
