//! Traces on OpenTelemetry, through the real binaries (issue 37): with `TRACING=Active` each
//! function exports its spans over OTLP/HTTP to the collector endpoint it is given; here that is
//! an OTLP receiver of the test's own, decoding the protobuf the exporter sends. Each job is one
//! span (kind consumer) with OpenTelemetry's messaging attributes, our ids, its outcome and
//! attempt, and a link to the trace its message carried; each database statement a client span
//! of its job (or of the commit group it committed in); the invocation span is a child of the
//! trace Lambda gave the invocation. Spans are exported before the runtime asks for the next
//! invocation; nothing is exported with tracing off; a process that dies mid-job exports no
//! span of it.

use e2e::otlp_receiver::{OtlpReceiver, Received};
use e2e::stack::Stack;
use serde_json::json;
use shared::harness::CommitMode;
use shared::ids::{JobId, TenantId};
use shared_testkit::envelope;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(60);
/// A value only the payload carries: no span may show it.
const ACCOUNT: &str = "acct-never-in-a-span";
/// OTLP's span kinds.
const CONSUMER: i32 = 5;
const CLIENT: i32 = 3;

/// A stack whose functions export their spans (if `traced`) to a receiver of its own.
async fn traced_stack(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    traced: bool,
    mode: CommitMode,
) -> (PgPool, Stack, OtlpReceiver) {
    let receiver = OtlpReceiver::start().await;
    let url = receiver.url.clone();
    let (pool, stack) = e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.function_env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT".into(), url.clone())];
        if traced {
            spec.function_env.push(("TRACING".into(), "Active".into()));
        }
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
    })
    .await;
    (pool, stack, receiver)
}

/// A job sent with a `traceparent` message attribute of a producer's span of its own.
struct Sent {
    job: JobId,
    message_id: String,
    /// The producer's (trace id, span id).
    producer: (String, String),
}

async fn send_traced(stack: &Stack, body: &str) -> (String, (String, String)) {
    let (trace, span) = (
        Uuid::new_v4().simple().to_string(),
        Uuid::new_v4().simple().to_string()[..16].to_owned(),
    );
    let traceparent = format!("00-{trace}-{span}-01");
    let attribute = aws_sdk_sqs::types::MessageAttributeValue::builder()
        .data_type("String")
        .string_value(traceparent)
        .build()
        .unwrap();
    let out = stack
        .sqs
        .send_message()
        .queue_url(&stack.jobs.url)
        .message_body(body)
        .message_attributes("traceparent", attribute)
        .send()
        .await
        .expect("SendMessage");
    (out.message_id.unwrap(), (trace, span))
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Three valid jobs and a poison one, sent together (a batch, so batch mode commits the valid
/// ones as a group), run until they are fenced and lettered.
async fn send_jobs(pool: &PgPool, stack: &Stack) -> (Vec<Sent>, Sent) {
    let tenant = TenantId(Uuid::new_v4());
    let mut valid = Vec::new();
    for n in 1..=3 {
        let job = JobId(Uuid::new_v4());
        let body = envelope(
            job,
            tenant,
            "c-traced",
            json!({"account_id": ACCOUNT, "points": n}),
        );
        let (message_id, producer) = send_traced(stack, &body).await;
        valid.push(Sent {
            job,
            message_id,
            producer,
        });
    }
    let job = JobId(Uuid::new_v4());
    let body = envelope(
        job,
        tenant,
        "c-poison",
        json!({"account_id": ACCOUNT, "points": "five"}),
    );
    let (message_id, producer) = send_traced(stack, &body).await;
    let poison = Sent {
        job,
        message_id,
        producer,
    };
    stack
        .run_until(SETTLE, || async {
            count(pool, "SELECT count(*) FROM core.processed_jobs").await == 3
                && count(pool, "SELECT count(*) FROM core.dead_letters").await == 1
        })
        .await;
    (valid, poison)
}

/// The spans received once `wanted` holds of them (or after 10 s, for the assertions to say why).
async fn spans_when(
    receiver: &OtlpReceiver,
    wanted: impl Fn(&[Received]) -> bool,
) -> Vec<Received> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let spans = receiver.spans();
        if wanted(&spans) || tokio::time::Instant::now() > until {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job_spans<'a>(spans: &'a [Received], job: JobId, service: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| {
            s.name == "job" && s.service == service && s.attr("job_id") == Some(&*job.to_string())
        })
        .collect()
}

fn by_id<'a>(spans: &'a [Received], id: &str) -> Option<&'a Received> {
    spans.iter().find(|s| s.span_id == id)
}

async fn each_job_is_one_span_with_its_link_and_its_statements(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, true, mode).await;
    let (valid, poison) = send_jobs(&pool, &stack).await;
    // The consumer function's name in the stack (its resource's `service.name`).
    let service = "consumer";
    let all = [&valid[..], std::slice::from_ref(&poison)].concat_refs();
    let spans = spans_when(&receiver, |spans| {
        all.iter()
            .all(|s| job_spans(spans, s.job, service).len() == 1)
    })
    .await;
    let invocations: Vec<(String, String)> = stack
        .consumer
        .trace_headers()
        .iter()
        .map(|h| {
            let get = |key: &str| {
                h.split(';')
                    .find_map(|p| p.strip_prefix(key))
                    .unwrap()
                    .to_owned()
            };
            // Only the version's "1-": the epoch's hex may itself end in 1.
            let root = get("Root=")
                .strip_prefix("1-")
                .expect("an X-Ray root of version 1")
                .replace('-', "");
            (root, get("Parent="))
        })
        .collect();
    for sent in &all {
        let found = job_spans(&spans, sent.job, service);
        assert_eq!(found.len(), 1, "one span for job {}: {spans:#?}", sent.job);
        let span = found[0];
        let is_poison = sent.job == poison.job;
        assert_eq!(span.kind, CONSUMER, "{span:?}");
        for (key, value) in [
            ("messaging.system", "aws_sqs"),
            ("messaging.operation", "process"),
            ("messaging.destination.name", stack.jobs.name.as_str()),
            ("messaging.message.id", sent.message_id.as_str()),
            ("consumer", stack.consumer_name.as_str()),
            (
                "outcome",
                if is_poison {
                    "dead_lettered"
                } else {
                    "processed"
                },
            ),
        ] {
            assert_eq!(span.attr(key), Some(value), "{key} of {span:#?}");
        }
        assert!(span.attr("tenant_id").is_some(), "{span:#?}");
        if !is_poison {
            assert_eq!(span.attr("attempt"), Some("1"), "{span:#?}");
        }
        assert_eq!(span.status, if is_poison { 2 } else { 0 }, "{span:#?}");
        assert!(
            span.links.contains(&sent.producer),
            "the job links to its producer's span {:?}: {span:#?}",
            sent.producer
        );
        // Its statements hang from it, or from the commit group it committed in, or from the
        // call that wrote its batch's poison letters together.
        let parent = by_id(&spans, &span.parent_span_id).expect("the job's parent was exported");
        let holders: Vec<&str> = if ["commit group", "dead letters"].contains(&parent.name.as_str())
        {
            vec![&span.span_id, &parent.span_id]
        } else {
            vec![&span.span_id]
        };
        let invocation = if ["commit group", "dead letters"].contains(&parent.name.as_str()) {
            by_id(&spans, &parent.parent_span_id).expect("the group's parent was exported")
        } else {
            parent
        };
        assert_eq!(
            invocation.attr("faas.trigger"),
            Some("pubsub"),
            "{invocation:#?}"
        );
        assert!(
            invocations.contains(&(
                invocation.trace_id.clone(),
                invocation.parent_span_id.clone()
            )),
            "the invocation is a child of the trace Lambda gave it: {invocation:#?} in {invocations:?}"
        );
        let statements: Vec<&Received> = spans
            .iter()
            .filter(|s| s.kind == CLIENT && holders.contains(&s.parent_span_id.as_str()))
            .collect();
        let wanted: &[&str] = if is_poison && mode == CommitMode::Batch {
            // A batch's poison is received in one statement and settled in one more, under its
            // `dead letters` span.
            &["core.letter_intake", "core.settle_intake"]
        } else if is_poison {
            &["core.dead_letters"]
        } else {
            &["reference.point_awards", "core."]
        };
        for table in wanted {
            let statement = statements
                .iter()
                .find(|s| s.attr("db.query.text").is_some_and(|q| q.contains(table)))
                .unwrap_or_else(|| {
                    panic!(
                        "no statement on {table} under job {}: {statements:#?}",
                        sent.job
                    )
                });
            assert_eq!(statement.attr("db.system.name"), Some("postgresql"));
            assert_eq!(statement.trace_id, span.trace_id);
            assert!(statement.start <= statement.end, "{statement:#?}");
        }
    }
    if mode == CommitMode::Batch {
        let grouped = valid
            .iter()
            .filter(|sent| {
                let span = job_spans(&spans, sent.job, service)[0];
                by_id(&spans, &span.parent_span_id).is_some_and(|p| p.name == "commit group")
            })
            .count();
        assert!(
            grouped >= 2,
            "batch mode committed the valid jobs as a group: {spans:#?}"
        );
    }
    let everything = format!("{spans:?}");
    assert!(
        !everything.contains(ACCOUNT),
        "a statement's bound values never reach a span"
    );
    for statement in spans.iter().filter(|s| s.kind == CLIENT) {
        let sql = statement.attr("db.query.text").unwrap_or_default();
        assert!(
            all.iter().all(|s| !sql.contains(&s.job.to_string())),
            "the values written into a statement never reach its span: {sql}"
        );
    }
}

/// `[a, b].concat()` of slices of references.
trait ConcatRefs<'a> {
    fn concat_refs(&self) -> Vec<&'a Sent>;
}

impl<'a> ConcatRefs<'a> for [&'a [Sent]; 2] {
    fn concat_refs(&self) -> Vec<&'a Sent> {
        self.iter().flat_map(|s| s.iter()).collect()
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_tracing_active_each_job_is_one_span_with_its_link_and_statements_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_job_is_one_span_with_its_link_and_its_statements(pool_opts, connect, CommitMode::PerJob)
        .await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn with_tracing_active_each_job_is_one_span_with_its_link_and_statements_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    each_job_is_one_span_with_its_link_and_its_statements(pool_opts, connect, CommitMode::Batch)
        .await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn tracing_is_off_by_default_and_nothing_is_exported(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, false, CommitMode::PerJob).await;
    send_jobs(&pool, &stack).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.requests(), 0, "{:#?}", receiver.spans());
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn spans_are_exported_before_the_runtime_asks_for_the_next_invocation(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, true, CommitMode::PerJob).await;
    let job = JobId(Uuid::new_v4());
    let body = envelope(
        job,
        TenantId(Uuid::new_v4()),
        "c-flush",
        json!({"account_id": ACCOUNT, "points": 1}),
    );
    let record = json!({
        "messageId": Uuid::new_v4().to_string(), "receiptHandle": "rh-1", "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": stack.jobs.arn, "awsRegion": "us-east-1"});
    let asked = stack.consumer.nexts();
    let answer = stack
        .consumer
        .invoke(&json!({"Records": [record]}))
        .await
        .expect("invoked");
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    // The moment the process asks for the next invocation (when Lambda may freeze it), the
    // job's span is already at the collector: the flush is not left for a later invocation.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while stack.consumer.nexts() <= asked.max(1) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let at_next = receiver.spans();
    assert!(
        stack.consumer.nexts() > asked.max(1),
        "the process asked for the next invocation"
    );
    let service = "consumer";
    assert_eq!(job_spans(&at_next, job, service).len(), 1, "{at_next:#?}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM core.processed_jobs").await,
        1
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_job_whose_process_dies_mid_job_is_never_exported_as_done(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, true, CommitMode::PerJob).await;
    let tenant = TenantId(Uuid::new_v4());
    // Its process exits after the award is written and before the commit, on every delivery.
    let dies = JobId(Uuid::new_v4());
    let body = envelope(
        dies,
        tenant,
        "c-dies",
        json!({"account_id": ACCOUNT, "points": 1, "demo_fault": "crash_before_commit"}),
    );
    send_traced(&stack, &body).await;
    let starts = stack.consumer.starts();
    stack
        .run_until(SETTLE, || async { stack.consumer.starts() >= starts + 2 })
        .await;
    // Then a job that completes, so the same stack is seen exporting.
    let lives = JobId(Uuid::new_v4());
    send_traced(
        &stack,
        &envelope(
            lives,
            tenant,
            "c-lives",
            json!({"account_id": ACCOUNT, "points": 2}),
        ),
    )
    .await;
    stack
        .run_until(SETTLE, || async {
            count(&pool, "SELECT count(*) FROM core.processed_jobs").await == 1
        })
        .await;
    let service = "consumer";
    let spans = spans_when(&receiver, |spans| {
        job_spans(spans, lives, service).len() == 1
    })
    .await;
    assert_eq!(job_spans(&spans, lives, service).len(), 1, "{spans:#?}");
    assert!(
        stack.consumer.starts() >= starts + 2,
        "the process died mid-job"
    );
    for span in job_spans(&spans, dies, service) {
        assert!(
            span.attr("outcome").is_some_and(|o| o != "processed"),
            "a job whose process died is never exported half-done or as done: {span:#?}"
        );
    }
    assert_eq!(
        count(
            &pool,
            &format!("SELECT count(*) FROM core.processed_jobs WHERE job_id = '{dies}'")
        )
        .await,
        0
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_keeps_its_trace_and_its_replay_links_the_replayed_job_to_it(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use dead_letter_api::api::Scope;
    use e2e::api_client::{caller, request, with_body};
    let (pool, stack, receiver) = traced_stack(pool_opts, connect, true, CommitMode::PerJob).await;
    let (job, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    // A producer's release wrote the points as words: poison, lettered with its trace.
    let poison = envelope(
        job,
        tenant,
        "c-replayed",
        json!({"account_id": ACCOUNT, "points": "seven"}),
    );
    let (_, producer) = send_traced(&stack, &poison).await;
    stack
        .run_until(SETTLE, || async {
            count(&pool, "SELECT count(*) FROM core.dead_letters").await == 1
        })
        .await;
    let letter: Uuid = sqlx::query_scalar("SELECT id FROM core.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    let traceparent = format!("00-{}-{}-01", producer.0, producer.1);
    let shown = stack
        .api
        .call(&request(
            "GET",
            &format!("/v1/core/dead-letters/{letter}"),
            Some(caller("ops-1", &[Scope::Read])),
        ))
        .await;
    assert_eq!(
        shown.body["letter"]["trace_parent"],
        json!(traceparent),
        "{}",
        shown.body
    );
    // Edited and replayed: the replay carries the letter's trace, and the job it runs links to
    // the request that produced it.
    let edited = envelope(
        job,
        tenant,
        "c-replayed",
        json!({"account_id": ACCOUNT, "points": 7}),
    );
    let response = stack
        .api
        .call(&with_body(
            request(
                "POST",
                &format!("/v1/core/dead-letters/{letter}/edit"),
                Some(caller("ops-1", &[Scope::Edit])),
            ),
            &json!({"body": serde_json::from_str::<serde_json::Value>(&edited).unwrap(), "reason": "points as words in 4.2"}).to_string(),
        ))
        .await;
    assert_eq!(response.status, 200, "{}", response.body);
    stack
        .run_until(SETTLE, || async {
            count(&pool, "SELECT count(*) FROM core.processed_jobs").await == 1
        })
        .await;
    let service = "consumer";
    let processed = |spans: &[Received]| {
        job_spans(spans, job, service)
            .into_iter()
            .find(|s| s.attr("outcome") == Some("processed"))
            .cloned()
    };
    let spans = spans_when(&receiver, |spans| processed(spans).is_some()).await;
    let replayed =
        processed(&spans).unwrap_or_else(|| panic!("the replayed job's span: {spans:#?}"));
    assert!(
        replayed.links.contains(&producer),
        "the replayed job links to the original request's trace {producer:?}: {replayed:#?}"
    );
}
