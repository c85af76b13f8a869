//! Issue 24: each path's round trips, counted on the wire by the latency proxy (at no added
//! latency): a count, not a timing, so a path that gains a round trip turns this red.
//!
//! | path | round trips |
//! |---|---|
//! | new job, per job | 3: claim and `BEGIN`, the work, the check and `COMMIT` |
//! | duplicate (first delivery) | 1: the claim, which opens no transaction |
//! | batch of 10 new jobs | 4: the lookup, then the three of one job |
//! | batch of 10 duplicates | 1: the lookup |
//!
//! The harness keeps its connections between jobs (lanes), so no pool round trip is hidden in
//! these counts: every round trip the connection makes is counted.

use consumer::AwardPoints;
use e2e::latency_proxy::LatencyProxy;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared_testkit::reference::award;
use shared_testkit::{batch, job, message, run_batch};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::net::SocketAddr;
use std::time::Duration;

/// A harness whose every connection goes through `proxy`.
async fn harness_through(
    proxy: &LatencyProxy,
    connect: &PgConnectOptions,
    commit: CommitMode,
) -> Harness<AwardPoints> {
    let through = connect.clone().host("127.0.0.1").port(proxy.addr().port());
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .connect_lazy_with(through);
    e2e::harness_in(pool, AwardPoints::new(e2e::consumer_name()), commit)
}

fn proxy_to(connect: &PgConnectOptions) -> LatencyProxy {
    let upstream: SocketAddr = format!("127.0.0.1:{}", connect.get_port())
        .parse()
        .expect("an address");
    LatencyProxy::start(upstream, Duration::ZERO)
}

/// The round trips `run` makes through `proxy`.
async fn counted<T>(proxy: &LatencyProxy, run: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = proxy.round_trips();
    let out = run.await;
    (out, proxy.round_trips() - before)
}

fn new_job() -> String {
    job(award(1)).1
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_per_job_path_costs_its_round_trips(_: PgPoolOptions, connect: PgConnectOptions) {
    let proxy = proxy_to(&connect);
    let harness = harness_through(&proxy, &connect, CommitMode::PerJob).await;
    // The first job connects and prepares the work's statement: not counted.
    assert_eq!(
        harness.process(&message(&new_job(), 1)).await,
        RecordOutcome::Processed
    );

    let body = new_job();
    let (outcome, trips) = counted(&proxy, harness.process(&message(&body, 1))).await;
    assert_eq!(outcome, RecordOutcome::Processed);
    assert_eq!(
        trips, 3,
        "a new job: claim + BEGIN, the work, the check + COMMIT"
    );

    let (outcome, trips) = counted(&proxy, harness.process(&message(&body, 1))).await;
    assert_eq!(outcome, RecordOutcome::Duplicate);
    assert_eq!(trips, 1, "a duplicate: the claim alone, no transaction");

    // What the lanes save: a statement on the pool costs its own round trip and the pool's
    // test of the connection given back (the first one connects and prepares: not counted).
    let pooled = || async {
        let done = sqlx::query("SELECT 1").execute(harness.pool()).await;
        // The connection is idle in the pool again once its ping has been answered.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while harness.pool().num_idle() == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        done
    };
    pooled().await.expect("SELECT 1");
    let (done, trips) = counted(&proxy, pooled()).await;
    done.expect("SELECT 1");
    assert_eq!(trips, 2, "a pooled statement: itself and the release ping");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn each_batch_mode_path_costs_its_round_trips(_: PgPoolOptions, connect: PgConnectOptions) {
    let proxy = proxy_to(&connect);
    let harness = harness_through(&proxy, &connect, CommitMode::Batch).await;
    let ten = || -> Vec<String> { (0..10).map(|_| new_job()).collect() };
    let processed = |outcomes: &[RecordOutcome], expected: &RecordOutcome| {
        assert!(outcomes.iter().all(|o| o == expected), "{outcomes:?}");
    };
    let run = |msgs: Vec<IncomingMessage>| {
        let harness = &harness;
        async move { run_batch(harness, &msgs).await }
    };
    processed(&run(batch(&ten())).await, &RecordOutcome::Processed);

    let bodies = ten();
    let (outcomes, trips) = counted(&proxy, run(batch(&bodies))).await;
    processed(&outcomes, &RecordOutcome::Processed);
    assert_eq!(
        trips, 4,
        "ten new jobs: the lookup, claim + BEGIN, the work, the check + COMMIT"
    );

    let (outcomes, trips) = counted(&proxy, run(batch(&bodies))).await;
    processed(&outcomes, &RecordOutcome::Duplicate);
    assert_eq!(trips, 1, "ten duplicates: the lookup alone");
}
