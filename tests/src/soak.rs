//! The chaos soak: thousands of jobs through the local SQS API and the real consumer binaries
//! while everything goes wrong at once, then an invariant checker over the database.
//!
//! The workload (seeded): 2% poison (half not JSON), 1% permanent failures, 10% transient
//! failures that clear on a later attempt, 0.5% that never clear, and a quarter of the jobs sent
//! twice in a row, so copies often share a batch and run concurrently. The faults: consumer
//! processes killed with SIGKILL at random moments (mid-batch included), PostgreSQL restarted
//! (or, where this process may not restart it, every connection killed at once) halfway through,
//! and a share of the event source's `DeleteMessageBatch` calls lost.
//!
//! The promise checked afterwards: every job has at most one effect; every job without an effect
//! has a dead letter; no fence without its effect and no effect without its fence; no letter
//! pending review for a job whose effect committed (a letter is a true record: a normal job
//! with an effect may only have letters that its commit closed); poison letters say one
//! attempt; every published message is accounted for.

use crate::event_source::{EventSource, depth};
use crate::lambda_host::LambdaHost;
use crate::stack::{Stack, StackSpec};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// How PostgreSQL is restarted halfway through.
#[derive(Debug, Clone)]
pub enum Restart {
    /// A shell command that restarts the server, for example
    /// [`crate::throwaway_pg::ThrowawayCluster::restart_command`]; then wait until it answers.
    Command(String),
    /// Terminate every connection to the database at once: what a restart or a failover does
    /// to the clients, where the server is not the soak's own.
    TerminateConnections,
}

/// How often the soak invokes the scheduled function's bulk operations round (every minute on
/// AWS, `OperationsSchedule`).
const OPERATIONS_EVERY: Duration = Duration::from_secs(5);

/// The soak's size and faults.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    /// Distinct jobs (messages published are more: duplicates).
    pub jobs: usize,
    /// The workload's seed.
    pub seed: u64,
    /// Consumer sandboxes polling at once.
    pub consumers: usize,
    /// Mean time between SIGKILLs of a consumer process.
    pub kill_every: Duration,
    /// Share of `DeleteMessageBatch` calls lost.
    pub delete_loss: f64,
    /// How PostgreSQL is restarted.
    pub restart: Restart,
    /// Give up (and report what is unaccounted) after this long.
    pub timeout: Duration,
    /// On a FIFO queue (the stack's queue name ends in `.fifo`): the jobs spread over this many
    /// message groups, job `i` in group `i % groups`, each job's effect (whatever its kind) on
    /// its group's account with its place in the group as its points, so the checker can tell
    /// the order effects committed in. `None` on a standard queue.
    pub fifo_groups: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Normal,
    Transient,
    NeverClears,
    Permanent,
    PoisonSchema,
    PoisonNotJson,
}

struct Planned {
    job_id: Option<Uuid>,
    body: String,
    kind: Kind,
    copies: usize,
    /// Its FIFO message group, on a FIFO run.
    group: Option<String>,
}

fn plan(spec: &SoakSpec) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    (0..spec.jobs)
        .map(|i| {
            let r: f64 = rng.random();
            let kind = match r {
                r if r < 0.01 => Kind::PoisonNotJson,
                r if r < 0.02 => Kind::PoisonSchema,
                r if r < 0.03 => Kind::Permanent,
                r if r < 0.13 => Kind::Transient,
                r if r < 0.135 => Kind::NeverClears,
                _ => Kind::Normal,
            };
            let job_id = Uuid::from_u128(rng.random());
            let group = spec.fifo_groups.map(|groups| i % groups);
            let mut payload = match kind {
                Kind::Normal => json!({"account_id": format!("acct-{}", i % 97), "points": 1 + i % 50}),
                Kind::Transient => json!({"account_id": "acct-t", "points": 1,
                    "demo_fault": {"transient_until_attempt": rng.random_range(2..=3)}}),
                Kind::NeverClears => json!({"account_id": "acct-n", "points": 1, "demo_fault": "always_transient"}),
                Kind::Permanent => json!({"account_id": "acct-p", "points": 1, "demo_fault": "permanent"}),
                Kind::PoisonSchema => json!({"account_id": "acct-s", "points": "lots"}),
                Kind::PoisonNotJson => Value::Null,
            };
            if let (Some(group), Some(groups), Some(fields)) =
                (group, spec.fifo_groups, payload.as_object_mut())
                && kind != Kind::PoisonSchema
            {
                fields.insert("account_id".into(), json!(format!("fifo-{group}")));
                fields.insert("points".into(), json!(1 + i / groups));
            }
            let body = if kind == Kind::PoisonNotJson {
                format!("not an envelope #{i}")
            } else {
                json!({"job_id": job_id, "tenant_id": Uuid::from_u128(7), "correlation_id": format!("soak-{i}"),
                    "payload": payload})
                .to_string()
            };
            Planned {
                job_id: (kind != Kind::PoisonNotJson).then_some(job_id),
                body,
                kind,
                copies: if rng.random_bool(0.25) { 2 } else { 1 },
                group: group.map(|g| format!("g{g}")),
            }
        })
        .collect()
}

/// What the soak did and what the checker found.
#[derive(Debug, Default, Clone)]
pub struct SoakReport {
    /// Messages sent to the job queue.
    pub published: u64,
    /// Distinct jobs among them.
    pub jobs: u64,
    /// Second copies sent.
    pub duplicates_sent: u64,
    /// Jobs with their effect.
    pub processed: u64,
    /// `DuplicateSkipped`, summed over the consumers' metrics.
    pub duplicates_skipped: u64,
    /// `Retried`, summed.
    pub retried: u64,
    /// `BatchCommitted`, summed: batches whose new jobs committed in one transaction.
    pub batches_committed: u64,
    /// `BatchFellBack`, summed: batches whose transaction stopped, their jobs then run one by one.
    pub batches_fell_back: u64,
    /// Dead letters by kind.
    pub dead_lettered: BTreeMap<String, u64>,
    /// Consumer processes killed with SIGKILL.
    pub kills: u64,
    /// How PostgreSQL was restarted, and how long it took to answer again.
    pub restart: String,
    /// `DeleteMessageBatch` calls lost on purpose.
    pub lost_deletes: u64,
    /// Jobs or messages with neither an effect nor a dead letter.
    pub lost: u64,
    /// Jobs with more than one effect.
    pub doubled: u64,
    /// Fences without their effect, plus effects without their fence.
    pub unpaired: u64,
    /// Poison letters that do not say 1 attempt.
    pub poison_retried: u64,
    /// Letters pending review for a job whose effect committed: false records.
    pub false_letters: u64,
    /// Letters written while a job had not committed, closed when another copy committed it.
    pub closed_by_commit: u64,
    /// Letters the operations invocations settled: rows writers with a settle due left received.
    pub settled_late: u64,
    /// Jobs whose outcome cannot follow from their kind (a poison job with an effect, …).
    pub unexpected: Vec<String>,
    /// On a FIFO run: effects that committed before an effect sent ahead of them in their
    /// message group (each group's points must grow in commit order). `None`: not a FIFO run.
    pub out_of_order: Option<u64>,
    /// How long the run took until everything was accounted for.
    pub seconds: f64,
}

impl SoakReport {
    /// Whether the promise held.
    pub fn holds(&self) -> bool {
        self.lost == 0
            && self.doubled == 0
            && self.unpaired == 0
            && self.poison_retried == 0
            && self.false_letters == 0
            && self.unexpected.is_empty()
            && self.out_of_order.unwrap_or(0) == 0
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "published           {:>7}  ({} jobs + {} second copies)",
            self.published, self.jobs, self.duplicates_sent
        )?;
        writeln!(
            f,
            "processed           {:>7}  jobs with their one effect",
            self.processed
        )?;
        writeln!(f, "duplicates skipped  {:>7}", self.duplicates_skipped)?;
        writeln!(f, "retried             {:>7}", self.retried)?;
        writeln!(
            f,
            "batches             {:>7}  committed whole, {} fell back to one job at a time",
            self.batches_committed, self.batches_fell_back
        )?;
        for (kind, n) in &self.dead_lettered {
            writeln!(f, "dead-lettered       {n:>7}  {kind}")?;
        }
        writeln!(
            f,
            "faults              {:>7}  SIGKILLs, {} lost deletes, PostgreSQL {}",
            self.kills, self.lost_deletes, self.restart
        )?;
        writeln!(f, "lost                {:>7}", self.lost)?;
        writeln!(f, "doubled             {:>7}", self.doubled)?;
        writeln!(f, "unpaired fences     {:>7}", self.unpaired)?;
        writeln!(f, "poison retried      {:>7}", self.poison_retried)?;
        writeln!(
            f,
            "false letters       {:>7}  pending for a committed job",
            self.false_letters
        )?;
        writeln!(
            f,
            "closed by a commit  {:>7}  letters of a copy, closed when another copy committed",
            self.closed_by_commit
        )?;
        writeln!(
            f,
            "settled late        {:>7}  letters written by the operations invocation (a settle due's tail)",
            self.settled_late
        )?;
        if let Some(out_of_order) = self.out_of_order {
            writeln!(
                f,
                "out of order        {out_of_order:>7}  effects committed before one sent ahead in their FIFO group"
            )?;
        }
        writeln!(
            f,
            "unexpected          {:>7}  {:?}",
            self.unexpected.len(),
            self.unexpected.iter().take(5).collect::<Vec<_>>()
        )?;
        write!(f, "took                {:>7.1} s", self.seconds)
    }
}

/// Runs the soak on a fresh stack from `stack_spec`; `admin` is a pool on the same database.
pub async fn run(spec: &SoakSpec, stack_spec: StackSpec, admin: &PgPool) -> SoakReport {
    let planned = plan(spec);
    let consumers: Vec<LambdaHost> = (0..spec.consumers)
        .map(|i| LambdaHost::new(stack_spec.consumer_function(&format!("consumer-{i}"))))
        .collect();
    let stack_spec_log_dir = stack_spec.log_dir.clone();
    let stack = Arc::new(Stack::start(stack_spec).await);
    let consumers = Arc::new(consumers);
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let lost_deletes = Arc::new(AtomicU64::new(0));

    // What the queues did with each message (sent, received, deleted or left), beside the
    // functions' logs: a job the checker finds lost is followed through it by its message ids.
    let trace = Arc::new(Trace::open(stack_spec_log_dir.as_deref()));
    // The event source: one poller per consumer sandbox, one for the DLQ.
    let mut pollers = tokio::task::JoinSet::new();
    for i in 0..spec.consumers {
        let (stack, consumers, stop, lost, trace) = (
            stack.clone(),
            consumers.clone(),
            stop.clone(),
            lost_deletes.clone(),
            trace.clone(),
        );
        let loss = spec.delete_loss;
        pollers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let source = EventSource {
                    sqs: &stack.sqs,
                    queue: &stack.jobs,
                    function: &consumers[i],
                    batch_size: 10,
                    delete_loss: loss,
                };
                let report = source.poll_once().await;
                trace.poll(&format!("consumer-{i}"), &report);
                if report
                    .invoke_error
                    .as_deref()
                    .is_some_and(|e| e.contains("injected"))
                {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    {
        let (stack, stop, trace) = (stack.clone(), stop.clone(), trace.clone());
        pollers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let source = EventSource {
                    sqs: &stack.sqs,
                    queue: &stack.dlq,
                    function: &stack.ingester,
                    batch_size: 10,
                    delete_loss: 0.0,
                };
                trace.poll("dlq-ingester", &source.poll_once().await);
            }
        });
    }

    // The scheduled function's bulk operations invocation, as its schedule runs it on AWS (every
    // minute; here every few seconds): it settles the letters writers with a settle due left
    // received (a storm's tail).
    let settled_late = Arc::new(AtomicU64::new(0));
    {
        let (stack, stop, settled) = (stack.clone(), stop.clone(), settled_late.clone());
        pollers.spawn(async move {
            let mut failed_before = false;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(OPERATIONS_EVERY).await;
                match stack.work_operations().await {
                    Ok(answer) => {
                        let letters = answer["settled"].as_u64().unwrap_or(0);
                        settled.fetch_add(letters, Ordering::Relaxed);
                    }
                    // Said once (PostgreSQL restarts under it): a round that cannot run leaves a
                    // due's tail unsettled, which the checker then counts as lost.
                    Err(e) if !failed_before => {
                        failed_before = true;
                        eprintln!("soak: the operations invocation failed: {e}");
                    }
                    Err(_) => {}
                }
            }
        });
    }

    // The chaos: SIGKILLs at random moments while the work is under way.
    let chaos_stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicU64::new(0));
    let chaos = {
        let (consumers, chaos_stop, kills) = (consumers.clone(), chaos_stop.clone(), kills.clone());
        let (mean, seed) = (spec.kill_every, spec.seed);
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
            while !chaos_stop.load(Ordering::Relaxed) {
                tokio::time::sleep(mean.mul_f64(rng.random_range(0.5..1.5))).await;
                let victim = rng.random_range(0..consumers.len());
                if consumers[victim].kill() {
                    kills.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // The producer: every planned message, second copies right after the first.
    let mut published = 0u64;
    // On a FIFO queue each send has its group and a deduplication id of its own: a second copy
    // is a second message (as a producer's retry past SQS's 5 minutes is), for the fence to answer.
    let sends: Vec<&Planned> = planned
        .iter()
        .flat_map(|p| std::iter::repeat_n(p, p.copies))
        .collect();
    for (n, chunk) in sends.chunks(10).enumerate() {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(&p.body)
                    .set_message_group_id(p.group.clone())
                    .set_message_deduplication_id(p.group.as_ref().map(|_| format!("{n}-{i}")))
                    .build()
                    .unwrap()
            })
            .collect();
        loop {
            match stack
                .sqs
                .send_message_batch()
                .queue_url(&stack.jobs.url)
                .set_entries(Some(entries.clone()))
                .send()
                .await
            {
                Ok(out) if out.failed.is_empty() => {
                    for sent in &out.successful {
                        let p = chunk[sent.id.parse::<usize>().expect("our entry ids")];
                        trace.line(&format!("sent {} {}", sent.message_id, p.body));
                    }
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        published += chunk.len() as u64;
    }

    // Halfway (by settled jobs), PostgreSQL goes down and comes back.
    let total = planned.len() as u64;
    let mut restart = String::from("not restarted (the run ended first)");
    let mut restarted = false;
    let deadline = started + spec.timeout;
    // Nothing queued and nothing settled for this long: what is missing will not come.
    let stalled_after = Duration::from_secs(60);
    let (mut last_settled, mut last_progress) = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let settled = settled_jobs(admin, &planned).await;
        if settled != last_settled {
            (last_settled, last_progress) = (settled, Instant::now());
        }
        if !restarted && settled >= total / 2 {
            restarted = true;
            restart = restart_postgres(&spec.restart, admin).await;
        }
        if restarted && settled >= total * 9 / 10 {
            chaos_stop.store(true, Ordering::Relaxed);
        }
        let idle = depth(&stack.sqs, &stack.jobs).await + depth(&stack.sqs, &stack.dlq).await == 0;
        let stalled =
            idle && chaos_stop.load(Ordering::Relaxed) && last_progress.elapsed() > stalled_after;
        if (settled == total && idle) || stalled || Instant::now() > deadline {
            break;
        }
    }
    chaos_stop.store(true, Ordering::Relaxed);
    let _ = chaos.await;
    stop.store(true, Ordering::Relaxed);
    while pollers.join_next().await.is_some() {}

    let mut report = check(admin, &planned).await;
    if spec.fifo_groups.is_some() {
        report.out_of_order = Some(out_of_order(admin, &planned).await);
    }
    report.published = published;
    report.jobs = total;
    report.duplicates_sent = published - total;
    report.kills = kills.load(Ordering::Relaxed);
    report.lost_deletes = lost_deletes.load(Ordering::Relaxed);
    report.settled_late = settled_late.load(Ordering::Relaxed);
    report.restart = restart;
    for host in consumers.iter() {
        let m = host.metrics();
        report.duplicates_skipped += m.get("DuplicateSkipped").copied().unwrap_or(0);
        report.retried += m.get("Retried").copied().unwrap_or(0);
        report.batches_committed += m.get("BatchCommitted").copied().unwrap_or(0);
        report.batches_fell_back += m.get("BatchFellBack").copied().unwrap_or(0);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}

async fn restart_postgres(how: &Restart, admin: &PgPool) -> String {
    let began = Instant::now();
    let what = match how {
        Restart::Command(cmd) => {
            let status = tokio::process::Command::new("sh")
                .args(["-c", cmd])
                .status()
                .await;
            format!("restarted ({cmd}: {status:?})")
        }
        Restart::TerminateConnections => {
            let killed: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
            )
            .fetch_one(admin)
            .await;
            format!("connections terminated ({} at once)", killed.unwrap_or(-1))
        }
    };
    for _ in 0..120 {
        if sqlx::query("SELECT 1").execute(admin).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    format!(
        "{what}, answering again after {:.1} s",
        began.elapsed().as_secs_f64()
    )
}

/// Jobs with an effect or a letter (a second copy may still be in flight).
async fn settled_jobs(admin: &PgPool, planned: &[Planned]) -> u64 {
    let ids: Vec<Uuid> = planned.iter().filter_map(|p| p.job_id).collect();
    let with_id: Option<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM unnest($1::uuid[]) AS j(id)
         WHERE EXISTS (SELECT 1 FROM reference.point_awards a WHERE a.job_id = j.id)
            OR EXISTS (SELECT 1 FROM core.dead_letters d WHERE d.job_id = j.id)",
    )
    .bind(&ids)
    .fetch_one(admin)
    .await
    .ok();
    let without_id: Option<i64> = sqlx::query_scalar(
        "SELECT count(DISTINCT coalesce(body, payload::text)) FROM core.dead_letters WHERE job_id IS NULL",
    )
    .fetch_one(admin)
    .await
    .ok();
    (with_id.unwrap_or(0) + without_id.unwrap_or(0)) as u64
}

/// The invariant checker: the database against the plan.
pub async fn check_invariants(admin: &PgPool) -> (u64, u64, u64, u64) {
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(admin)
            .await
            .expect("checker query") as u64
    };
    let doubled = count(
        "SELECT count(*) FROM (SELECT job_id FROM reference.point_awards GROUP BY job_id HAVING count(*) > 1) AS d",
    )
    .await;
    let unpaired = count(
        "SELECT (SELECT count(*) FROM core.processed_jobs p
                 WHERE NOT EXISTS (SELECT 1 FROM reference.point_awards a WHERE a.job_id = p.job_id))
              + (SELECT count(*) FROM reference.point_awards a
                 WHERE NOT EXISTS (SELECT 1 FROM core.processed_jobs p WHERE p.job_id = a.job_id))",
    )
    .await;
    let poison_retried = count(
        "SELECT count(*) FROM core.dead_letters WHERE error_kind = 'poison' AND attempts <> 1",
    )
    .await;
    let false_letters = count(
        "SELECT count(*) FROM core.dead_letters d
         WHERE d.status = 'pending_review'
           AND EXISTS (SELECT 1 FROM core.processed_jobs p
                       WHERE p.job_id = d.job_id AND p.consumer = d.consumer)",
    )
    .await;
    (doubled, unpaired, poison_retried, false_letters)
}

/// Effects of a FIFO run that committed after an effect sent behind them in their group: in
/// each group's account, the awards' points (their place in the group) taken in commit order
/// (the effect table's ids: a later job of a group begins only after an earlier one has
/// committed or become a letter) must grow.
async fn out_of_order(admin: &PgPool, planned: &[Planned]) -> u64 {
    let found: Vec<(String, i64, i64, i64, Uuid)> = sqlx::query_as(
        "SELECT account_id, id, points, before, job_id FROM (
             SELECT account_id, id, points, job_id,
                    lag(points) OVER (PARTITION BY account_id ORDER BY id) AS before
             FROM reference.point_awards WHERE account_id LIKE 'fifo-%') AS a
         WHERE points <= before",
    )
    .fetch_all(admin)
    .await
    .expect("checker query");
    for (account, id, points, before, job) in &found {
        let p = planned.iter().find(|p| p.job_id == Some(*job));
        let (kind, copies) = p.map_or((None, 0), |p| (Some(p.kind), p.copies));
        eprintln!(
            "out of order: {account} effect {id} (job {job}, {kind:?}, {copies} copies) has points {points} after {before}"
        );
    }
    found.len() as u64
}

async fn check(admin: &PgPool, planned: &[Planned]) -> SoakReport {
    let (doubled, unpaired, poison_retried, false_letters) = check_invariants(admin).await;
    let effects: HashSet<Uuid> =
        sqlx::query_scalar("SELECT DISTINCT job_id FROM reference.point_awards")
            .fetch_all(admin)
            .await
            .unwrap()
            .into_iter()
            .collect();
    // Letters still standing: a letter closed by a later commit of its job (reviewed by the
    // harness) records a failure that another copy made good; it is counted, not judged.
    // A letter's body as received (a letter keeps its body once since 0032: its payload is
    // NULL where the body gives it back).
    let letters: Vec<(Option<Uuid>, String, String, bool)> = sqlx::query_as(
        "SELECT job_id, error_kind, coalesce(body, payload #>> '{}'),
                reviewed_by IS NOT DISTINCT FROM 'harness'
         FROM core.dead_letters",
    )
    .fetch_all(admin)
    .await
    .unwrap();
    let mut kinds_by_job: BTreeMap<Uuid, Vec<String>> = BTreeMap::new();
    let mut poison_bodies = HashSet::new();
    let mut dead_lettered = BTreeMap::new();
    let mut closed_by_commit = 0;
    for (job, kind, body, closed) in &letters {
        if *closed {
            closed_by_commit += 1;
            continue;
        }
        *dead_lettered.entry(kind.clone()).or_insert(0) += 1;
        match job {
            Some(job) => kinds_by_job.entry(*job).or_default().push(kind.clone()),
            None => {
                poison_bodies.insert(body.clone());
            }
        }
    }
    let mut report = SoakReport {
        doubled,
        unpaired,
        poison_retried,
        false_letters,
        closed_by_commit,
        dead_lettered,
        ..Default::default()
    };
    for p in planned {
        let Some(job) = p.job_id else {
            if !poison_bodies.contains(&p.body) {
                report.lost += 1;
                eprintln!("lost: {:?} {}", p.kind, p.body);
            }
            continue;
        };
        let effect = effects.contains(&job);
        let kinds = kinds_by_job.get(&job).cloned().unwrap_or_default();
        report.processed += u64::from(effect);
        if !effect && kinds.is_empty() {
            report.lost += 1;
            eprintln!("lost: {:?} job {job}: {}", p.kind, p.body);
            continue;
        }
        // A job without an effect may end as `crashed` when kills took all its executions;
        // otherwise its kind decides. A job with an effect has no letter standing: that would
        // be a false record (and a replay of it a second award, once the fence is swept).
        let fits = match p.kind {
            Kind::Normal | Kind::Transient => {
                (effect && kinds.is_empty()) || (!effect && kinds.iter().all(|k| k == "crashed"))
            }
            Kind::NeverClears => {
                !effect && kinds.iter().all(|k| k == "exhausted" || k == "crashed")
            }
            Kind::Permanent => !effect && kinds.iter().all(|k| k == "permanent" || k == "crashed"),
            Kind::PoisonSchema => !effect && kinds.iter().all(|k| k == "poison"),
            Kind::PoisonNotJson => unreachable!("no job id"),
        };
        if !fits {
            report.unexpected.push(format!(
                "{:?} {job}: effect {effect}, letters {kinds:?}",
                p.kind
            ));
        }
    }
    report
}

/// The soak's queue trace (`event-source.log` in the functions' log directory, if there is
/// one): a line per message sent and per poll, with the records received, each with its receive
/// count and `deleted` or `left`.
struct Trace {
    file: Option<std::sync::Mutex<std::fs::File>>,
    started: Instant,
}

impl Trace {
    fn open(dir: Option<&std::path::Path>) -> Self {
        let file = dir.map(|d| {
            let file = std::fs::File::create(d.join("event-source.log")).expect("the trace file");
            std::sync::Mutex::new(file)
        });
        Self {
            file,
            started: Instant::now(),
        }
    }

    fn line(&self, text: &str) {
        if let Some(file) = &self.file {
            use std::io::Write;
            let at = self.started.elapsed().as_secs_f64();
            let _ = writeln!(file.lock().unwrap(), "{at:9.3} {text}");
        }
    }

    fn poll(&self, function: &str, report: &crate::event_source::PollReport) {
        if report.received == 0 && report.invoke_error.is_none() {
            return;
        }
        let records: Vec<String> = report
            .records
            .iter()
            .map(|(id, count, deleted)| {
                format!("{id}:{count}:{}", if *deleted { "deleted" } else { "left" })
            })
            .collect();
        self.line(&format!(
            "poll {function} received={} error={:?} {}",
            report.received,
            report.invoke_error,
            records.join(" ")
        ));
    }
}
