//! The operators' tool `dlq` end to end, as on-call uses it: the real binary, over HTTP, through
//! the local gateway (development tokens, API Gateway's route and scope checks) to the real API
//! functions, next to the real consumer on the local SQS API. A partner's ledger goes offline,
//! a group of jobs fails; the tool finds the group, dry-runs a replay (nothing changes), replays
//! it in bulk as one operation the real scheduled binary works while `dlq` follows it (each job
//! applied once, the summary and the letters' final state checked); an interrupted `dlq` leaves
//! its operation running, following it again sees it to its end, and an operation left running
//! (`--detach`) is cancelled by whoever may start it.

use consumer::count_awards;
use e2e::demo::partner_ledger;
use e2e::gateway::{DevToken, Gateway};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::dead_letter::{GroupFilter, list_groups};
use shared::ids::{GroupId, JobId, TenantId};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(90);
const REASON: &str = "partner ledger back after INC-7";

struct Setup {
    pool: PgPool,
    stack: Stack,
    gateway: Gateway,
    operator: DevToken,
    reader: DevToken,
}

/// A stack whose consumer gives up after 2 executions (a letter in seconds), behind a gateway.
async fn setup(pool_opts: PgPoolOptions, connect: PgConnectOptions) -> Setup {
    let (pool, stack) =
        e2e::stack::start_for_test(e2e::test_binaries!(), pool_opts, connect, |spec| {
            spec.max_receive_count = 4;
            spec.consumer_env = vec![
                ("RETRY_MAX_ATTEMPTS".into(), "2".into()),
                ("RETRY_BASE_SECONDS".into(), "1".into()),
                ("RETRY_CAP_SECONDS".into(), "60".into()),
                (
                    "RETRY_OVERRIDE_RATIONALE".into(),
                    "operator tool test: a letter in seconds".into(),
                ),
                ("DEADLINE_MARGIN_MS".into(), "4000".into()),
            ];
        })
        .await;
    let (operator, reader) = DevToken::local_pair();
    let gateway = Gateway::start(
        stack.api.clone(),
        &[operator.clone(), reader.clone()],
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    Setup {
        pool,
        stack,
        gateway,
        operator,
        reader,
    }
}

/// `n` partner jobs fail during the outage (next to two that go through); returns their jobs
/// and their group, once every one has its letter.
async fn an_outage(s: &Setup, n: usize) -> (Vec<JobId>, GroupId) {
    partner_ledger(&s.pool, false).await.unwrap();
    let mut jobs = Vec::new();
    for i in 0..n {
        let job = JobId(Uuid::new_v4());
        let body = json!({"job_id": job, "tenant_id": TenantId(Uuid::new_v4()), "correlation_id": format!("partner-{i}"),
            "payload": {"account_id": format!("partner-{i}"), "points": 10}});
        s.stack.send(&body.to_string()).await;
        jobs.push(job);
    }
    for i in 0..2 {
        let body = json!({"job_id": Uuid::new_v4(), "tenant_id": Uuid::new_v4(), "correlation_id": "ok",
            "payload": {"account_id": format!("acct-{i}"), "points": 1}});
        s.stack.send(&body.to_string()).await;
    }
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            pending as usize >= n
        })
        .await;
    let groups = list_groups(&s.pool, &GroupFilter::default(), None, 10)
        .await
        .unwrap();
    assert_eq!(groups.len(), 1, "one failure, one group: {groups:#?}");
    assert_eq!(groups[0].letter_count as usize, n);
    (jobs, groups[0].id)
}

struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn last_json(&self) -> Value {
        let line = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

fn dlq(s: &Setup, token: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_local-dlq"));
    cmd.args(args)
        .env("DLQ_API_URL", &s.gateway.url)
        .env("DLQ_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

async fn run(s: &Setup, token: &str, args: &[&str]) -> Run {
    let out = dlq(s, token, args).output().await.expect("dlq runs");
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `dlq` with `args` while the scheduled function's operations round is invoked again and
/// again (its own schedule's work on AWS), so an operation `dlq` starts is worked as it follows.
async fn run_with_worker(s: &Setup, token: &str, args: &[&str]) -> Run {
    let tool = dlq(s, token, args).output();
    let worker = async {
        loop {
            s.stack
                .work_operations()
                .await
                .expect("the operations round");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let out = tokio::select! {
        out = tool => out.expect("dlq runs"),
        () = worker => unreachable!("the worker loops"),
    };
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Waits until every job of `jobs` is applied and the queues are empty, then checks each was
/// applied exactly once.
async fn each_applied_once(s: &Setup, jobs: &[JobId]) {
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            for job in jobs {
                if count_awards(pool, *job).await.unwrap() == 0 {
                    return false;
                }
            }
            true
        })
        .await;
    for job in jobs {
        assert_eq!(count_awards(pool, *job).await.unwrap(), 1, "job {job}");
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_dry_run_changes_nothing_and_a_bulk_replay_applies_each_job_of_the_group_once(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let s = setup(pool_opts, connect).await;
    let (jobs, group) = an_outage(&s, 5).await;
    // One job of the group committed meanwhile through an older harness that left its letter
    // pending: a replay of it must send nothing.
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         VALUES ($1, 'award-points', gen_random_uuid(), now(), now() + interval '7 days')",
    )
    .bind(jobs[4].0)
    .execute(&s.pool)
    .await
    .unwrap();
    let token = s.operator.token.clone();
    let g = group.to_string();

    let groups = run(&s, &token, &["groups"]).await;
    assert_eq!(groups.status, 0, "{}", groups.stderr);
    assert!(groups.stdout.contains("1 group(s)"), "{}", groups.stdout);
    let listed = run(&s, &token, &["--json", "groups"]).await.last_json();
    assert_eq!(listed[0]["id"], group.0);
    assert_eq!(listed[0]["pending_count"], 5);
    assert!(
        listed[0]["pattern"]
            .as_str()
            .unwrap()
            .contains("partner ledger offline: account <q> not credited"),
        "{listed:#}"
    );
    // A list cut at its limit says so, and how to see the rest; one that holds them all does not.
    let cut = run(&s, &token, &["list", "--limit", "2"]).await;
    assert_eq!(cut.status, 0, "{}", cut.stderr);
    assert!(cut.stdout.contains("2 letter(s)"), "{}", cut.stdout);
    assert!(
        cut.stderr.contains("more letters match than the 2 shown")
            && cut.stderr.contains("--limit"),
        "{}",
        cut.stderr
    );
    let whole = run(&s, &token, &["--json", "list", "--limit", "50"]).await;
    assert_eq!(whole.last_json().as_array().map(Vec::len), Some(5));
    assert!(
        !whole.stderr.contains("more letters match"),
        "{}",
        whole.stderr
    );

    let before = e2e::api_client::fingerprint(&s.pool).await;
    let plan = run(
        &s,
        &token,
        &["--json", "replay", "--group", &g, "--dry-run"],
    )
    .await;
    assert_eq!(plan.status, 0, "{}", plan.stderr);
    let plan = plan.last_json();
    assert_eq!(
        (&plan["dry_run"], &plan["action"], &plan["selection"]),
        (
            &json!(true),
            &json!("replay"),
            &json!({"group_id": group.0})
        ),
        "{plan:#}"
    );
    assert_eq!(
        plan["plan"],
        json!({"letters": 5, "by_kind": {"exhausted": 5}, "not_replayable": 0})
    );
    let human = run(&s, &token, &["replay", "--group", &g, "--dry-run"]).await;
    assert!(
        human
            .stdout
            .contains("Plan: replay 5 letter(s) pending review, selected by --group")
            && human.stdout.contains("partner ledger offline")
            && human.stdout.contains("Dry run: nothing was changed."),
        "{}",
        human.stdout
    );
    println!("{}", human.stdout);
    assert_eq!(
        e2e::api_client::fingerprint(&s.pool).await,
        before,
        "a dry run changes nothing"
    );

    // A token without the replay scope: refused before anything is printed (the gateway's 403
    // to the plan, which is the operation's own route), a dry run too; nothing done.
    for args in [
        &["replay", "--group", &g, "--yes", "--reason", REASON][..],
        &["replay", "--group", &g, "--dry-run"],
    ] {
        let refused = run(&s, &s.reader.token, args).await;
        assert_eq!(refused.status, 2, "{}\n{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("403")
                && refused.stderr.contains("may not replay")
                && refused.stderr.contains("core.dead_letters.replay"),
            "{}",
            refused.stderr
        );
        assert!(refused.stdout.is_empty(), "no plan: {}", refused.stdout);
    }
    assert_eq!(e2e::api_client::fingerprint(&s.pool).await, before);
    // A real run needs a reason, and a non-terminal needs --yes: both refused before anything.
    assert_eq!(
        run(&s, &token, &["replay", "--group", &g, "--yes"])
            .await
            .status,
        2
    );
    assert_eq!(
        run(&s, &token, &["replay", "--group", &g, "--reason", REASON])
            .await
            .status,
        2
    );
    assert_eq!(e2e::api_client::fingerprint(&s.pool).await, before);

    partner_ledger(&s.pool, true).await.unwrap(); // the cause is fixed
    let bulk = run_with_worker(
        &s,
        &token,
        &[
            "--json", "replay", "--group", &g, "--yes", "--reason", REASON,
        ],
    )
    .await;
    assert_eq!(bulk.status, 0, "{}\n{}", bulk.stdout, bulk.stderr);
    assert_eq!(
        bulk.stdout.lines().count(),
        1,
        "--json: one document\n{}",
        bulk.stdout
    );
    let ended = bulk.last_json();
    let op = &ended["operation"];
    assert_eq!(
        (
            &ended["ending"],
            &op["status"],
            &op["planned"],
            &op["reason"]
        ),
        (&json!("done"), &json!("done"), &json!(5), &json!(REASON)),
        "{ended:#}"
    );
    assert_eq!(
        op["progress"],
        json!({"replayed": 4, "sent": 4, "already_processed": 1, "discarded": 0,
               "skipped_not_replayable": 0, "skipped_not_sendable": 0}),
        "{ended:#}"
    );
    let operation: Uuid = op["id"].as_str().unwrap().parse().unwrap();
    for out in [&bulk.stdout, &bulk.stderr, &groups.stdout] {
        assert!(
            !out.contains(&token) && !out.contains(&s.reader.token),
            "the token never shows"
        );
    }

    each_applied_once(&s, &jobs[..4]).await;
    assert_eq!(
        count_awards(&s.pool, jobs[4]).await.unwrap(),
        0,
        "already processed: nothing was sent"
    );
    type Review = (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<Uuid>,
    );
    let letters: Vec<Review> = sqlx::query_as(
        "SELECT status, reviewed_by, replay_reason, replay_outcome, operation_id
         FROM core.dead_letters WHERE group_id = $1",
    )
    .bind(group.0)
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(letters.len(), 5);
    for (status, by, reason, _, by_operation) in &letters {
        assert_eq!(
            (
                status.as_str(),
                by.as_deref(),
                reason.as_deref(),
                *by_operation
            ),
            (
                "replayed",
                Some("dev-operator"),
                Some(REASON),
                Some(operation)
            )
        );
    }
    let outcomes = letters
        .iter()
        .filter(|l| l.3.as_deref() == Some("already_processed"))
        .count();
    assert_eq!(outcomes, 1);
    let group_now = shared::dead_letter::group(&s.pool, group)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (group_now.status, group_now.pending_count),
        (shared::dead_letter::GroupStatus::Resolved, 0)
    );
    let again = run(
        &s,
        &token,
        &["replay", "--group", &g, "--yes", "--reason", REASON],
    )
    .await;
    assert_eq!(again.status, 0, "{}", again.stderr);
    assert!(
        again.stdout.contains("Nothing to replay."),
        "{}",
        again.stdout
    );
    let listed = run(&s, &s.reader.token, &["--json", "operations"])
        .await
        .last_json();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "a second run finds nothing left to do and starts no operation: {listed:#}"
    );
}

/// Ctrl-C stops `dlq` following an operation, never the operation: it says how to follow or
/// stop it, the operation runs on, and following it again (by the first digits of its id) sees
/// it to its end; a letter of the same failure written after it started is left alone. An
/// operation left running (`--detach`) is cancelled by whoever may start its action, with a
/// reason; a reader may not, and a second cancel is refused.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_interrupted_dlq_leaves_its_operation_running_and_following_it_again_sees_it_end(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let s = setup(pool_opts, connect).await;
    let (jobs, group) = an_outage(&s, 6).await;
    partner_ledger(&s.pool, true).await.unwrap();
    let g = group.to_string();
    let token = s.operator.token.clone();
    let args = [
        "replay",
        "--group",
        &g,
        "--yes",
        "--reason",
        REASON,
        "--progress",
        "lines",
    ];
    // No worker yet: dlq starts the operation and waits for it.
    let child = dlq(&s, &token, &args).spawn().unwrap();
    let pid = child.id().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while scalar(&s.pool, "SELECT count(*) FROM core.dead_letter_operations").await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no operation started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await; // following it
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    let (operation, status): (Uuid, String) =
        sqlx::query_as("SELECT id, status FROM core.dead_letter_operations")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_eq!(
        status, "running",
        "interrupting dlq does not stop the operation"
    );
    for said in [
        format!("Started replay operation {operation}: 6 letter(s) planned"),
        "goes on server-side".to_owned(),
        "nothing was cancelled".to_owned(),
        format!("dlq operation {operation} --follow"),
        format!("dlq cancel {operation} --reason"),
    ] {
        assert!(stdout.contains(&said), "{said:?} in:\n{stdout}");
    }
    assert!(
        stderr.contains("0/6 waiting for the scheduled worker"),
        "a line on stderr while it waits: {stderr}"
    );

    // A letter of the same failure written after the operation started: outside it.
    let sample = shared::dead_letter::group(&s.pool, group)
        .await
        .unwrap()
        .unwrap()
        .sample_error;
    let late_job = JobId(Uuid::new_v4());
    let payload = json!({"job_id": late_job, "tenant_id": Uuid::new_v4(), "correlation_id": "late",
        "payload": {"account_id": "partner-late", "points": 1}});
    let letter = shared_testkit::TestLetter {
        attempts: 2,
        last_error: sample.replace("partner-0", "partner-late"),
        correlation_id: Some("late".into()),
        ..shared_testkit::TestLetter::new(
            Some(late_job),
            &e2e::consumer_name(),
            &s.stack.jobs.name,
            &payload.to_string(),
        )
    };
    let late = shared_testkit::record_letter(&s.pool, &letter, chrono::Utc::now()).await;
    assert_eq!(
        shared::dead_letter::group_of_letter(&s.pool, late)
            .await
            .unwrap()
            .unwrap()
            .id,
        group,
        "the late letter is of the same group"
    );

    let prefix = operation.simple().to_string()[..8].to_owned();
    let followed = run_with_worker(
        &s,
        &s.reader.token,
        &["--json", "operation", &prefix, "--follow"],
    )
    .await;
    assert_eq!(
        followed.status, 0,
        "{}\n{}",
        followed.stdout, followed.stderr
    );
    let ended = followed.last_json();
    assert_eq!(
        (
            &ended["ending"],
            &ended["operation"]["id"],
            &ended["operation"]["progress"]["replayed"]
        ),
        (&json!("done"), &json!(operation), &json!(6)),
        "{ended:#}"
    );
    let status_of = |id: shared::ids::DeadLetterId| {
        let pool = s.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM core.dead_letters WHERE id = $1")
                .bind(id.0)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        status_of(late).await,
        "pending_review",
        "outside the operation"
    );
    each_applied_once(&s, &jobs).await;

    // Left running on purpose, then stopped: by whoever may start a discard, with a reason.
    let detached = run(
        &s,
        &token,
        &[
            "discard", "--group", &g, "--yes", "--reason", "wrong", "--detach",
        ],
    )
    .await;
    assert_eq!(
        detached.status, 0,
        "{}\n{}",
        detached.stdout, detached.stderr
    );
    let discard: Uuid =
        sqlx::query_scalar("SELECT id FROM core.dead_letter_operations WHERE action = 'discard'")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert!(
        detached
            .stdout
            .contains(&format!("dlq operation {discard} --follow")),
        "{}",
        detached.stdout
    );
    let listed = run(&s, &s.reader.token, &["operations"]).await;
    assert!(
        listed.stdout.contains(&discard.to_string())
            && listed.stdout.contains(&operation.to_string())
            && listed.stdout.contains("2 operation(s)"),
        "{}",
        listed.stdout
    );
    let id = discard.to_string();
    let reader = run(&s, &s.reader.token, &["cancel", &id, "--reason", "stop"]).await;
    assert_eq!(reader.status, 2, "{}", reader.stderr);
    assert!(
        reader.stderr.contains("may not cancel")
            && reader.stderr.contains("core.dead_letters.discard"),
        "{}",
        reader.stderr
    );
    let cancelled = run(&s, &token, &["cancel", &id, "--reason", "wrong group"]).await;
    assert_eq!(cancelled.status, 0, "{}", cancelled.stderr);
    assert!(
        cancelled
            .stdout
            .contains(&format!("Cancelled discard operation {discard}")),
        "{}",
        cancelled.stdout
    );
    let again = run(&s, &token, &["cancel", &id, "--reason", "again"]).await;
    assert_eq!(again.status, 2, "{}", again.stderr);
    assert!(
        again.stderr.contains("cancelled already") && again.stderr.contains("nothing changed"),
        "{}",
        again.stderr
    );
    let shown = run(&s, &s.reader.token, &["operation", &id]).await;
    assert!(
        shown
            .stdout
            .contains("cancelled     by dev-operator: wrong group"),
        "{}",
        shown.stdout
    );
    s.stack.work_operations().await.unwrap();
    assert_eq!(
        status_of(late).await,
        "pending_review",
        "cancelled before any worker came"
    );
}

/// `dlq edit` (issue 25), as on-call uses it: a poison letter (a producer wrote the points as
/// words) corrected in `$EDITOR` (a script here, as for git), its diff and the API's plan shown
/// by a dry run that changes nothing, then replayed under the same job: one effect, the letter
/// keeping what it received and the edit beside it. A token without the edit scope is refused
/// before the editor opens; a second edit is refused.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn dlq_edit_shows_the_diff_and_the_plan_then_replays_the_corrected_body_under_the_same_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let s = setup(pool_opts, connect).await;
    let job = JobId(Uuid::new_v4());
    let received = json!({"job_id": job, "tenant_id": TenantId(Uuid::new_v4()), "correlation_id": "edit",
        "payload": {"account_id": "acct-edit", "points": "seven"}});
    s.stack.send(&received.to_string()).await;
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
                .fetch_one(pool)
                .await
                .unwrap();
            letters == 1
        })
        .await;
    let id: Uuid = sqlx::query_scalar("SELECT id FROM core.dead_letters")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let (whole, prefix) = (id.to_string(), id.simple().to_string()[..8].to_owned());
    let edit = |token: &str, editor: &str, args: &[&str]| {
        let mut cmd = dlq(&s, token, args);
        cmd.env("EDITOR", editor).env_remove("VISUAL");
        cmd
    };
    let output = |out: std::process::Output| Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let before = e2e::api_client::fingerprint(&s.pool).await;
    // `false` as the editor: had it opened, the run would fail on it, not on the scope.
    let refused = output(
        edit(
            &s.reader.token,
            "false",
            &["edit", &whole, "--reason", "x", "--yes"],
        )
        .output()
        .await
        .unwrap(),
    );
    assert_eq!(refused.status, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("may not edit")
            && refused.stderr.contains("core.dead_letters.edit"),
        "{}",
        refused.stderr
    );
    let fix = r#"sed -i 's/"seven"/7/'"#;
    let token = s.operator.token.clone();
    let dry = output(
        edit(&token, fix, &["edit", &prefix, "--dry-run"])
            .output()
            .await
            .unwrap(),
    );
    assert_eq!(dry.status, 0, "{}\n{}", dry.stdout, dry.stderr);
    for line in [
        "-    \"points\": \"seven\"",
        "+    \"points\": 7",
        "Plan: replay letter",
        "would send the edited body",
        "Dry run: nothing was recorded or sent.",
    ] {
        assert!(dry.stdout.contains(line), "{line:?} in:\n{}", dry.stdout);
    }
    println!("{}", dry.stdout);
    // Without a terminal, a run without --yes asks no one and sends nothing.
    let unasked = output(
        edit(
            &token,
            fix,
            &["edit", &whole, "--reason", "points as words"],
        )
        .output()
        .await
        .unwrap(),
    );
    assert_eq!(unasked.status, 2, "{}", unasked.stderr);
    assert_eq!(
        e2e::api_client::fingerprint(&s.pool).await,
        before,
        "nothing changed yet"
    );
    let reason = "producer 4.2 wrote points as words";
    let done = output(
        edit(&token, fix, &["edit", &whole, "--reason", reason, "--yes"])
            .output()
            .await
            .unwrap(),
    );
    assert_eq!(done.status, 0, "{}\n{}", done.stdout, done.stderr);
    assert!(done.stdout.contains("sent"), "{}", done.stdout);
    each_applied_once(&s, &[job]).await;
    let shown = run(&s, &token, &["--json", "show", &whole])
        .await
        .last_json();
    let mut edited = received.clone();
    edited["payload"]["points"] = json!(7);
    assert_eq!(
        (
            &shown["letter"]["payload"],
            &shown["letter"]["replay_body"],
            &shown["letter"]["replay_reason"]
        ),
        (&received, &edited, &json!(reason)),
        "the letter keeps what it received, the edit beside it"
    );
    let again = output(
        edit(&token, fix, &["edit", &whole, "--reason", reason, "--yes"])
            .output()
            .await
            .unwrap(),
    );
    assert_eq!(again.status, 2, "{}", again.stderr);
    assert!(again.stderr.contains("replayed"), "{}", again.stderr);
}

/// Text a producer wrote reaches the operator's terminal inert: a poison message whose
/// correlation id and payload carry escape sequences (clear the screen, set the window title,
/// a C1 CSI, a right-to-left override) is listed, shown, grouped and printed as JSON by the
/// real `dlq` binary with every such character escaped, never sent to the terminal; the JSON
/// still reads back as the letter's own text.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letters_escape_sequences_are_shown_to_the_operator_never_sent_to_the_terminal(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let s = setup(pool_opts, connect).await;
    let hostile = "INC\u{1b}[2J\u{1b}]0;all clear\u{7}\u{9b}31m\u{202e}gpj.exe\r\u{8}";
    let body = json!({"job_id": Uuid::new_v4(), "tenant_id": Uuid::new_v4(), "correlation_id": hostile,
        "payload": {"account_id": hostile, "points": hostile}});
    s.stack.send(&body.to_string()).await;
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
                .fetch_one(pool)
                .await
                .unwrap();
            letters == 1
        })
        .await;
    let (id, group): (Uuid, i64) = sqlx::query_as("SELECT id, group_id FROM core.dead_letters")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let inert = |c: char| c == '\n' || !(c.is_control() || c == '\u{202e}');
    for args in [
        vec!["list".to_string()],
        vec!["show".into(), id.to_string()],
        vec!["groups".into()],
        vec!["group".into(), group.to_string()],
        vec!["--json".into(), "show".into(), id.to_string()],
        vec!["--json".into(), "list".into()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&s, &s.reader.token, &args).await;
        assert_eq!(out.status, 0, "dlq {args:?}: {}", out.stderr);
        let sent: Vec<char> = out.stdout.chars().filter(|c| !inert(*c)).collect();
        assert!(
            sent.is_empty(),
            "dlq {args:?} sent {sent:?} to the terminal:\n{}",
            out.stdout
        );
        if args[0] == "--json" {
            assert!(
                out.stdout.contains("\\u001b[2J"),
                "dlq {args:?}: {}",
                out.stdout
            );
            let read: Value = serde_json::from_str(out.stdout.trim()).unwrap();
            let letter = if args[1] == "show" {
                &read["letter"]
            } else {
                &read[0]
            };
            assert_eq!(letter["correlation_id"], hostile, "the same text, escaped");
        } else if args[0] == "show" {
            assert!(
                out.stdout.contains("\\u{1b}[2J"),
                "dlq {args:?}: {}",
                out.stdout
            );
        }
    }
    // The letter by the first digits of its id, as git takes a commit's; too few, or none
    // matching, said plainly.
    let whole = id.to_string();
    let short = run(&s, &s.reader.token, &["--json", "show", &whole[..8]]).await;
    assert_eq!(short.status, 0, "{}", short.stderr);
    assert_eq!(short.last_json()["letter"]["id"], whole.as_str());
    let too_short = run(&s, &s.reader.token, &["show", &whole[..3]]).await;
    assert_eq!(too_short.status, 2, "{}", too_short.stderr);
    assert!(
        too_short.stderr.contains("at least its first 4 hex digits"),
        "{}",
        too_short.stderr
    );
    let other = if whole.starts_with('0') {
        "1111"
    } else {
        "0000"
    };
    let none = run(&s, &s.reader.token, &["show", other]).await;
    assert_ne!(none.status, 0);
    assert!(
        none.stderr.contains("no letter's id starts with"),
        "{}",
        none.stderr
    );
    // The API's refusal names the flag the operator typed, not the API's parameter.
    let bad = run(&s, &s.reader.token, &["list", "--kind", "boom"]).await;
    assert_ne!(bad.status, 0);
    assert!(
        bad.stderr.contains("--kind must be one of") && !bad.stderr.contains("error_kind"),
        "{}",
        bad.stderr
    );
}

/// `bash scripts/stack.sh up`'s process: it migrates, serves the API over HTTP with its
/// development tokens (written to stack.env), feeds the consumers, works the bulk operations
/// `dlq` starts, and stops on SIGTERM.
#[sqlx::test(migrations = false)]
async fn the_local_stack_serves_the_api_over_http_with_its_development_tokens(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let dir = std::env::temp_dir().join(format!("local-stack-{}", Uuid::new_v4().simple()));
    let queue = format!("local-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_local-stack"))
        .env("DATABASE_URL", e2e::test_database_url(&connect))
        .env("LOCAL_STACK_DIR", &dir)
        .env("GATEWAY_ADDR", "127.0.0.1:0")
        .env("LOCAL_QUEUE_NAME", &queue)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let env_file = dir.join("stack.env");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !env_file.exists() {
        assert!(tokio::time::Instant::now() < deadline, "no stack.env");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let vars: std::collections::HashMap<String, String> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect();
    let sqs = e2e::event_source::sqs_client().await;
    sqs.send_message()
        .queue_url(&vars["AWARD_POINTS_QUEUE_URL"])
        .message_body("not an envelope")
        .send()
        .await
        .unwrap();
    let list = |token: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_local-dlq"))
            .args(["--json", "list", "--queue", &queue])
            .env("DLQ_API_URL", &vars["DLQ_API_URL"])
            .env("DLQ_TOKEN", token)
            .output()
            .unwrap()
    };
    loop {
        let out = list(&vars["DLQ_READ_TOKEN"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let letters: Value = serde_json::from_slice(&out.stdout).unwrap();
        if letters.as_array().unwrap().len() == 1 {
            assert_eq!(letters[0]["error_kind"], "poison");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no letter: {letters}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stranger = list("not-a-token");
    assert_eq!(stranger.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&stranger.stderr).contains("401"));
    // A bulk operation started against it is worked by its operations round, while dlq follows.
    let discard = std::process::Command::new(env!("CARGO_BIN_EXE_local-dlq"))
        .args(["discard", "--queue", &queue, "--yes", "--progress", "none"])
        .args(["--reason", "local stack: a poison message of the test"])
        .env("DLQ_API_URL", &vars["DLQ_API_URL"])
        .env("DLQ_TOKEN", &vars["DLQ_TOKEN"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&discard.stdout);
    assert!(
        discard.status.success() && said.contains("Done: discard operation"),
        "{said}\n{}",
        String::from_utf8_lossy(&discard.stderr)
    );
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(child.wait().await.unwrap().success());
    assert!(!env_file.exists(), "stack.env goes with the stack");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 22, item 7: `dlq replay --rate 1e-20` passed the tool's check and panicked when the
/// run began. The real binary now refuses every number out of its bounds, an id that is none,
/// and a reason the API would refuse, before it asks the API anything: exit 2, a message naming
/// the flag, no panic. (A bulk command takes no rate any more: it starts one operation.)
#[test]
fn the_dlq_binary_refuses_a_number_out_of_bounds_with_a_message_not_a_panic() {
    let long = "x".repeat(1001);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "replay", "--group", "1", "--reason", "r", "--yes", "--rate", "1e-20",
            ],
            "--rate",
        ),
        (vec!["operation", "12"], "operation id"),
        (vec!["cancel", "not-an-id", "--reason", "r"], "operation id"),
        (
            vec!["cancel", "481e82ee", "--reason", "\u{1b}[2J"],
            "--reason",
        ),
        (vec!["list", "--limit", "0"], "--limit"),
        (vec!["list", "--limit", "18446744073709551616"], "--limit"),
        (vec!["groups", "--limit", "201"], "--limit"),
        (vec!["group", "0"], "<ID>"),
        (vec!["list", "--group", "9223372036854775808"], "--group"),
        (
            vec![
                "replay",
                "--group",
                "1",
                "--reason",
                "\u{1}\u{2}\u{3}\u{7}",
                "--yes",
            ],
            "--reason",
        ),
        (
            vec!["discard", "--group", "1", "--reason", &long, "--yes"],
            "--reason",
        ),
        (
            vec![
                "replay",
                "--queue",
                "q",
                "--before",
                "+275760-09-13T00:00:00Z",
                "--dry-run",
            ],
            "--before",
        ),
    ];
    for (args, flag) in cases {
        let started = std::time::Instant::now();
        // A refusal must come before any request.
        let out = dlq_with_no_api(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: names {flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?}: refused at once, not after retries"
        );
    }
}

/// An API that does not answer is named at once, with why (the connection refused), before the
/// retries, and again in the error they end with; not a bare "error sending request".
#[test]
fn an_api_that_does_not_answer_is_named_at_once_with_the_cause() {
    let out = dlq_with_no_api(&["list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.first().is_some_and(
            |l| l.starts_with("dlq: no answer from http://127.0.0.1:9 (")
                && l.to_lowercase().contains("connection refused")
                && l.contains("more time(s)")
        ),
        "the first line says what failed and where: {stderr}"
    );
    assert!(
        lines.last().is_some_and(|l| l.contains("tries") && l.to_lowercase().contains("connection refused")),
        "the last line keeps the cause: {stderr}"
    );
}

/// The `dlq` binary run with `args` against an address where nothing listens.
fn dlq_with_no_api(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_local-dlq"))
        .args(args)
        .env("DLQ_API_URL", "http://127.0.0.1:9")
        .env("DLQ_TOKEN", "unused")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("dlq runs")
}

/// Issue 34, item 7: `dlq edit` opened the stored `jsonb` payload (keys reordered, numbers
/// rewritten) in a file of a predictable name in the shared temporary directory. The editor now
/// starts from the body as received, key for key and number for number, in a file made new
/// with a name no one can guess, readable by its owner only, and gone afterwards.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn dlq_edit_starts_from_the_body_as_received_in_a_private_file(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let s = setup(pool_opts, connect).await;
    let (job, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    // Payload first, a version written 1.50: jsonb would put job_id first and write 1.50 as 1.5.
    let received = format!(
        r#"{{"payload":{{"points":"seven","account_id":"acct-own"}},"version":1.50,"job_id":"{job}","tenant_id":"{tenant}","correlation_id":"edit"}}"#
    );
    s.stack.send(&received).await;
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM core.dead_letters")
                .fetch_one(pool)
                .await
                .unwrap();
            letters == 1
        })
        .await;
    let id: Uuid = sqlx::query_scalar("SELECT id FROM core.dead_letters")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let seen = tempfile::tempdir().unwrap();
    let script = seen.path().join("editor.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nstat -c %a \"$1\" > {dir}/mode\necho \"$1\" > {dir}/path\ncp \"$1\" {dir}/seen\nsed -i 's/\"seven\"/7/' \"$1\"\n",
            dir = seen.path().display()
        ),
    )
    .unwrap();
    let mut cmd = dlq(
        &s,
        &s.operator.token,
        &[
            "edit",
            &id.to_string(),
            "--reason",
            "points as a number",
            "--yes",
        ],
    );
    cmd.env("EDITOR", format!("sh {}", script.display()))
        .env_remove("VISUAL");
    let out = cmd.output().await.unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = std::fs::read_to_string(seen.path().join("seen")).unwrap();
    assert!(shown.contains("\"version\": 1.50"), "{shown}");
    let (payload, job_line) = (
        shown.find("\"payload\"").unwrap(),
        shown.find("\"job_id\"").unwrap(),
    );
    assert!(
        payload < job_line,
        "the keys in the order received:\n{shown}"
    );
    let mode = std::fs::read_to_string(seen.path().join("mode")).unwrap();
    assert_eq!(mode.trim(), "600", "the working file is its owner's only");
    let path = std::fs::read_to_string(seen.path().join("path")).unwrap();
    let path = std::path::Path::new(path.trim());
    assert_ne!(
        path,
        std::env::temp_dir().join(format!("dlq-edit-{id}.json")),
        "no predictable name"
    );
    assert!(!path.exists(), "removed afterwards");
    let pool = &s.pool;
    s.stack
        .run_until(SETTLE, || async move {
            consumer::count_awards(pool, shared::ids::JobId(job))
                .await
                .unwrap()
                == 1
        })
        .await;
}
