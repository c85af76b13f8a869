//! The local demo: the sample workload through the local stack (a local SQS API, the consumer
//! and DLQ ingester as real Lambda binaries fed like the event source mapping, PostgreSQL),
//! with progress while it waits and a summary of the functions' own metrics. Its last phase is
//! on call: a partner's ledger was offline, and an operator replays the failure group in bulk
//! with the `dlq` tool over HTTP through the local gateway.
//!
//! It runs every consumer the workspace declares (`migrate::consumers::CONSUMERS`): the
//! reference consumer with failures on request (`local-consumer`), every other one its own
//! binary on its own queue. redeem-reward has a workload of its own; any other consumer gets a
//! message that is not an envelope, which must come out as its poison letter.

use crate::api_client::{caller, request, with_body};
use crate::stack::{Binaries, Stack, StackSpec};
use dead_letter_api::api::Scope;
use migrate::consumers::{CONSUMERS, ConsumerCrate};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// The job queue's name, as in `template.yaml`; the DLQ is `<name>-dlq`.
pub const QUEUE: &str = "points-award-jobs";

/// The consumer with a workload of its own besides the reference consumer.
const REDEEM_REWARD: &str = "redeem-reward";

/// Migrates `database_url` as a deploy does: the migrate function's own code (the core schema
/// first, then each consumer's own, each in its own tracking table).
pub async fn migrate(database_url: &str) -> Result<(), String> {
    let pool = sqlx::PgPool::connect(database_url)
        .await
        .map_err(|e| format!("cannot connect to DATABASE_URL: {e}"))?;
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    migrate::schema::apply(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    drop(conn);
    pool.close().await;
    Ok(())
}

/// The metric counts the workload must produce (another consumer's prefixed by its name).
pub fn expected() -> BTreeMap<String, u64> {
    let mut expected = BTreeMap::from([
        ("redeem-reward/Processed", 2),
        ("redeem-reward/DuplicateSkipped", 1),
        ("redeem-reward/DeadLetteredPoison", 1),
        // Its own metric: 500 + 300 points of the two redemptions that went through.
        ("redeem-reward/PointsRedeemed", 800),
        // 6 in phase 1, the 4 partner jobs when phase 5 replays them.
        ("Processed", 6 + 4),
        ("DuplicateSkipped", 1),
        // 2 then success, 4 then a letter; the 4 partner jobs 4 times each during the outage.
        ("Retried", 2 + 4 + 4 * 4),
        ("DeadLetteredExhausted", 1 + 4),
        // The second: phase 4 replays the permanent failure, which fails again.
        ("DeadLetteredPermanent", 2),
        ("DeadLetteredPoison", 2),
        ("DeadLetteredCrashed", 1),
        // After phase 5: the exhausted and crashed letters, and the failed replay (the partner
        // group is replayed).
        ("LettersPendingReview", 3),
    ])
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect::<BTreeMap<String, u64>>();
    // Phase 1c: every other consumer's poison letter (phase 4 discards it).
    for consumer in others_without_a_workload() {
        expected.insert(format!("{}/DeadLetteredPoison", consumer.name), 1);
    }
    expected
}

/// The consumers besides the reference consumer and redeem-reward.
fn others_without_a_workload() -> impl Iterator<Item = &'static ConsumerCrate> {
    let reference = crate::consumer_name();
    CONSUMERS
        .iter()
        .filter(move |c| c.name != reference.as_str() && c.name != REDEEM_REWARD)
}

fn envelope(payload: Value) -> String {
    let job_id = Uuid::new_v4();
    json!({"job_id": job_id, "tenant_id": Uuid::from_u128(1), "correlation_id": format!("demo-{job_id}"), "payload": payload})
        .to_string()
}

/// Jobs for partner accounts, failing while the partner's ledger is offline (phase 1) and
/// replayed in bulk once it is back (phase 5).
const PARTNER_JOBS: usize = 4;

/// The partner ledger's outage (`online: false`) or its return: while it is out, every award to
/// a `partner-` account fails, as a provider that is down makes a job fail, each with its
/// account in the error (one failure group all the same). The demo and the operator tool's
/// tests both stage it.
pub async fn partner_ledger(db: &sqlx::PgPool, online: bool) -> sqlx::Result<()> {
    let sql = if online {
        "DROP TRIGGER partner_ledger_offline ON reference.point_awards"
    } else {
        "CREATE OR REPLACE FUNCTION reference.partner_ledger_offline() RETURNS trigger
         LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.account_id LIKE 'partner-%' THEN
                 RAISE EXCEPTION 'partner ledger offline: account \"%\" not credited', NEW.account_id;
             END IF;
             RETURN NEW;
         END $$;
         CREATE OR REPLACE TRIGGER partner_ledger_offline BEFORE INSERT ON reference.point_awards
             FOR EACH ROW EXECUTE FUNCTION reference.partner_ledger_offline();"
    };
    sqlx::raw_sql(sql).execute(db).await.map(drop)
}

/// The messages of the workload, each with what it shows.
fn workload() -> Vec<(&'static str, String)> {
    let mut samples: Vec<(&'static str, String)> = (1..=5)
        .map(|i| {
            (
                "normal job",
                envelope(json!({"account_id": format!("acct-{i}"), "points": 10 * i})),
            )
        })
        .collect();
    samples.push(("the first job, sent again", samples[0].1.clone()));
    let faulty = [
        (
            "fails twice, then succeeds",
            json!({"transient_until_attempt": 3}),
        ),
        ("always fails transiently", json!("always_transient")),
        ("fails permanently", json!("permanent")),
    ];
    for (label, fault) in faulty {
        samples.push((
            label,
            envelope(json!({"account_id": "acct-x", "points": 1, "demo_fault": fault})),
        ));
    }
    for i in 1..=PARTNER_JOBS {
        samples.push((
            "a partner account, while the partner ledger is offline",
            envelope(json!({"account_id": format!("partner-{i}"), "points": 5 * i})),
        ));
    }
    samples.push(("poison: not JSON", "this is not an envelope".into()));
    samples.push((
        "poison: payload fails its schema",
        envelope(json!({"account_id": "acct-y", "points": "lots"})),
    ));
    samples
}

/// Runs the workload on a fresh stack over `database_url` (already migrated) and prints what
/// happens. A job that kills its process fails its whole batch, as on Lambda, so it runs in a
/// second phase of its own. Returns the summed metrics of both functions.
pub async fn run(database_url: &str, queue: &str, log_dir: PathBuf) -> BTreeMap<String, u64> {
    let binaries = Binaries::beside_current_exe();
    let mut spec = StackSpec::time_scaled(binaries.clone(), database_url, queue);
    spec.log_dir = Some(log_dir.clone());
    // Every other consumer on its own binary and queue.
    let mut others = Vec::new();
    for consumer in CONSUMERS.iter().filter(|c| c.name != spec.consumer_name) {
        if let Err(e) = binaries.missing(std::slice::from_ref(consumer)) {
            panic!("{e}");
        }
        let own_queue = format!("{queue}{}", consumer.local_queue_suffix);
        let own = spec.for_consumer(consumer, &own_queue, binaries.own_binary(consumer));
        others.push((consumer, Stack::start(own).await));
    }
    // As deployed: the reference consumer commits per batch (redeem-reward per job).
    spec.consumer_env
        .push(("COMMIT_MODE".into(), "batch".into()));
    let stack = Stack::start(spec).await;
    for s in std::iter::once(&stack).chain(others.iter().map(|(_, s)| s)) {
        for q in [&s.jobs, &s.dlq] {
            let _ = stack.sqs.purge_queue().queue_url(&q.url).send().await;
        }
    }
    println!(
        "queues: {} (visibility 2 s) → redrive after 7 receives → {}",
        stack.jobs.name, stack.dlq.name
    );
    println!(
        "function logs: {}/{{consumer,dlq-ingester,scheduled,dead-letters-*}}.log",
        log_dir.display()
    );
    println!(
        "retry policy: 5 attempts, backoff base 1 s (the platform default's shape, time-scaled)"
    );
    BEGAN.get_or_init(chrono::Utc::now);
    let db = sqlx::PgPool::connect(database_url)
        .await
        .expect("the demo database");
    partner_ledger(&db, false)
        .await
        .expect("the partner ledger's outage");
    let start = Instant::now();
    let mut sent = 0;
    println!("\nphase 1: the workload (the partner ledger is offline)");
    sent += send_all(&stack, workload()).await;
    settle(&stack, sent, start).await;
    if let Some((_, redeem)) = others.iter().find(|(c, _)| c.name == REDEEM_REWARD) {
        redeem_rewards(redeem, start).await;
    }
    for (consumer, other) in others.iter().filter(|(c, _)| c.name != REDEEM_REWARD) {
        println!(
            "\nphase 1c: {}, on its own queue {}: a message that is not an envelope",
            consumer.name, other.jobs.name
        );
        let sent = send_all(other, vec![("poison: not JSON", "not an envelope".into())]).await;
        settle(other, sent, start).await;
    }
    println!("\nphase 2: a job that kills its process on every delivery");
    let crasher =
        envelope(json!({"account_id": "acct-z", "points": 1, "demo_fault": "crash_before_commit"}));
    sent += send_all(&stack, vec![("kills its process every time", crasher)]).await;
    settle(&stack, sent, start).await;
    println!("\nphase 3: the scheduled function (EventBridge, every few minutes on AWS)");
    match stack.tick().await {
        Ok(report) => println!("  scheduled: {report}"),
        Err(e) => println!("  scheduled failed: {e}"),
    }
    println!("\nphase 4: an operator reviews the dead letters through the API functions");
    review(&stack, &mut sent, start).await;
    println!(
        "\nphase 5: the partner ledger is back; on call replays its failure group in bulk with dlq, \
         over HTTP through the local gateway"
    );
    partner_ledger(&db, true)
        .await
        .expect("the partner ledger back");
    sent += bulk_replay(&stack).await;
    settle(&stack, sent, start).await;
    let (committed, fell_back) = batches(&stack);
    println!(
        "\nbatch mode: {committed} SQS batch(es) of award-points committed in one transaction each, \
         {fell_back} fell back to one job at a time (a failing job in them)"
    );
    let mut totals = totals(&stack);
    for (consumer, other) in &others {
        for (metric, n) in self::totals(other) {
            totals.insert(format!("{}/{metric}", consumer.name), n);
        }
    }
    totals.insert(
        "LettersPendingReview".into(),
        pending(&stack).await.len() as u64,
    );
    totals
}

/// Phase 1b: redeem-reward's workload, on its own queue with its own retry policy.
async fn redeem_rewards(redeem: &Stack, start: Instant) {
    println!(
        "\nphase 1b: a second consumer, redeem-reward, on its own queue {} (3 executions, base 1 s)",
        redeem.jobs.name
    );
    let mug = envelope(json!({"account_id": "acct-1", "reward_sku": "mug", "cost_points": 500}));
    let redeem_sent = send_all(
        redeem,
        vec![
            ("a redemption", mug.clone()),
            ("the same redemption, sent again", mug),
            (
                "another redemption",
                envelope(json!({"account_id": "acct-2", "reward_sku": "cap", "cost_points": 300})),
            ),
            (
                "poison: a redemption costing nothing",
                envelope(json!({"account_id": "acct-3", "reward_sku": "pen", "cost_points": 0})),
            ),
        ],
    )
    .await;
    settle(redeem, redeem_sent, start).await;
}

fn operator(scope: Scope) -> Option<dead_letter_api::api::Caller> {
    Some(caller("demo-operator", &[scope]))
}

/// When this run began: the demo looks only at what it wrote, so a database used before gives
/// the same summary.
static BEGAN: std::sync::OnceLock<chrono::DateTime<chrono::Utc>> = std::sync::OnceLock::new();

/// The letters of this run pending review, as the read function lists them.
async fn pending(stack: &Stack) -> Vec<Value> {
    let mut list = request("GET", "/v1/core/dead-letters", operator(Scope::Read));
    let began = BEGAN.get_or_init(chrono::Utc::now);
    list.query = vec![
        ("status".into(), "pending_review".into()),
        (
            "created_from".into(),
            began.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    ];
    let response = stack.api.call(&list).await;
    response.body["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Lists the pending letters, discards the poison ones with a reason, replays the permanent
/// failure (which fails again, linked to the first) and shows that a second replay is refused.
async fn review(stack: &Stack, sent: &mut u64, start: Instant) {
    let letters = pending(stack).await;
    println!(
        "  GET /v1/core/dead-letters?status=pending_review → {} letters",
        letters.len()
    );
    for letter in &letters {
        println!(
            "    {} {:<9} attempts {} {}",
            letter["id"].as_str().unwrap_or("?"),
            letter["error_kind"].as_str().unwrap_or("?"),
            letter["attempts"],
            letter["last_error"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect::<String>()
        );
    }
    for letter in letters.iter().filter(|l| l["error_kind"] == "poison") {
        let path = format!(
            "/v1/core/dead-letters/{}/discard",
            letter["id"].as_str().unwrap_or("")
        );
        let body = r#"{"reason": "malformed test messages from the demo; nothing to award"}"#;
        let response = stack
            .api
            .call(&with_body(
                request("POST", &path, operator(Scope::Discard)),
                body,
            ))
            .await;
        println!(
            "  POST …/discard → {} {}",
            response.status, response.body["letter"]["status"]
        );
    }
    let Some(permanent) = letters.iter().find(|l| l["error_kind"] == "permanent") else {
        println!("  no permanent letter to replay");
        return;
    };
    let path = format!(
        "/v1/core/dead-letters/{}/replay",
        permanent["id"].as_str().unwrap_or("")
    );
    let replay = request("POST", &path, operator(Scope::Replay));
    let response = stack.api.call(&replay).await;
    println!(
        "  POST …/replay → {} effect: {}",
        response.status, response.body["replay"]["effect"]
    );
    let again = stack.api.call(&replay).await;
    println!(
        "  POST …/replay again → {} {}",
        again.status, again.body["error"]["code"]
    );
    *sent += 1;
    settle(stack, *sent, start).await;
}

/// Runs the `dlq` tool against a local gateway in front of the stack's API functions: the
/// groups, a dry run of the partner group's replay, then the replay. Returns how many messages
/// it sent.
async fn bulk_replay(stack: &Stack) -> u64 {
    let (operator, _) = crate::gateway::DevToken::local_pair();
    let gateway = crate::gateway::Gateway::start(
        stack.api.clone(),
        std::slice::from_ref(&operator),
        "127.0.0.1:0".parse().expect("an address"),
    )
    .await
    .expect("the local gateway");
    let exe = std::env::current_exe().expect("the demo's path");
    let tool = exe.with_file_name("local-dlq");
    let dlq = |args: &[&str]| {
        let output = std::process::Command::new(&tool)
            .args(args)
            .env("DLQ_API_URL", &gateway.url)
            .env("DLQ_TOKEN", &operator.token)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the dlq tool runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (_, listed) = dlq(&["--json", "groups", "--queue", &stack.jobs.name]);
    let groups: Vec<Value> = serde_json::from_str(listed.trim()).unwrap_or_default();
    let Some(partner) = groups.iter().find(|g| {
        g["pattern"]
            .as_str()
            .is_some_and(|p| p.contains("partner ledger offline"))
    }) else {
        println!("  no partner group found: {listed}");
        return 0;
    };
    let group = partner["id"].to_string();
    let reason = "partner ledger back after its maintenance (demo)";
    let show = |args: &[&str]| {
        println!(
            "  $ dlq {}",
            args.iter()
                .map(|a| crate::shell_word(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
    };
    let print = |status: Option<i32>, out: &str| {
        for line in out.lines() {
            println!("    {line}");
        }
        if status != Some(0) {
            println!("    (exit status {status:?})");
        }
    };
    for args in [
        vec!["groups"],
        vec!["replay", "--group", &group, "--dry-run"],
    ] {
        show(&args);
        let (status, out) = dlq(&args);
        print(status, &out);
    }
    // The replay is one operation the scheduled function works (its operations schedule on
    // AWS; its round invoked here while dlq follows the operation's progress).
    let args = [
        "replay",
        "--group",
        &group,
        "--yes",
        "--reason",
        reason,
        "--progress",
        "none",
    ];
    show(&args);
    let replay = tokio::process::Command::new(&tool)
        .args(args)
        .env("DLQ_API_URL", &gateway.url)
        .env("DLQ_TOKEN", &operator.token)
        .stdin(std::process::Stdio::null())
        .output();
    let worker = async {
        loop {
            if let Err(e) = stack.work_operations().await {
                println!("    (operations round failed: {e})");
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    };
    let output = tokio::select! {
        output = replay => output.expect("the dlq tool runs"),
        () = worker => unreachable!("the worker loops"),
    };
    print(
        output.status.code(),
        &String::from_utf8_lossy(&output.stdout),
    );
    partner["pending_count"].as_u64().unwrap_or(0)
}

async fn send_all(stack: &Stack, samples: Vec<(&'static str, String)>) -> u64 {
    for (label, body) in &samples {
        stack.send(body).await;
        println!("  sent: {label}");
    }
    samples.len() as u64
}

/// Polls until `sent` messages have a final outcome and both queues are empty.
async fn settle(stack: &Stack, sent: u64, start: Instant) {
    let mut last_progress = Instant::now();
    loop {
        let (jobs, dlq) = stack.poll().await;
        let t = start.elapsed().as_secs_f64();
        if jobs.received > 0 {
            let crash = jobs
                .invoke_error
                .as_deref()
                .map(|e| format!(" — invocation failed: {e}"))
                .unwrap_or_default();
            println!(
                "[{t:5.1}s] consumer: {} record(s), {} done, {} back to the queue{crash}",
                jobs.received, jobs.deleted, jobs.left
            );
        }
        if dlq.received > 0 {
            println!(
                "[{t:5.1}s] dlq-ingester: {} record(s) written as dead letters",
                dlq.deleted
            );
        }
        let settled: u64 = totals(stack)
            .iter()
            .filter(|(k, _)| is_terminal(k))
            .map(|(_, v)| v)
            .sum();
        let in_flight = stack.in_flight().await;
        if settled >= sent && in_flight == 0 {
            return;
        }
        if last_progress.elapsed() > Duration::from_secs(3) {
            println!(
                "[{t:5.1}s] … {in_flight} message(s) waiting out their backoff or visibility timeout"
            );
            last_progress = Instant::now();
        }
        if start.elapsed() > Duration::from_secs(240) {
            println!("[{t:5.1}s] giving up: not settled after 240 s");
            return;
        }
    }
}

fn is_terminal(metric: &str) -> bool {
    metric == "Processed" || metric == "DuplicateSkipped" || metric.starts_with("DeadLettered")
}

/// The outcome counts of both functions. How many batches committed together depends on how
/// the queue hands out the messages, so those counts are left out (`batches` prints them).
fn totals(stack: &Stack) -> BTreeMap<String, u64> {
    let mut sum = stack.consumer.metrics();
    for (k, v) in stack.ingester.metrics() {
        *sum.entry(k).or_default() += v;
    }
    sum.retain(|k, v| *v > 0 && !k.starts_with("Batch"));
    sum
}

/// The consumer's batch commits and fallbacks so far.
pub fn batches(stack: &Stack) -> (u64, u64) {
    let m = stack.consumer.metrics();
    (
        m.get("BatchCommitted").copied().unwrap_or(0),
        m.get("BatchFellBack").copied().unwrap_or(0),
    )
}
