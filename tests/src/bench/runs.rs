//! The sides of the harness benchmarks (`bench-harness` on loopback, `bench-latency` through
//! the latency proxy): pgbench running a script, bare sqlx, the harness per job and in batch
//! mode, each for a given time with a given number of workers, as jobs per second.

use consumer::AwardPoints;
use rand::RngExt;
use serde_json::json;
use shared::harness::{IncomingMessage, RecordOutcome};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Already processed jobs, ids 1..DUPS, for the duplicate path (`bench/reset_for_harness.sql`
/// seeds them).
pub const DUPS: u64 = 100_000;

/// Jobs in one batch of batch mode.
pub const BATCH: usize = 10;
/// The switches of `bench/batch.sql`, one a step of batch mode's statements.
pub const BATCH_STEPS: [&str; 3] = ["lookup", "claim", "finish"];
/// Its other switches, off unless given: a poison record's intake row beside the batch.
const BATCH_EXTRAS: [&str; 2] = ["intake", "intake_after"];

/// One side's run: how many workers, for how long.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Concurrent workers (pgbench's clients), each on its own connection.
    pub workers: usize,
    /// How long it runs.
    pub run: Duration,
    /// Messages prepared for a harness run: more than `run` can take.
    pub messages: usize,
}

/// What one side did.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Jobs per second.
    pub per_second: f64,
    /// Jobs done.
    pub jobs: u64,
}

/// `pgbench` running `file` with `load.workers` connections: its transactions.
pub fn pgbench(url: &str, file: &str, load: Load) -> Rate {
    pgbench_with(url, file, &[], load)
}

/// [`pgbench`] with `switches` set to 1 (`-D name=1`; every other switch of the script is 0).
pub fn pgbench_with(url: &str, file: &str, switches: &[&str], load: Load) -> Rate {
    pgbench_in("prepared", url, file, switches, load)
}

/// [`pgbench`] with the extended protocol's unnamed statements (`-M extended`: the same round
/// trips as `-M prepared` once prepared). For more clients than a pooler has server
/// connections: pgbench prepares with a blocking call, so one client of a pgbench thread
/// waiting in the pooler for a server connection stalls the clients of that thread holding
/// them, until the pooler's `query_wait_timeout`.
pub fn pgbench_extended(url: &str, file: &str, load: Load) -> Rate {
    pgbench_in("extended", url, file, &[], load)
}

fn pgbench_in(mode: &str, url: &str, file: &str, switches: &[&str], load: Load) -> Rate {
    let clients = load.workers;
    let mut defines = vec![format!("dups={DUPS}")];
    defines.extend(
        BATCH_STEPS
            .iter()
            .chain(&BATCH_EXTRAS)
            .map(|step| format!("{step}={}", u8::from(switches.contains(step)))),
    );
    // A switch written `name=value` is a variable of the script's own.
    defines.extend(
        switches
            .iter()
            .filter(|s| s.contains('='))
            .map(|s| s.to_string()),
    );
    let out = Command::new("pgbench")
        .args(["-n", "-M", mode])
        .args(defines.iter().flat_map(|d| ["-D", d.as_str()]))
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args([
            "-T",
            &load.run.as_secs().max(1).to_string(),
            "-f",
            &super::script(file),
            url,
        ])
        .output()
        .expect("pgbench runs (bash scripts/bench.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figure = |prefix: &str| -> f64 {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.split('/').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in pgbench's output: {stdout}"))
    };
    Rate {
        per_second: figure("tps = "),
        jobs: figure("number of transactions actually processed: ") as u64,
    }
}

impl Rate {
    /// This rate with `n` jobs to each of its transactions (pgbench running batch mode's SQL).
    pub fn times(self, n: usize) -> Self {
        Self {
            per_second: self.per_second * n as f64,
            jobs: self.jobs * n as u64,
        }
    }
}

pub fn message(job_id: uuid::Uuid) -> IncomingMessage {
    IncomingMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        queue: "bench".into(),
        body: json!({"job_id": job_id, "tenant_id": uuid::Uuid::from_u128(1),
            "correlation_id": "bench", "payload": {"account_id": "a", "points": 1}})
        .to_string(),
        receive_count: 1,
        replay_of: None,
        message_group: None,
        trace: Default::default(),
    }
}

/// `n` messages, ready as from SQS (building them is the producer's cost, not ours): new jobs
/// with random ids, or jobs drawn from the [`DUPS`] already processed.
pub fn messages(n: usize, duplicates: bool) -> Vec<IncomingMessage> {
    let mut rng: rand::rngs::StdRng = rand::make_rng();
    (0..n)
        .map(|_| {
            let n = if duplicates {
                rng.random_range(1..=DUPS)
            } else {
                rng.random::<u64>()
            };
            message(uuid::Uuid::from_u128(n.into()))
        })
        .collect()
}

/// What the harness must answer for each of [`messages`]`(_, duplicates)`.
pub fn expected(duplicates: bool) -> RecordOutcome {
    if duplicates {
        RecordOutcome::Duplicate
    } else {
        RecordOutcome::Processed
    }
}

/// Jobs per second of the harness in batch mode: `workers` concurrent workers, each handing it
/// SQS batches of [`BATCH`] messages (new jobs, or already processed ones).
pub async fn harness_batches(url: &str, load: Load, duplicates: bool) -> Rate {
    let workers = load.workers;
    let pool = super::warm_pool(url, workers).await;
    let harness = Arc::new(crate::harness_in(
        pool.clone(),
        AwardPoints::new(crate::consumer_name()),
        shared::harness::CommitMode::Batch,
    ));
    // New jobs need fresh ids for the whole run; duplicates can go round a smaller set.
    let count = if duplicates {
        10_000
    } else {
        2 * load.messages / BATCH
    };
    let batches: Arc<Vec<Vec<IncomingMessage>>> = Arc::new(
        messages(count * BATCH, duplicates)
            .chunks(BATCH)
            .map(<[_]>::to_vec)
            .collect(),
    );
    let expected = expected(duplicates);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let run = load.run;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (harness, next, done, batches) =
                (harness.clone(), next.clone(), done.clone(), batches.clone());
            let expected = expected.clone();
            tokio::spawn(async move {
                while started.elapsed() < run {
                    let mut i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if duplicates {
                        i %= batches.len();
                    }
                    let batch = batches.get(i).expect("enough batches for the run");
                    let outcomes = harness.process_batch(batch, &|| true, 1).await;
                    assert!(
                        outcomes.iter().all(|o| o.as_ref() == Some(&expected)),
                        "{outcomes:?}"
                    );
                    done.fetch_add(BATCH as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let rate = jobs_per_second(tasks, &done, started, pool).await;
    let fell_back = harness
        .metrics()
        .get(shared::metrics::Metric::BatchFellBack);
    assert_eq!(fell_back, 0, "every batch committed whole");
    rate
}

/// Jobs per second of the harness with `workers` concurrent workers, each on its own connection.
pub async fn harness(url: &str, load: Load, duplicates: bool) -> Rate {
    let workers = load.workers;
    // The pool the functions build, sized like pgbench's clients.
    let pool = super::warm_pool(url, workers).await;
    let harness = Arc::new(crate::harness(
        pool.clone(),
        AwardPoints::new(crate::consumer_name()),
    ));
    let messages: Arc<Vec<IncomingMessage>> = Arc::new(messages(load.messages, duplicates));
    let expected = expected(duplicates);
    let done = Arc::new(AtomicU64::new(0));
    let run = load.run;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (harness, done, messages) = (harness.clone(), done.clone(), messages.clone());
            let expected = expected.clone();
            tokio::spawn(async move {
                while started.elapsed() < run {
                    let mut next = done.fetch_add(1, Ordering::Relaxed) as usize;
                    // Duplicates can go round; new jobs need a fresh id each.
                    if duplicates {
                        next %= messages.len();
                    }
                    let msg = messages.get(next).expect("enough messages for the run");
                    assert_eq!(harness.process(msg).await, expected);
                }
            })
        })
        .collect();
    jobs_per_second(tasks, &done, started, pool).await
}

/// Jobs per second of bare sqlx sending pgbench's statements (no harness): what this driver
/// and runtime can do on this machine, so the table separates the harness's cost from theirs.
pub async fn bare_sqlx(url: &str, load: Load, duplicates: bool) -> Rate {
    let workers = load.workers;
    let pool = super::warm_pool(url, workers).await;
    let done = Arc::new(AtomicU64::new(0));
    let run = load.run;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut rng: rand::rngs::StdRng = rand::make_rng();
                let tenant = uuid::Uuid::from_u128(1);
                while started.elapsed() < run {
                    let job = if duplicates {
                        uuid::Uuid::from_u128(u128::from(rng.random_range(1..=DUPS)))
                    } else {
                        uuid::Uuid::from_u128(rng.random::<u64>().into())
                    };
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query(
                        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
                         VALUES ($1, 'award-points', $2, now(), now() + interval '7 days')
                         ON CONFLICT (job_id, consumer) DO NOTHING",
                    )
                    .bind(job)
                    .bind(tenant)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                    if duplicates {
                        tx.rollback().await.unwrap();
                    } else {
                        sqlx::query(
                            "INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
                             VALUES ($1, $2, 'a', 1, now())",
                        )
                        .bind(job)
                        .bind(tenant)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    jobs_per_second(tasks, &done, started, pool).await
}

/// Waits for the workers; the jobs they did per second of the run.
async fn jobs_per_second(
    workers: Vec<tokio::task::JoinHandle<()>>,
    done: &AtomicU64,
    started: Instant,
    pool: sqlx::PgPool,
) -> Rate {
    for worker in workers {
        worker.await.unwrap();
    }
    let jobs = done.load(Ordering::Relaxed);
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    pool.close().await;
    Rate {
        per_second: rate,
        jobs,
    }
}
