//! The consumer author's dev loop (issue 26), behind `bash scripts/dev.sh`:
//!
//! - `dev prepare <consumer>` migrates the dev database as a deploy does (core, then each
//!   consumer's schema), creates the consumer's dev queue and its DLQ on the local SQS API, and
//!   prints the environment `cargo lambda watch` runs the consumer with;
//! - `dev send <consumer> <valid|duplicate|poison|failing|all>` sends jobs to that queue, feeds
//!   them to the consumer `cargo lambda watch` serves as Lambda's event source would (real
//!   receipt handles, so a retry's visibility change and the ack work), until each job is settled,
//!   and says what became of each: its fence, its letter, and its effect (rows added to the
//!   consumer's tables).

use crate::event_source::{EventSource, WatchedFunction, create_queue_pair, depth};
use migrate::consumers::{CONSUMERS, ConsumerCrate};
use serde_json::{Value, json};
use shared::ids::{JobId, TenantId};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;
use uuid::Uuid;

/// The attempts of the dev loop's retry policy: the platform's 5, at base 1 s, so a job that
/// keeps failing transiently is lettered within about 15 s.
const DEV_RETRY_BASE_SECONDS: u64 = 1;

/// The consumer a command names: by its `name`, its package or its binary.
pub fn find(consumer: &str) -> Result<&'static ConsumerCrate, String> {
    CONSUMERS
        .iter()
        .find(|c| [c.name, c.package, c.binary].contains(&consumer))
        .ok_or_else(|| {
            let known: Vec<&str> = CONSUMERS.iter().map(|c| c.name).collect();
            format!(
                "no consumer {consumer:?} in this workspace (known: {}); a consumer is a member \
                 with [package.metadata.job-consumer] (docs/consumers.md)",
                known.join(", ")
            )
        })
}

/// The consumer's dev queue (its DLQ is `<name>-dlq`).
pub fn queue_name(consumer: &ConsumerCrate) -> String {
    format!("dev-{}-jobs", consumer.name)
}

/// The executions the consumer's dev policy allows (its own `RETRY_MAX_ATTEMPTS`, else 5).
fn attempts(consumer: &ConsumerCrate) -> u32 {
    consumer
        .local_env
        .iter()
        .find(|(k, _)| *k == "RETRY_MAX_ATTEMPTS")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(shared::retry::RetryPolicy::default().max_attempts())
}

/// The consumer's dev queue and its DLQ (created, or found as they are): a visibility timeout
/// longer than a rebuild, the redrive at its attempts + 2.
async fn dev_queues(
    sqs: &aws_sdk_sqs::Client,
    consumer: &ConsumerCrate,
) -> (crate::event_source::Queue, crate::event_source::Queue) {
    create_queue_pair(
        sqs,
        &queue_name(consumer),
        Duration::from_secs(30),
        attempts(consumer) + 2,
    )
    .await
}

/// Migrates `database_url` and creates the consumer's dev queues; returns the environment its
/// function runs with under `cargo lambda watch`, as `KEY=value` pairs.
pub async fn prepare(
    database_url: &str,
    consumer: &ConsumerCrate,
) -> Result<Vec<(String, String)>, String> {
    crate::demo::migrate(database_url).await?;
    let sqs = sqs_client().await?;
    let redrive = attempts(consumer) + 2;
    let (jobs, _dlq) = dev_queues(&sqs, consumer).await;
    let mut env: Vec<(String, String)> = [
        ("DATABASE_URL", database_url.to_owned()),
        ("CONSUMER_NAME", consumer.name.to_owned()),
        ("ALERTING_DISABLED", "true".to_owned()),
        ("REDRIVE_MAX_RECEIVE_COUNT", redrive.to_string()),
        ("RETRY_BASE_SECONDS", DEV_RETRY_BASE_SECONDS.to_string()),
        ("RETRY_CAP_SECONDS", "60".to_owned()),
        (
            "RETRY_OVERRIDE_RATIONALE",
            "dev loop: the policy's shape at base 1 s".to_owned(),
        ),
        ("DEV_QUEUE_URL", jobs.url),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec();
    for (k, v) in consumer.local_env {
        env.retain(|(key, _)| key != k);
        env.push(((*k).to_owned(), (*v).to_owned()));
    }
    Ok(env)
}

async fn sqs_client() -> Result<aws_sdk_sqs::Client, String> {
    if std::env::var_os("AWS_ENDPOINT_URL_SQS").is_none() {
        return Err(
            "AWS_ENDPOINT_URL_SQS is not set: run this through bash scripts/dev.sh, which \
                    starts the local SQS API"
                .into(),
        );
    }
    Ok(aws_sdk_sqs::Client::new(&aws_config::load_from_env().await))
}

/// What `send` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A job with the consumer's `dev-payload`: processed, one fence, one effect.
    Valid,
    /// The same job sent twice: processed once, the copy acked as a duplicate.
    Duplicate,
    /// An envelope whose payload is not the consumer's type: a poison letter, never run.
    Poison,
    /// A job with the consumer's `dev-failing-payload`: what its handler does with it.
    Failing,
    /// Each of the above.
    All,
}

/// One job sent, and what became of it.
#[derive(Debug, Clone)]
pub struct Sent {
    /// What was sent.
    pub kind: Kind,
    /// Its job id.
    pub job_id: JobId,
    /// Its SQS message ids (two for a duplicate).
    pub message_ids: Vec<String>,
}

/// What the dev loop saw of one job once it settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The fence's `processed_at`, if the job committed.
    pub fence: Option<String>,
    /// Its letters: (id, kind, attempts, last error).
    pub letters: Vec<(Uuid, String, i32, String)>,
}

/// Sends `kind` to the consumer's dev queue, feeds the function `watch` serves at `watch_addr`
/// until every job sent has a fence or a letter and the queue is empty (or `timeout`), and
/// returns the report as text, and whether every job settled.
pub async fn send(
    database_url: &str,
    consumer: &ConsumerCrate,
    kind: Kind,
    payload: Option<Value>,
    watch_addr: &str,
    timeout: Duration,
) -> Result<(String, bool), String> {
    let pool = PgPool::connect(database_url)
        .await
        .map_err(|e| format!("cannot connect to DATABASE_URL: {e}"))?;
    let sqs = sqs_client().await?;
    let (jobs, dlq) = dev_queues(&sqs, consumer).await;
    let before = table_rows(&pool, consumer.schema).await?;
    let mut out = String::new();
    let left = depth(&sqs, &jobs).await;
    if left > 0 {
        let _ = writeln!(
            out,
            "note: {left} message(s) were already on {} (left by an earlier send that did not \
             settle): they are delivered too, and counted in the invocations below, not in the \
             jobs reported",
            jobs.url
        );
    }
    let kinds = match kind {
        Kind::All => vec![Kind::Valid, Kind::Duplicate, Kind::Poison, Kind::Failing],
        one => vec![one],
    };
    let mut sent = Vec::new();
    for kind in kinds {
        let job_id = JobId(Uuid::new_v4());
        let body = body(consumer, kind, job_id, payload.clone())?;
        let copies = if kind == Kind::Duplicate { 2 } else { 1 };
        let mut message_ids = Vec::new();
        for _ in 0..copies {
            let sent = sqs
                .send_message()
                .queue_url(&jobs.url)
                .message_body(&body)
                .send()
                .await
                .map_err(|e| format!("SendMessage to {}: {e}", jobs.url))?;
            message_ids.push(sent.message_id.unwrap_or_default());
        }
        let _ = writeln!(
            out,
            "sent {:<9} job {job_id}  {} message(s)  {body}",
            format!("{kind:?}").to_lowercase(),
            copies
        );
        sent.push(Sent {
            kind,
            job_id,
            message_ids,
        });
    }
    let function = WatchedFunction::new(watch_addr, consumer.binary);
    let source = EventSource {
        sqs: &sqs,
        queue: &jobs,
        function: &function,
        batch_size: 10,
        delete_loss: 0.0,
    };
    let started = tokio::time::Instant::now();
    let mut settled = false;
    while let Some(remaining) = timeout.checked_sub(started.elapsed()) {
        // Bounded as a whole: a first build under cargo lambda watch can take minutes, and the
        // report says what happened within the time it promised.
        let Ok(report) = tokio::time::timeout(remaining, source.poll_once()).await else {
            break;
        };
        if report.received == 0
            && let Some(error) = &report.invoke_error
        {
            let _ = writeln!(out, "could not receive from {}: {error}", jobs.url);
            break;
        }
        if report.received > 0 {
            let _ = writeln!(
                out,
                "invoked {} with {} record(s): {} acked, {} back on the queue{}",
                consumer.binary,
                report.received,
                report.deleted,
                report.left,
                report
                    .invoke_error
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            );
        }
        if all_settled(&pool, consumer, &sent).await? && depth(&sqs, &jobs).await == 0 {
            settled = true;
            break;
        }
    }
    let after = table_rows(&pool, consumer.schema).await?;
    for job in &sent {
        let seen = settled_of(&pool, consumer, job.job_id).await?;
        let _ = writeln!(out, "\n{:?} job {}:", job.kind, job.job_id);
        match &seen.fence {
            Some(at) => {
                let _ = writeln!(out, "  fence:  processed at {at}");
            }
            None => {
                let _ = writeln!(out, "  fence:  none (the job did not commit)");
            }
        }
        if job.kind == Kind::Duplicate && seen.fence.is_some() {
            let _ = writeln!(
                out,
                "  copies: {} messages, one fence: the later copy was acked as a duplicate",
                job.message_ids.len()
            );
        }
        for (id, kind, attempts, error) in &seen.letters {
            let _ = writeln!(
                out,
                "  letter: {id}  {kind}, {attempts} attempt(s): {error}\n          \
                 dlq show {id}   (with bash scripts/stack.sh up: the API over this database)"
            );
        }
        if seen.letters.is_empty() {
            let _ = writeln!(out, "  letter: none");
        }
    }
    let _ = writeln!(out, "\neffect in schema {}:", consumer.schema);
    let mut changed = false;
    for (table, rows) in &after {
        let was = before.get(table).copied().unwrap_or(0);
        if *rows != was {
            changed = true;
            let _ = writeln!(out, "  {table}: {was} → {rows} rows ({:+})", rows - was);
        }
    }
    if !changed {
        let _ = writeln!(out, "  no table changed");
    }
    if !settled {
        let _ = writeln!(
            out,
            "\nnot settled within {timeout:?}: is `bash scripts/dev.sh {}` running (cargo lambda \
             watch on {watch_addr})? Messages left: {} on the queue, {} on its DLQ",
            consumer.name,
            depth(&sqs, &jobs).await,
            depth(&sqs, &dlq).await
        );
    }
    pool.close().await;
    Ok((out, settled))
}

/// The body sent for `kind`.
fn body(
    consumer: &ConsumerCrate,
    kind: Kind,
    job_id: JobId,
    payload: Option<Value>,
) -> Result<String, String> {
    let configured = |key: &str, value: Option<&str>| -> Result<Value, String> {
        match (payload.clone(), value) {
            (Some(p), _) => Ok(p),
            // "{job_id}" in the configured payload becomes this job's id (a unique code).
            (None, Some(json)) => {
                serde_json::from_str(&json.replace("{job_id}", &job_id.to_string()))
                    .map_err(|e| format!("{key} of {}: {e}", consumer.name))
            }
            (None, None) => Err(format!(
                "{} has no {key} in its [package.metadata.job-consumer]: add one, or give \
                 --payload '<json>'",
                consumer.name
            )),
        }
    };
    let payload = match kind {
        Kind::Valid | Kind::Duplicate => configured("dev-payload", consumer.dev_payload)?,
        Kind::Failing => configured("dev-failing-payload", consumer.dev_failing_payload)?,
        // A string where every consumer's payload is an object: it cannot parse.
        Kind::Poison => json!("dev loop: not a payload"),
        Kind::All => unreachable!("split before"),
    };
    let correlation = format!("dev-{}", format!("{kind:?}").to_lowercase());
    let tenant = TenantId(Uuid::from_u128(1));
    Ok(shared_testkit::envelope(
        job_id,
        tenant,
        &correlation,
        payload,
    ))
}

async fn all_settled(
    pool: &PgPool,
    consumer: &ConsumerCrate,
    sent: &[Sent],
) -> Result<bool, String> {
    for job in sent {
        let seen = settled_of(pool, consumer, job.job_id).await?;
        if seen.fence.is_none() && seen.letters.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The job's fence and letters.
pub async fn settled_of(
    pool: &PgPool,
    consumer: &ConsumerCrate,
    job_id: JobId,
) -> Result<Settled, String> {
    let fence: Option<String> = sqlx::query_scalar(
        "SELECT processed_at::text FROM core.processed_jobs WHERE job_id = $1 AND consumer = $2",
    )
    .bind(job_id.0)
    .bind(consumer.name)
    .fetch_optional(pool)
    .await
    .map_err(|e| e.to_string())?;
    let letters: Vec<(Uuid, String, i32, String)> = sqlx::query_as(
        "SELECT id, error_kind::text, attempts, last_error FROM core.dead_letters
          WHERE job_id = $1 AND consumer = $2 ORDER BY created_at",
    )
    .bind(job_id.0)
    .bind(consumer.name)
    .fetch_all(pool)
    .await
    .map_err(|e| e.to_string())?;
    Ok(Settled { fence, letters })
}

/// Rows in each table of `schema` (its migrations' table left out), counted in one statement.
async fn table_rows(pool: &PgPool, schema: &str) -> Result<BTreeMap<String, i64>, String> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT format('%I.%I', schemaname, tablename),
                (xpath('/row/n/text()', query_to_xml(
                    format('SELECT count(*) AS n FROM %I.%I', schemaname, tablename),
                    false, true, '')))[1]::text::bigint
           FROM pg_tables
          WHERE schemaname = $1 AND tablename <> '_sqlx_migrations'",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().collect())
}

/// Shell `export` lines for `env` (single-quoted).
pub fn exports(env: &[(String, String)]) -> String {
    env.iter()
        .map(|(k, v)| format!("export {k}='{}'\n", v.replace('\'', r"'\''")))
        .collect()
}
