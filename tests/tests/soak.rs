//! The chaos soak's short form, in the test command: 2,000 jobs through the local SQS API and
//! three consumer sandboxes, with SIGKILLs every ~1.5 s, PostgreSQL restarted halfway
//! (`SOAK_PG_RESTART_CMD`, else every connection terminated), and 3% of deletes lost. The long
//! form (10,000 jobs) is `bash scripts/soak.sh`. See `e2e::soak` for the workload and the checks.

use e2e::soak::{Restart, SoakSpec, run};
use e2e::stack::StackSpec;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn chaos_soak_no_job_doubled_and_none_lost(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let admin = pool_opts.connect_with(connect.clone()).await.unwrap();
    let stack = StackSpec::time_scaled(
        e2e::test_binaries!(),
        &e2e::test_database_url(&connect),
        &format!("soak-{}", &Uuid::new_v4().simple().to_string()[..12]),
    );
    let spec = SoakSpec {
        jobs: 2_000,
        seed: 20261130,
        consumers: 3,
        kill_every: Duration::from_millis(1500),
        delete_loss: 0.03,
        restart: Restart::from_env(),
        timeout: Duration::from_secs(300),
    };
    let report = run(&spec, stack, &admin).await;
    println!("{report}");
    assert!(report.holds(), "the promise broke:\n{report}");
    assert!(report.kills > 0, "the soak killed nothing:\n{report}");
    assert!(
        report.duplicates_sent * 5 >= report.published,
        "at least 20% duplicates"
    );
}
