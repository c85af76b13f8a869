//! Through a transaction pooler, as deployed behind RDS Proxy: a PgBouncer of the test's own in
//! transaction mode, where each transaction of a client may run on a different server
//! connection and nothing of a session survives its transaction. The whole guarantee suite also
//! runs through one (`scripts/test.sh`'s pooler pass); these are what only a pooler can show:
//! many clients multiplexed onto few server connections, and session state that would leak.

use consumer::AwardPoints;
use e2e::pooler::Pooler;
use shared::harness::{CommitMode, RecordOutcome};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Barrier;

const CLIENTS: usize = 64;
const SERVER_CONNECTIONS: u32 = 8;
const JOBS: usize = 320;

fn upstream() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL")
}

/// 64 clients over 8 server connections, per job: every job's two copies, racing on different
/// clients, apply its effect once; the pooler held at most 8 server connections, and clients
/// waited in it for one (so it multiplexed).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn sixty_four_clients_over_eight_server_connections_apply_each_job_once(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    many_clients_over_few_connections(connect, CommitMode::PerJob).await;
}

/// The same in batch mode: each copy in a batch transaction with a new job of its own.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn sixty_four_clients_over_eight_server_connections_apply_each_job_once_in_batch_mode(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    many_clients_over_few_connections(connect, CommitMode::Batch).await;
}

async fn many_clients_over_few_connections(connect: PgConnectOptions, mode: CommitMode) {
    let database = connect
        .get_database()
        .expect("the test's database")
        .to_string();
    let pooler = Arc::new(Pooler::start(&upstream(), SERVER_CONNECTIONS));
    let through = own_pool(pooler.connect_options(&connect), CLIENTS as u32).await;
    let direct = own_pool(connect, 2).await;
    let harness = Arc::new(harness_in(
        &through,
        AwardPoints::new(reference_name()),
        mode,
    ));

    let jobs: Vec<_> = (0..JOBS).map(|i| job(award(1 + i as i64 % 7))).collect();
    let deliveries: VecDeque<_> = jobs
        .iter()
        .flat_map(|(_, body)| [message(body, 1), message(body, 2)])
        .collect();
    let deliveries = Arc::new(Mutex::new(deliveries));

    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = tokio::task::spawn_blocking({
        let (pooler, sampling, database) = (pooler.clone(), sampling.clone(), database.clone());
        move || {
            let (mut waiting, mut servers) = (0, 0);
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                for pool in pooler
                    .pools()
                    .into_iter()
                    .filter(|p| p.database == database)
                {
                    waiting = waiting.max(pool.waiting);
                    servers = servers.max(pool.servers);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (waiting, servers)
        }
    });

    let start = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (harness, start, deliveries) = (harness.clone(), start.clone(), deliveries.clone());
            tokio::spawn(async move {
                start.wait().await;
                let mut outcomes = Vec::new();
                loop {
                    let next = deliveries.lock().unwrap().pop_front();
                    let Some(msg) = next else { break outcomes };
                    outcomes.push(deliver(&harness, &msg).await);
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.extend(client.await.unwrap());
    }
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let (most_waiting, most_servers) = sampler.await.unwrap();

    let count = |o: RecordOutcome| outcomes.iter().filter(|x| **x == o).count();
    assert_eq!(
        (
            count(RecordOutcome::Processed),
            count(RecordOutcome::Duplicate)
        ),
        (JOBS, JOBS),
        "one copy of each job processed, the other a duplicate"
    );
    let ids: Vec<uuid::Uuid> = jobs.iter().map(|(id, _)| id.0).collect();
    let (awards, doubled): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) - count(DISTINCT job_id)
         FROM reference.point_awards WHERE job_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&direct)
    .await
    .unwrap();
    assert_eq!(
        (awards, doubled),
        (JOBS as i64, 0),
        "each job's effect once"
    );
    assert!(
        most_servers <= SERVER_CONNECTIONS,
        "the pooler opened {most_servers} server connections for a pool of {SERVER_CONNECTIONS}"
    );
    assert!(
        most_waiting > 0,
        "no client ever waited for a server connection: nothing was multiplexed"
    );
    assert_no_session_state_left(&direct, &database).await;
}

/// Two sweeps through a transaction pooler: the second steps aside while the first runs, the
/// next one after it runs, and no lock is left behind on any server connection. (A session
/// advisory lock failed here: taken on one server connection and "released" on another, it let
/// a second sweep run beside the first and stayed held.)
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn sweeps_take_turns_through_a_transaction_pooler_and_leave_no_lock(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let database = connect
        .get_database()
        .expect("the test's database")
        .to_string();
    let pooler = Pooler::start(&upstream(), 2);
    let through = own_pool(pooler.connect_options(&connect), 4).await;
    let direct = own_pool(connect, 2).await;
    // Another client's statements, between the sweeps', move them across server connections.
    let noise = tokio::spawn({
        let pool = through.clone();
        async move {
            loop {
                sqlx::query("SELECT pg_sleep(0.002)")
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        }
    });
    // Which server connection each statement lands on is chance: five rounds, so that a lock
    // held across statements cannot come through them all by luck (the advisory lock came
    // through one round in two).
    for _ in 0..5 {
        shared_testkit::sweeps::assert_sweeps_take_turns(&through, &direct).await;
        assert_no_session_state_left(&direct, &database).await;
    }
    noise.abort();
    let _ = noise.await;
}

/// No server connection of `database` holds an advisory lock or sits in a transaction: what a
/// client left of its session would be handed to the next client of that connection.
async fn assert_no_session_state_left(direct: &PgPool, database: &str) {
    let (locks, in_transaction): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                 WHERE l.locktype = 'advisory' AND d.datname = $1),
                (SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND pid <> pg_backend_pid()
                   AND state LIKE 'idle in transaction%')",
    )
    .bind(database)
    .fetch_one(direct)
    .await
    .unwrap();
    assert_eq!(
        (locks, in_transaction),
        (0, 0),
        "advisory locks held, server connections idle in a transaction"
    );
}
