//! Bulk operations (issue 36): a group, or any filter the list takes, replayed or discarded
//! server-side by one call. Real PostgreSQL, the local SQS API, the API's handlers, the worker
//! both in-process and as the real scheduled binary killed with SIGKILL mid-work.

use dead_letter_api::api::Scope;
use e2e::api_client::{caller, request, with_body};
use e2e::event_source::{create_queue, depth, sqs_client};
use e2e::operations_kit::{
    Apis, OPERATIONS, group_of, operator, queue, scalar, seed, tools, work_all,
};
use serde_json::json;
use shared::clock::{Clock, ManualClock};
use shared::dead_letter::ListFilter;
use shared::operations::{self, Action, OperationTools, Request};
use shared::replay::Replayer;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_discard_operation_reviews_every_selected_letter_once_with_its_audit(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    seed(
        &pool,
        "storm-q",
        2_500,
        "exhausted",
        true,
        "partner answered 503",
    )
    .await;
    seed(
        &pool,
        "other-q",
        40,
        "exhausted",
        true,
        "partner answered 503",
    )
    .await;
    let group = group_of(&pool, "storm-q").await;

    let id = apis
        .start("discard", json!({"group_id": group.to_string()}))
        .await;
    let started = apis.operation(id).await;
    assert_eq!(
        (started["status"].as_str(), started["planned"].as_i64()),
        (Some("running"), Some(2_500))
    );
    work_all(&tools(&pool, &sqs)).await;

    let done = apis.operation(id).await;
    assert_eq!(done["status"], "done", "{done:#}");
    assert_eq!(done["progress"]["discarded"], 2_500);
    let (audited, others_pending) = (
        scalar(&pool, &format!(
            "SELECT count(*) FROM core.dead_letters WHERE group_id = {group} AND status = 'discarded'
               AND discard_reason = 'partner back after INC-42' AND reviewed_by = 'oncall@example.com'
               AND operation_id = '{id}'")).await,
        scalar(&pool, "SELECT count(*) FROM core.dead_letters WHERE queue = 'other-q' AND status = 'pending_review'").await,
    );
    assert_eq!((audited, others_pending), (2_500, 40));
    let group = apis
        .call(request(
            "GET",
            &format!("/v1/core/dead-letter-groups/{group}"),
            Some(operator()),
        ))
        .await;
    assert_eq!(
        group.body["group"]["status"], "resolved",
        "{:#}",
        group.body
    );
    assert_eq!(group.body["group"]["pending_count"], 0);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_operation_sends_in_batches_and_leaves_what_it_cannot_replay_pending(
    pool: PgPool,
) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let q = queue(&sqs).await;
    seed(&pool, &q.name, 45, "exhausted", true, "ledger timed out").await;
    // Jobs that committed meanwhile: replayed as already processed, nothing sent.
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         SELECT job_id, consumer, tenant_id, now(), now() + interval '7 days'
         FROM core.dead_letters WHERE queue = $1 ORDER BY created_at LIMIT 5",
    )
    .bind(&q.name)
    .execute(&pool)
    .await
    .unwrap();
    // Not replayable: unsettled copies, and poison without a job id.
    seed(&pool, &q.name, 3, "unsettled", true, "copy too late").await;
    seed(
        &pool,
        &q.name,
        2,
        "poison",
        false,
        "body is not an envelope",
    )
    .await;

    let id = apis.start("replay", json!({"queue": q.name})).await;
    work_all(&tools(&pool, &sqs)).await;

    let done = apis.operation(id).await;
    assert_eq!(done["status"], "done", "{done:#}");
    let p = &done["progress"];
    assert_eq!(
        (
            p["replayed"].as_i64(),
            p["sent"].as_i64(),
            p["already_processed"].as_i64(),
            p["skipped_not_replayable"].as_i64()
        ),
        (Some(40), Some(40), Some(5), Some(5)),
        "{done:#}"
    );
    assert_eq!(depth(&sqs, &q).await, 40, "one message per replay sent");
    let left = scalar(&pool, &format!(
        "SELECT count(*) FROM core.dead_letters WHERE queue = '{}' AND status = 'pending_review'", q.name)).await;
    assert_eq!(left, 5, "what cannot be replayed stays pending");
    let sent_with_id =
        scalar(
            &pool,
            &format!(
        "SELECT count(*) FROM core.dead_letters WHERE queue = '{}' AND replay_outcome = 'sent'
           AND replay_message_id IS NOT NULL AND operation_id = '{id}'", q.name),
        )
        .await;
    assert_eq!(sent_with_id, 40);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_dry_run_answers_the_plan_and_changes_nothing(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    seed(&pool, "plan-q", 30, "exhausted", true, "x failed").await;
    seed(&pool, "plan-q", 4, "poison", false, "not an envelope").await;
    let before = e2e::api_client::fingerprint(&pool).await;
    let answer = apis
        .call(with_body(
            request("POST", &format!("{OPERATIONS}/replay"), Some(operator())),
            &json!({"reason": "try", "filter": {"queue": "plan-q"}, "dry_run": true}).to_string(),
        ))
        .await;
    assert_eq!(answer.status, 200, "{:#}", answer.body);
    assert_eq!(answer.body["plan"]["letters"], 34);
    assert_eq!(answer.body["plan"]["not_replayable"], 4);
    assert_eq!(answer.body["plan"]["by_kind"]["poison"], 4);
    assert_eq!(
        e2e::api_client::fingerprint(&pool).await,
        before,
        "a dry run changes nothing"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn starting_or_cancelling_needs_the_actions_scope_and_a_reason(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    seed(&pool, "scope-q", 3, "exhausted", true, "x failed").await;
    let reader = caller("reader@example.com", &[Scope::Read]);
    let body = json!({"reason": "r", "filter": {"queue": "scope-q"}}).to_string();
    for action in ["replay", "discard"] {
        let refused = apis
            .call(with_body(
                request(
                    "POST",
                    &format!("{OPERATIONS}/{action}"),
                    Some(reader.clone()),
                ),
                &body,
            ))
            .await;
        assert_eq!(refused.status, 403, "{action}: {:#}", refused.body);
    }
    let id = apis.start("discard", json!({"queue": "scope-q"})).await;
    let cancel = |who: dead_letter_api::api::Caller, body: &str| {
        with_body(
            request("POST", &format!("{OPERATIONS}/{id}/cancel"), Some(who)),
            body,
        )
    };
    let refused = apis
        .call(cancel(reader.clone(), r#"{"reason": "stop"}"#))
        .await;
    assert_eq!(refused.status, 403, "{:#}", refused.body);
    let no_reason = apis.call(cancel(operator(), "{}")).await;
    assert_eq!(no_reason.status, 422, "{:#}", no_reason.body);
    let cancelled = apis
        .call(cancel(operator(), r#"{"reason": "wrong group"}"#))
        .await;
    assert_eq!(cancelled.status, 200, "{:#}", cancelled.body);
    assert_eq!(cancelled.body["operation"]["status"], "cancelled");
    assert_eq!(cancelled.body["operation"]["cancel_reason"], "wrong group");
    let again = apis
        .call(cancel(operator(), r#"{"reason": "again"}"#))
        .await;
    assert_eq!(again.status, 409, "{:#}", again.body);
    // Cancelled before any worker came: nothing was reviewed, and no worker takes it.
    work_all(&tools(&pool, &sqs)).await;
    let pending = scalar(
        &pool,
        "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'",
    )
    .await;
    assert_eq!(pending, 3);
    let unknown = apis
        .call(request(
            "GET",
            &format!("{OPERATIONS}/{}", Uuid::new_v4()),
            Some(operator()),
        ))
        .await;
    assert_eq!(unknown.status, 404);
    let listed = apis.call(request("GET", OPERATIONS, Some(reader))).await;
    assert_eq!(listed.body["items"][0]["id"], id.to_string());
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_cancel_stops_a_running_operation_between_chunks_and_keeps_what_it_did(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    seed(
        &pool,
        "cancel-q",
        12_000,
        "exhausted",
        true,
        "partner answered 503",
    )
    .await;
    let id = apis.start("discard", json!({"queue": "cancel-q"})).await;
    let worker = {
        let tools = tools(&pool, &sqs);
        tokio::spawn(async move { work_all(&tools).await })
    };
    // Cancel once it has made progress, while it works.
    loop {
        let op = apis.operation(id).await;
        if op["progress"]["discarded"].as_i64().unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = apis
        .call(with_body(
            request(
                "POST",
                &format!("{OPERATIONS}/{id}/cancel"),
                Some(operator()),
            ),
            r#"{"reason": "wrong queue"}"#,
        ))
        .await;
    assert_eq!(cancelled.status, 200, "{:#}", cancelled.body);
    worker.await.unwrap();
    let op = apis.operation(id).await;
    let discarded = op["progress"]["discarded"].as_i64().unwrap();
    let reviewed = scalar(
        &pool,
        &format!("SELECT count(*) FROM core.dead_letters WHERE operation_id = '{id}'"),
    )
    .await;
    assert_eq!(reviewed, discarded, "the counts are the letters: {op:#}");
    assert!(discarded < 12_000, "cancelled before the end: {op:#}");
    assert_eq!(
        cancelled.body["operation"]["progress"]["discarded"], discarded,
        "the cancel's answer is final"
    );
}

/// The real scheduled binary works an operation and is killed with SIGKILL at random points,
/// again and again; each time the next worker goes on. At the end every selected letter was
/// reviewed exactly once, none outside the selection, and every replay reached the queue.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn an_operation_survives_its_worker_killed_at_any_point(pool: PgPool) {
    let sqs = sqs_client().await;
    let apis = Apis::new(&pool, &sqs);
    let q = queue(&sqs).await;
    seed(&pool, &q.name, 500, "exhausted", true, "ledger timed out").await;
    seed(
        &pool,
        "kill-q",
        5_000,
        "exhausted",
        true,
        "partner answered 503",
    )
    .await;
    seed(&pool, "kill-q", 200, "permanent", true, "refused for good").await;
    let replay = apis.start("replay", json!({"queue": q.name})).await;
    let discard = apis
        .start(
            "discard",
            json!({"queue": "kill-q", "error_kind": "exhausted"}),
        )
        .await;

    let host =
        e2e::lambda_host::scheduled_function(env!("CARGO_BIN_EXE_local-scheduled"), &pool, 4);
    let event = json!({"work": "operations"});
    let mut kills = 0;
    let (mut slack, mut last_worked) = (1u64, -1i64);
    for round in 0..200u64 {
        let running = scalar(
            &pool,
            "SELECT count(*) FROM core.dead_letter_operations WHERE status = 'running'",
        )
        .await;
        if running == 0 {
            break;
        }
        // A dead worker's lease is taken over when it ends, and a backoff (a send that timed out
        // on a busy machine) ends too: end both now (the takeover and the backoff themselves are
        // the lease driver's, tested with the pagers).
        sqlx::query(
            "UPDATE core.dead_letter_operations SET claimed_until = NULL, next_attempt_at = '-infinity'",
        )
            .execute(&pool)
            .await
            .unwrap();
        // Killed at a point that moves round by round; a round that made no progress (a busy
        // machine: the process barely started) gives the next one twice the time, up to 20 s.
        let worked = scalar(
            &pool,
            "SELECT coalesce(sum(replayed + sent + discarded), 0)::bigint
             FROM core.dead_letter_operations",
        )
        .await;
        slack = if worked == last_worked {
            (slack * 2).min(64)
        } else {
            1
        };
        last_worked = worked;
        let kill_after =
            Duration::from_millis(((200 + (round * 7919) % 1_300) * slack).min(20_000));
        let invoked = host.invoke(&event);
        tokio::pin!(invoked);
        tokio::select! {
            _ = &mut invoked => {}
            _ = tokio::time::sleep(kill_after) => {
                if host.kill() {
                    kills += 1;
                }
                let _ = invoked.await;
            }
        }
    }
    assert!(kills >= 3, "the worker was killed {kills} times only");
    for id in [replay, discard] {
        let op = apis.operation(id).await;
        assert_eq!(op["status"], "done", "{op:#}");
    }
    let replayed = apis.operation(replay).await;
    let discarded = apis.operation(discard).await;
    assert_eq!(replayed["progress"]["replayed"], 500, "{replayed:#}");
    assert_eq!(discarded["progress"]["discarded"], 5_000, "{discarded:#}");
    let reviewed = |op: Uuid| {
        let pool = pool.clone();
        async move {
            scalar(
                &pool,
                &format!("SELECT count(*) FROM core.dead_letters WHERE operation_id = '{op}'"),
            )
            .await
        }
    };
    assert_eq!(
        (reviewed(replay).await, reviewed(discard).await),
        (500, 5_000)
    );
    let untouched = scalar(&pool, "SELECT count(*) FROM core.dead_letters WHERE error_kind = 'permanent' AND status = 'pending_review'").await;
    assert_eq!(untouched, 200, "letters outside the selection stay pending");
    // A replay a killed worker recorded but never sent is sent by the next worker first, before
    // its next chunk: none is left queued.
    let sent = scalar(&pool, &format!(
        "SELECT count(*) FROM core.dead_letters WHERE operation_id = '{replay}' AND replay_outcome = 'sent'")).await;
    assert_eq!(sent, 500, "every replay reached its queue");
    let messages = depth(&sqs, &q).await;
    assert!(messages >= 500, "{messages} messages for 500 replays");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
/// Found by the wiring's review: a worker claimed every operation due and worked them one after
/// another, so the claims waiting their turn ran out (120 s) and the next minute's worker took
/// them over, sending replays twice. Now each is claimed when its turn comes.
async fn an_operation_waiting_its_turn_is_never_worked_by_two_workers(pool: PgPool) {
    let sqs = sqs_client().await;
    let q = create_queue(
        &sqs,
        &format!("lease-{}", &Uuid::new_v4().simple().to_string()[..12]),
        &[],
    )
    .await;
    for _ in 0..2 {
        seed(&pool, "big-q", 4_000, "exhausted", true, "x failed").await;
    }
    seed(&pool, &q.name, 600, "exhausted", true, "x failed").await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let tools = |clock: Arc<ManualClock>| OperationTools {
        pool: pool.clone(),
        clock,
        replayer: Some(Replayer::new(sqs.clone())),
    };
    let start = |action, selection: ListFilter| {
        let pool = pool.clone();
        let now = clock.now();
        async move {
            let request = Request {
                action,
                selection: &selection,
                reason: "repro",
                actor: "me",
            };
            operations::start(&pool, &request, now).await.unwrap().id
        }
    };
    let big = start(
        Action::Discard,
        ListFilter {
            queue: Some("big-q".into()),
            ..Default::default()
        },
    )
    .await;
    clock.advance(chrono::Duration::milliseconds(10));
    let small = start(
        Action::Replay,
        ListFilter {
            queue: Some(q.name.clone()),
            ..Default::default()
        },
    )
    .await;
    clock.advance(chrono::Duration::milliseconds(10));
    // Worker 1 claims both (the big one first) and works the big one.
    let first = {
        let tools = tools(clock.clone());
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + Duration::from_secs(40);
            operations::work(&tools, until, 10).await.unwrap()
        })
    };
    loop {
        let done: i64 =
            sqlx::query_scalar("SELECT discarded FROM core.dead_letter_operations WHERE id = $1")
                .bind(big)
                .fetch_one(&pool)
                .await
                .unwrap();
        if done > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The big one takes longer than LEASE (120 s): the small one's claim, waiting, runs out.
    clock.advance(chrono::Duration::seconds(150));
    let second = {
        let tools = tools(clock.clone());
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + Duration::from_secs(40);
            operations::work(&tools, until, 10).await.unwrap()
        })
    };
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    let sent: i64 =
        sqlx::query_scalar("SELECT sent FROM core.dead_letter_operations WHERE id = $1")
            .bind(small)
            .fetch_one(&pool)
            .await
            .unwrap();
    let messages = depth(&sqs, &q).await;
    // The big discard may be taken over (the clock jumped past its lease while worker 1 was
    // between chunks: a lease that ran out is the next worker's, its reviews exactly once
    // either way); what a takeover must never do is send a replay twice.
    assert!(
        first.operations + second.operations >= 2,
        "{first:?} {second:?}"
    );
    assert_eq!(sent, 600);
    assert_eq!(messages, 600, "one message per replay");
}
