//! The chaos soak's short form, in the test command: 1,200 jobs through the local SQS API and
//! three consumer sandboxes, with SIGKILLs every ~1.5 s, PostgreSQL restarted halfway, and 3% of
//! deletes lost. The PostgreSQL it restarts is a throwaway cluster this test starts itself
//! (`initdb` in a temporary directory, a free port) and removes afterwards: never the machine's.
//! The long form (10,000 jobs) is `bash scripts/soak.sh`. See `e2e::soak` for the workload and
//! the checks. It runs twice: one transaction per job, and one per batch (`COMMIT_MODE=batch`,
//! with the settle due as deployed), and batch mode again on a FIFO queue.

use e2e::soak::{Restart, SoakSpec, run};
use e2e::stack::StackSpec;
use e2e::throwaway_pg::ThrowawayCluster;
use shared::harness::CommitMode;
use std::time::Duration;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn chaos_soak_no_job_doubled_and_none_lost() {
    soak(CommitMode::PerJob, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_soak_no_job_doubled_and_none_lost_in_batch_mode() {
    soak(CommitMode::Batch, None).await;
}

/// Issue 25: the same chaos on a FIFO queue, 600 jobs in 20 message groups, batch mode (its
/// commit groups and their group-by-group fallback); the checker also finds every group's
/// effects committed in the order they were sent. (Per-job mode on a FIFO queue: `bash
/// scripts/soak.sh 10000 1 fifo-per-job`.)
#[tokio::test(flavor = "multi_thread")]
async fn chaos_soak_on_a_fifo_queue_keeps_each_groups_order() {
    soak(CommitMode::Batch, Some(20)).await;
}

async fn soak(mode: CommitMode, fifo_groups: Option<usize>) {
    let cluster = ThrowawayCluster::start();
    let admin = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
    consumer::MIGRATOR_WITH_CORE.run(&admin).await.unwrap();
    let mut stack = StackSpec::time_scaled(
        e2e::test_binaries!(),
        &cluster.url(),
        &format!(
            "soak-{}{}",
            &Uuid::new_v4().simple().to_string()[..12],
            if fifo_groups.is_some() { ".fifo" } else { "" }
        ),
    );
    stack
        .consumer_env
        .push(("COMMIT_MODE".into(), mode.as_str().into()));
    // Batch mode (and FIFO) with the settle due as deployed (templates/consumer.yaml's
    // LetterSettleDueMs), for the consumers and the ingester: a storm's letters wait in the
    // intake for a round, and the soak's operations invocations settle its tail. Per-job mode
    // keeps the library's default (0: every record's letter before its ack).
    if mode == CommitMode::Batch {
        let due = shared::dead_letter::SETTLE_DUE.as_millis().to_string();
        stack
            .function_env
            .push(("LETTER_SETTLE_DUE_MS".into(), due));
    }
    let spec = SoakSpec {
        // Sized for the test command's time (the suite's budget is 30 minutes); the long form
        // (`scripts/soak.sh`) is the volume.
        jobs: if fifo_groups.is_some() { 600 } else { 1_200 },
        seed: 20261130,
        consumers: 3,
        kill_every: Duration::from_millis(1500),
        delete_loss: 0.03,
        restart: Restart::Command(cluster.restart_command()),
        // The budget to drain: 145–275 s on this shared machine; a slower run is not a broken
        // promise, a job still missing at the end is.
        timeout: Duration::from_secs(480),
        fifo_groups,
    };
    let report = run(&spec, stack, &admin).await;
    println!(
        "{} mode{}: {report}",
        mode.as_str(),
        if fifo_groups.is_some() { ", FIFO" } else { "" }
    );
    assert!(report.holds(), "the promise broke:\n{report}");
    assert!(report.kills > 0, "the soak killed nothing:\n{report}");
    assert!(
        report.restart.starts_with("restarted"),
        "{}",
        report.restart
    );
    assert!(
        report.duplicates_sent * 5 >= report.jobs,
        "at least a fifth of the jobs sent twice"
    );
    // The mode really is the one soaked: batch mode commits batches whole, per-job mode none.
    match mode {
        CommitMode::Batch => assert!(report.batches_committed > 0, "{report}"),
        CommitMode::PerJob => assert_eq!(report.batches_committed, 0, "{report}"),
    }
}
