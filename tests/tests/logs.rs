//! The logs on-call searches, as the real binaries write them under Lambda's advanced logging
//! controls: at `AWS_LAMBDA_LOG_LEVEL=WARN` every line about a record still carries its ids
//! (issue 26), the function's configured level wins over `RUST_LOG`, and `AWS_LAMBDA_LOG_FORMAT`
//! picks JSON or text.

use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::harness::CommitMode;
use shared::ids::{JobId, TenantId};
use shared_testkit::envelope;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(60);

/// One job a test sends, and what its lines must carry.
struct Sent {
    message_id: String,
    job_id: Option<JobId>,
    correlation_id: Option<&'static str>,
}

/// A stack whose functions all log at `level` in `format` (and `RUST_LOG=debug`, which the
/// configured level must beat), into a directory of the test's own.
async fn stack_logging(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    level: &str,
    format: &str,
    mode: CommitMode,
) -> (PgPool, Stack, PathBuf) {
    let logs = e2e::log_dir();
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.function_env = vec![
            ("AWS_LAMBDA_LOG_LEVEL".into(), level.into()),
            ("AWS_LAMBDA_LOG_FORMAT".into(), format.into()),
            ("RUST_LOG".into(), "debug".into()),
        ];
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
        spec.log_dir = Some(logs.clone());
    })
    .await;
    (pool, stack, logs)
}

/// Sends the jobs whose lines on-call looks for: a poison payload, a permanent failure and a
/// body that is not JSON to the job queue, and a job straight to the DLQ (the ingester's
/// backstop letter). Runs the stack until each has its letter.
async fn send_failures(pool: &PgPool, stack: &Stack) -> Vec<Sent> {
    let tenant = TenantId(Uuid::new_v4());
    let poison = JobId(Uuid::new_v4());
    let permanent = JobId(Uuid::new_v4());
    let backstop = JobId(Uuid::new_v4());
    let mut sent = vec![
        Sent {
            message_id: stack
                .send(&envelope(
                    poison,
                    tenant,
                    "c-poison",
                    json!({"account_id": "a", "points": "five"}),
                ))
                .await,
            job_id: Some(poison),
            correlation_id: Some("c-poison"),
        },
        Sent {
            message_id: stack
                .send(&envelope(
                    permanent,
                    tenant,
                    "c-permanent",
                    json!({"account_id": "a", "points": 5, "demo_fault": "permanent"}),
                ))
                .await,
            job_id: Some(permanent),
            correlation_id: Some("c-permanent"),
        },
        Sent {
            message_id: stack.send("not json {").await,
            job_id: None,
            correlation_id: None,
        },
    ];
    let to_dlq = stack
        .sqs
        .send_message()
        .queue_url(&stack.dlq.url)
        .message_body(envelope(
            backstop,
            tenant,
            "c-backstop",
            json!({"account_id": "a", "points": 5}),
        ))
        .send()
        .await
        .expect("SendMessage to the DLQ");
    sent.push(Sent {
        message_id: to_dlq.message_id.expect("message id"),
        job_id: Some(backstop),
        correlation_id: Some("c-backstop"),
    });
    stack
        .run_until(SETTLE, || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM core.dead_letters")
                .fetch_one(pool)
                .await
                .unwrap()
                == 4
        })
        .await;
    sent
}

fn lines(logs: &Path, function: &str) -> Vec<String> {
    std::fs::read_to_string(logs.join(format!("{function}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The JSON lines of `function`'s log; every line must be one.
fn json_lines(logs: &Path, function: &str) -> Vec<Value> {
    lines(logs, function)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// Every letter's line (`dead-lettered` from the consumer, `backstop dead letter` from the
/// ingester) carries the message id and the ids its body had, and nothing below WARN is
/// written although `RUST_LOG` asks for debug.
async fn every_line_about_a_record_carries_its_ids_at_warn(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack, logs) = stack_logging(pool_opts, connect, "WARN", "JSON", mode).await;
    let sent = send_failures(&pool, &stack).await;
    let mut all = json_lines(&logs, "consumer");
    all.extend(json_lines(&logs, "dlq-ingester"));
    for line in &all {
        assert!(
            matches!(line["level"].as_str(), Some("WARN" | "ERROR")),
            "AWS_LAMBDA_LOG_LEVEL=WARN wins over RUST_LOG=debug: {line}"
        );
    }
    for job in &sent {
        let about: Vec<&Value> = all
            .iter()
            .filter(|l| l["span"]["message_id"] == job.message_id.as_str())
            .collect();
        let letter_line = about.iter().find(|l| {
            matches!(
                l["fields"]["message"].as_str(),
                Some("dead-lettered" | "backstop dead letter")
            )
        });
        let line = letter_line.unwrap_or_else(|| {
            panic!(
                "no letter line carries message {}; lines: {all:#?}",
                job.message_id
            )
        });
        let span = &line["span"];
        assert_eq!(span["name"], "job", "{line}");
        assert_eq!(span["consumer"], stack.consumer_name.as_str(), "{line}");
        match job.job_id {
            Some(job_id) => {
                assert_eq!(span["job_id"], job_id.to_string(), "{line}");
                assert_eq!(
                    span["correlation_id"],
                    job.correlation_id.unwrap(),
                    "{line}"
                );
                assert!(span["tenant_id"].is_string(), "{line}");
            }
            None => assert!(span.get("job_id").is_none(), "no id to carry: {line}"),
        }
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn at_warn_every_line_about_a_record_carries_its_ids_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    every_line_about_a_record_carries_its_ids_at_warn(pool_opts, connect, CommitMode::PerJob).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn at_warn_every_line_about_a_record_carries_its_ids_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    every_line_about_a_record_carries_its_ids_at_warn(pool_opts, connect, CommitMode::Batch).await
}

/// `AWS_LAMBDA_LOG_FORMAT=Text`: plain lines, the ids in the span's prefix.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_text_log_format_writes_text_lines_with_the_same_ids(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, logs) =
        stack_logging(pool_opts, connect, "WARN", "Text", CommitMode::PerJob).await;
    let sent = send_failures(&pool, &stack).await;
    let consumer = lines(&logs, "consumer");
    assert!(!consumer.is_empty());
    for line in &consumer {
        assert!(
            serde_json::from_str::<Value>(line).is_err(),
            "text, not JSON: {line}"
        );
        assert!(
            line.contains(" WARN ") || line.contains(" ERROR "),
            "{line}"
        );
    }
    let permanent = &sent[1];
    let line = consumer
        .iter()
        .find(|l| l.contains("dead-lettered") && l.contains(&permanent.message_id))
        .unwrap_or_else(|| panic!("no dead-lettered line for the permanent job: {consumer:#?}"));
    assert!(
        line.contains(&format!("job_id={}", permanent.job_id.unwrap()))
            && line.contains("correlation_id=\"c-permanent\""),
        "{line}"
    );
}

/// An `AWS_LAMBDA_LOG_FORMAT` Lambda would never set stops the function at start, naming it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_unknown_log_format_stops_the_function_at_start_naming_the_variable(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = e2e::log_dir();
    let (_pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.function_env = vec![("AWS_LAMBDA_LOG_FORMAT".into(), "yaml".into())];
        spec.log_dir = Some(logs.clone());
    })
    .await;
    let log = e2e::refused_start_log(&stack, &logs).await;
    assert!(
        log.contains("AWS_LAMBDA_LOG_FORMAT: \"yaml\" is not a log format"),
        "{log}"
    );
}
