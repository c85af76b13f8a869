//! Edit and replay (issue 25), through the real binaries: the replay function's edit route, the
//! consumer on the local SQS API. An edited poison letter produces exactly one effect, under the
//! same job; the letter keeps what it received and the edit is kept with the replay; a second
//! edit or a replay of the same letter is refused; once the edit has committed, a late copy of
//! the body edited away from is the job's duplicate, not a conflict; an edit that changes the
//! job or the tenant, or that carries no edit scope, is refused and sends nothing.

use consumer::count_awards;
use dead_letter_api::api::Scope;
use e2e::api_client::{caller, fingerprint, request, seed_letter_for, with_body};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::dead_letter::{DeadLetter, ErrorKind, letters_for_job};
use shared::harness::CommitMode;
use shared::ids::{DeadLetterId, JobId, TenantId};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(60);

async fn stack(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) -> (PgPool, Stack) {
    e2e::stack_for_test!(pool_opts, connect, |spec| {
        spec.consumer_env
            .push(("COMMIT_MODE".into(), mode.as_str().into()));
    })
    .await
}

fn envelope(job_id: JobId, tenant: TenantId, payload: Value) -> Value {
    json!({"job_id": job_id, "tenant_id": tenant, "correlation_id": "edit-e2e", "payload": payload})
}

/// The edit route's request for `letter`.
fn edit(letter: DeadLetterId, scopes: &[Scope], body: &Value) -> dead_letter_api::api::ApiRequest {
    with_body(
        request(
            "POST",
            &format!("/v1/core/dead-letters/{letter}/edit"),
            Some(caller("ops-1", scopes)),
        ),
        &body.to_string(),
    )
}

/// Sends `body` and runs the stack until its job has a letter; returns the letter.
async fn lettered(pool: &PgPool, stack: &Stack, job_id: JobId, body: &Value) -> DeadLetter {
    let consumer = e2e::consumer_name();
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            !letters_for_job(pool, job_id, &consumer)
                .await
                .unwrap()
                .is_empty()
        })
        .await;
    letters_for_job(pool, job_id, &consumer).await.unwrap()[0].clone()
}

async fn letters(pool: &PgPool, job_id: JobId) -> Vec<DeadLetter> {
    letters_for_job(pool, job_id, &e2e::consumer_name())
        .await
        .unwrap()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_edited_poison_letter_produces_exactly_one_effect_under_the_same_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = stack(pool_opts, connect, CommitMode::PerJob).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    // A producer's release wrote the points as words: poison, no retries.
    let received = envelope(
        job_id,
        tenant,
        json!({"account_id": "a", "points": "seven"}),
    );
    let letter = lettered(&pool, &stack, job_id, &received).await;
    assert_eq!(letter.error_kind, ErrorKind::Poison);
    let edited = envelope(job_id, tenant, json!({"account_id": "a", "points": 7}));
    let reason = "producer 4.2 wrote points as words; 7 as the source row says";
    let response = stack
        .api
        .call(&edit(
            letter.id,
            &[Scope::Edit],
            &json!({"body": edited, "reason": reason}),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    let replay = &response.body["replay"];
    assert_eq!(
        (&replay["sent"], &replay["edited"], &replay["job_id"]),
        (&json!(true), &json!(true), &json!(job_id))
    );
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    // The record shows exactly what ran: the body received, untouched, and the edit beside it.
    let kept = &letters(&pool, job_id).await[0];
    assert_eq!(kept.payload, received, "the letter keeps what it received");
    assert_eq!(
        (
            kept.replay_body
                .as_deref()
                .map(|b| serde_json::from_str::<Value>(b).unwrap()),
            kept.replay_reason.as_deref(),
            kept.reviewed_by.as_deref(),
        ),
        (Some(edited.clone()), Some(reason), Some("ops-1"))
    );
    let shown = stack
        .api
        .call(&request(
            "GET",
            &format!("/v1/core/dead-letters/{}", letter.id),
            Some(caller("ops-1", &[Scope::Read])),
        ))
        .await;
    assert_eq!(shown.body["letter"]["replay_body"], edited);
    assert_eq!(shown.body["letter"]["payload"], received);
    // Late copies, of the body received and of the edit: the job's duplicates.
    stack.send(&received.to_string()).await;
    stack.send(&edited.to_string()).await;
    stack.run_until(SETTLE, || async { true }).await;
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "one effect");
    assert_eq!(letters(&pool, job_id).await.len(), 1, "no new letter");
    let metrics = stack.consumer.metrics();
    assert_eq!(metrics.get("DuplicateSkipped"), Some(&2), "{metrics:?}");
    // The letter is reviewed: a second edit, or a replay, is refused and sends nothing.
    let before = fingerprint(&pool).await;
    let again = stack
        .api
        .call(&edit(
            letter.id,
            &[Scope::Edit],
            &json!({"body": envelope(job_id, tenant, json!({"account_id": "a", "points": 8})), "reason": "again"}),
        ))
        .await;
    assert_eq!(
        (again.status, &again.body["error"]["code"]),
        (409, &json!("not_pending"))
    );
    let replay = request(
        "POST",
        &format!("/v1/core/dead-letters/{}/replay", letter.id),
        Some(caller("ops-1", &[Scope::Replay])),
    );
    assert_eq!(stack.api.call(&replay).await.status, 409);
    assert_eq!(fingerprint(&pool).await, before);
    assert_eq!(stack.in_flight().await, 0, "nothing sent");
}

/// A body that parses but fails (here a permanent fault the edit removes): its copies have a
/// digest, and the fence keeps the edited body's. A late copy of the original is the body an
/// operator edited away from, so it is the job's duplicate, not another job (a conflict letter).
async fn a_late_copy_of_the_body_edited_away_is_a_duplicate(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
    mode: CommitMode,
) {
    let (pool, stack) = stack(pool_opts, connect, mode).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let received = envelope(
        job_id,
        tenant,
        json!({"account_id": "a", "points": 7, "demo_fault": "permanent"}),
    );
    let letter = lettered(&pool, &stack, job_id, &received).await;
    assert_eq!(letter.error_kind, ErrorKind::Permanent);
    let edited = envelope(job_id, tenant, json!({"account_id": "a", "points": 7}));
    let response = stack
        .api
        .call(&edit(
            letter.id,
            &[Scope::Edit],
            &json!({"body": edited, "reason": "the fault flag was a test producer's"}),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    // Two late copies of the original in one batch, and one alone.
    stack.send(&received.to_string()).await;
    stack.send(&received.to_string()).await;
    stack.run_until(SETTLE, || async { true }).await;
    stack.send(&received.to_string()).await;
    stack.run_until(SETTLE, || async { true }).await;
    let all = letters(&pool, job_id).await;
    assert_eq!(
        all.iter().map(|l| l.error_kind).collect::<Vec<_>>(),
        [ErrorKind::Permanent],
        "no conflict letter: the copies are the job's duplicates"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "one effect");
    // Another body under the job's id is still another job: its conflict letter is written.
    let other = envelope(job_id, tenant, json!({"account_id": "b", "points": 9}));
    stack.send(&other.to_string()).await;
    stack
        .run_until(SETTLE, || async { letters(&pool, job_id).await.len() == 2 })
        .await;
    assert_eq!(
        letters(&pool, job_id).await[1].error_kind,
        ErrorKind::Conflict
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_late_copy_of_the_body_edited_away_is_the_jobs_duplicate_per_job(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_late_copy_of_the_body_edited_away_is_a_duplicate(pool_opts, connect, CommitMode::PerJob).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_late_copy_of_the_body_edited_away_is_the_jobs_duplicate_in_batch_mode(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    a_late_copy_of_the_body_edited_away_is_a_duplicate(pool_opts, connect, CommitMode::Batch).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_edit_that_changes_the_job_or_tenant_or_lacks_the_edit_scope_is_refused_and_sends_nothing(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = stack(pool_opts, connect, CommitMode::PerJob).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let received = envelope(
        job_id,
        tenant,
        json!({"account_id": "a", "points": "seven"}),
    );
    let letter = seed_letter_for(&pool, &stack.jobs.name, ErrorKind::Poison, &received).await;
    let fixed = json!({"account_id": "a", "points": 7});
    let other_job = envelope(JobId(Uuid::new_v4()), tenant, fixed.clone());
    let other_tenant = envelope(job_id, TenantId(Uuid::new_v4()), fixed.clone());
    let mut no_job = envelope(job_id, tenant, fixed.clone());
    no_job.as_object_mut().unwrap().remove("job_id");
    let mut no_payload = envelope(job_id, tenant, fixed.clone());
    no_payload.as_object_mut().unwrap().remove("payload");
    let before = fingerprint(&pool).await;
    let reason = "a fix";
    for (request, status, code) in [
        (
            json!({"body": other_job, "reason": reason}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": other_tenant, "reason": reason}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": no_job, "reason": reason}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": no_payload, "reason": reason}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": received, "reason": reason}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": envelope(job_id, tenant, fixed.clone())}),
            422,
            "invalid_body",
        ),
        (
            json!({"body": envelope(job_id, tenant, fixed.clone()), "reason": reason, "queue": "other-jobs"}),
            422,
            "invalid_body",
        ),
    ] {
        let response = stack
            .api
            .call(&edit(letter, &[Scope::Edit], &request))
            .await;
        assert_eq!(
            (response.status, response.body["error"]["code"].as_str()),
            (status, Some(code)),
            "{request}: {:#}",
            response.body
        );
    }
    let good = json!({"body": envelope(job_id, tenant, fixed.clone()), "reason": reason});
    let refused = stack
        .api
        .call(&edit(
            letter,
            &[Scope::Read, Scope::Replay, Scope::Discard],
            &good,
        ))
        .await;
    assert_eq!(
        refused.status, 403,
        "replaying is not editing: {:#}",
        refused.body
    );
    // A dry run checks the edit and shows the plan; nothing is recorded or sent.
    let mut dry = good.clone();
    dry["dry_run"] = json!(true);
    let plan = stack.api.call(&edit(letter, &[Scope::Edit], &dry)).await;
    assert_eq!(plan.status, 200, "{:#}", plan.body);
    assert_eq!(
        (&plan.body["dry_run"], &plan.body["replay"]["body"]),
        (&json!(true), &good["body"])
    );
    assert_eq!(fingerprint(&pool).await, before, "nothing changed");
    assert_eq!(stack.in_flight().await, 0, "nothing sent");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_edited_replay_of_a_job_whose_fence_exists_sends_nothing(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = stack(pool_opts, connect, CommitMode::PerJob).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let body = envelope(job_id, tenant, json!({"account_id": "a", "points": 7}));
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    // Its ack was lost: the backstop wrote a letter for a job that committed.
    let letter = seed_letter_for(&pool, &stack.jobs.name, ErrorKind::Crashed, &body).await;
    let edited = envelope(job_id, tenant, json!({"account_id": "a", "points": 8}));
    let response = stack
        .api
        .call(&edit(
            letter,
            &[Scope::Edit],
            &json!({"body": edited, "reason": "points were short"}),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(
        (
            &response.body["replay"]["sent"],
            &response.body["letter"]["replay_outcome"]
        ),
        (&json!(false), &json!("already_processed"))
    );
    assert_eq!(stack.in_flight().await, 0, "nothing on the queue");
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

/// Issue 34, item 5: an edit SQS would refuse (U+FFFF; SQS answers InvalidMessageContents) was
/// accepted and queued, and nothing an operator could do resolved the letter: a corrected edit
/// and a discard answered 409, and the scheduled run retried the send for ever. What the
/// transport refuses is now refused at the door with a 422 naming why, and the letter stays
/// pending, so the corrected edit goes through.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_edit_sqs_would_refuse_is_refused_at_the_door_and_the_letter_stays_pending(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = stack(pool_opts, connect, CommitMode::PerJob).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let received = envelope(job_id, tenant, json!({"account_id": "a", "points": "x"}));
    let letter = lettered(&pool, &stack, job_id, &received).await;
    let before = fingerprint(&pool).await;
    for (bad, why) in [
        (json!({"account_id": "a\u{FFFF}", "points": 7}), "U+FFFF"),
        (
            json!({"account_id": "a", "points": 7, "note": "x".repeat(261_946)}),
            "with its replay_of attribute",
        ),
    ] {
        let response = stack
            .api
            .call(&edit(
                letter.id,
                &[Scope::Edit],
                &json!({"body": envelope(job_id, tenant, bad), "reason": "fix"}),
            ))
            .await;
        assert_eq!(response.status, 422, "{:#}", response.body);
        let message = response.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(why) && message.contains("stays pending"),
            "{message}"
        );
        assert_eq!(fingerprint(&pool).await, before, "nothing recorded");
    }
    assert_eq!(stack.in_flight().await, 0, "nothing sent");
    let fixed = envelope(job_id, tenant, json!({"account_id": "a", "points": 7}));
    let response = stack
        .api
        .call(&edit(
            letter.id,
            &[Scope::Edit],
            &json!({"body": fixed, "reason": "points as a number"}),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
}

/// Issue 34, item 5: a queued replay that no send can deliver (here its queue is gone) is
/// withdrawn by an operator, audited: the letter keeps `replayed` with the outcome `withdrawn`,
/// who and why; the scheduled run stops sending it; the job is pending again as a new letter
/// linked to it, which can be discarded. A second withdrawal, or one of a replay already sent,
/// is a 409 that changes nothing.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_queued_replay_that_cannot_be_sent_is_withdrawn_back_to_review(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = stack(pool_opts, connect, CommitMode::PerJob).await;
    let (job_id, tenant) = (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
    let body = envelope(job_id, tenant, json!({"account_id": "a", "points": 7}));
    let letter = seed_letter_for(&pool, "a-queue-since-deleted", ErrorKind::Exhausted, &body).await;
    let replay = request(
        "POST",
        &format!("/v1/core/dead-letters/{letter}/replay"),
        Some(caller("ops-1", &[Scope::Replay])),
    );
    let queued = stack.api.call(&replay).await;
    assert_eq!(queued.status, 202, "{:#}", queued.body);
    let withdraw = |scopes: &[Scope], reason: &str| {
        with_body(
            request(
                "POST",
                &format!("/v1/core/dead-letters/{letter}/withdraw"),
                Some(caller("ops-2", scopes)),
            ),
            &json!({ "reason": reason }).to_string(),
        )
    };
    // Without the replay scope, or without a reason: refused, nothing changes.
    let before = fingerprint(&pool).await;
    assert_eq!(
        stack
            .api
            .call(&withdraw(&[Scope::Discard], "gone"))
            .await
            .status,
        403
    );
    assert_eq!(
        stack
            .api
            .call(&withdraw(&[Scope::Replay], "  "))
            .await
            .status,
        422
    );
    assert_eq!(fingerprint(&pool).await, before);
    let response = stack
        .api
        .call(&withdraw(
            &[Scope::Replay],
            "the queue was deleted with its stack",
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    let shown = &response.body["letter"];
    assert_eq!(
        (
            &shown["status"],
            &shown["replay_outcome"],
            &shown["replay_withdrawn_by"],
            &shown["replay_withdraw_reason"]
        ),
        (
            &json!("replayed"),
            &json!("withdrawn"),
            &json!("ops-2"),
            &json!("the queue was deleted with its stack")
        )
    );
    let pending: DeadLetterId =
        serde_json::from_value(response.body["pending_letter"].clone()).unwrap();
    let all = letters(&pool, job_id).await;
    let again = all
        .iter()
        .find(|l| l.id == pending)
        .expect("the new letter");
    assert_eq!(
        (again.status, again.replay_of, again.body.as_deref()),
        (
            shared::dead_letter::ReviewStatus::PendingReview,
            Some(letter),
            Some(body.to_string().as_str())
        )
    );
    let sends: i64 = sqlx::query_scalar("SELECT count(*) FROM core.replay_sends")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sends, 0, "the scheduled run has nothing left to send");
    // Again: 409, nothing changes.
    let before = fingerprint(&pool).await;
    let twice = stack.api.call(&withdraw(&[Scope::Replay], "again")).await;
    assert_eq!(
        (twice.status, &twice.body["error"]["code"]),
        (409, &json!("not_queued"))
    );
    assert_eq!(fingerprint(&pool).await, before);
    // The job's new letter is an ordinary pending letter: discarded with a reason.
    let discard = with_body(
        request(
            "POST",
            &format!("/v1/core/dead-letters/{pending}/discard"),
            Some(caller("ops-2", &[Scope::Discard])),
        ),
        r#"{"reason": "the consumer and its queue were retired"}"#,
    );
    assert_eq!(stack.api.call(&discard).await.status, 200);
}
