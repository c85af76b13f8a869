//! The dead-letter API as deployed: the real Lambda binaries, invoked with API Gateway HTTP API
//! (payload 2.0) events whose JWT claims carry the caller, next to the real consumer on the local
//! SQS API. The auth matrix, AC5 end to end, and a replay that fails again.

use consumer::count_awards;
use dead_letter_api::api::{ApiRequest, ROUTES, Scope};
use e2e::api_client::{
    api_gateway_event, caller, fingerprint, request, seed_letter, seed_letter_for, with_body,
};
use e2e::stack::Stack;
use serde_json::{Value, json};
use shared::dead_letter::{ErrorKind, letters_for_job};
use shared::ids::{DeadLetterId, JobId, TenantId};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(60);
const ALL: [Scope; 4] = [Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit];

async fn setup(pool_opts: PgPoolOptions, connect: PgConnectOptions) -> (PgPool, Stack) {
    e2e::stack::start_for_test(e2e::test_binaries!(), pool_opts, connect, |_| {}).await
}

fn envelope(payload: Value) -> (JobId, Value) {
    let job_id = JobId(Uuid::new_v4());
    let body = json!({"job_id": job_id, "tenant_id": TenantId(Uuid::new_v4()),
        "correlation_id": "api-e2e", "payload": payload});
    (job_id, body)
}

/// A request to the route `template` about the letter `id` (or, on a group route, its group).
async fn route_request(
    pool: &PgPool,
    method: &str,
    template: &str,
    id: Uuid,
    scopes: Option<&[Scope]>,
) -> ApiRequest {
    let letter = id;
    let id = if template.starts_with("/v1/core/dead-letter-groups") {
        shared::dead_letter::group_of_letter(pool, shared::ids::DeadLetterId(id))
            .await
            .unwrap()
            .expect("every letter has its group")
            .id
            .to_string()
    } else if template.starts_with("/v1/core/processed-jobs") {
        letter_job(pool, id).await.0.to_string()
    } else {
        id.to_string()
    };
    let path = template.replace("{id}", &id);
    let mut r = request(method, &path, scopes.map(|s| caller("ops-1", s)));
    if template.starts_with("/v1/core/processed-jobs") {
        r.query = vec![("consumer".into(), letter_job(pool, letter).await.1)];
    }
    if template.starts_with("/v1/core/dead-letter-operations/") && !template.contains("{id}") {
        // A dry run: the whole route, checks and plan, changing nothing.
        let queue: String = sqlx::query_scalar("SELECT queue FROM core.dead_letters WHERE id = $1")
            .bind(letter)
            .fetch_one(pool)
            .await
            .unwrap();
        let start = json!({"filter": {"queue": queue}, "dry_run": true});
        with_body(r, &start.to_string())
    } else if path.ends_with("/discard") || path.ends_with("/withdraw") || path.ends_with("/cancel")
    {
        with_body(r, r#"{"reason": "auth matrix"}"#)
    } else if path.ends_with("/edit") {
        let mut body: Value = serde_json::from_str(&letter_body(pool, letter).await).unwrap();
        body["payload"]["points"] = json!(4);
        let edit = json!({"body": body, "reason": "auth matrix"});
        with_body(r, &edit.to_string())
    } else {
        r
    }
}

/// The body the letter received.
async fn letter_body(pool: &PgPool, letter: Uuid) -> String {
    sqlx::query_scalar("SELECT body FROM core.dead_letters WHERE id = $1")
        .bind(letter)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The letter's job and consumer.
async fn letter_job(pool: &PgPool, letter: Uuid) -> (Uuid, String) {
    sqlx::query_as("SELECT job_id, consumer FROM core.dead_letters WHERE id = $1")
        .bind(letter)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn every_route_needs_a_token_and_its_own_scope(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect).await;
    for route in ROUTES {
        let (id, _) = seed_letter(&pool, &stack.jobs.name, ErrorKind::Exhausted).await;
        if route.path.ends_with("/withdraw") {
            // A replay recorded but not yet sent, which only the replay scope may withdraw.
            let mut locked = shared::dead_letter::lock_letter(&pool, id, Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
            let verdict = shared::dead_letter::Verdict::Replayed {
                outcome: shared::dead_letter::ReplayOutcome::Queued,
                reason: None,
                body: None,
            };
            locked
                .mark(&verdict, "ops-1", chrono::Utc::now())
                .await
                .unwrap();
            locked.commit().await.unwrap();
        }
        if route.path.starts_with("/v1/core/processed-jobs") {
            // A job that committed later (its fence), so the read finds it.
            let (job, consumer) = letter_job(&pool, id.0).await;
            sqlx::query(
                "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
                 VALUES ($1, $2, gen_random_uuid(), now(), now() + interval '14 days')",
            )
            .bind(job)
            .bind(consumer)
            .execute(&pool)
            .await
            .unwrap();
        }
        // An operation's routes take an operation's id: a discard of the letter's queue, which
        // its cancel's caller may stop with the discard scope.
        let (id, allowed_scopes): (DeadLetterId, Vec<Scope>) = if route
            .path
            .starts_with("/v1/core/dead-letter-operations/{id}")
        {
            let queue: String =
                sqlx::query_scalar("SELECT queue FROM core.dead_letters WHERE id = $1")
                    .bind(id.0)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let selection = shared::dead_letter::ListFilter {
                queue: Some(queue),
                ..Default::default()
            };
            let request = shared::operations::Request {
                action: shared::operations::Action::Discard,
                selection: &selection,
                reason: "auth matrix",
                actor: "ops-1",
            };
            let op = shared::operations::start(&pool, &request, chrono::Utc::now())
                .await
                .unwrap();
            (DeadLetterId(op.id), vec![route.scope, Scope::Discard])
        } else {
            (id, vec![route.scope])
        };
        let before = fingerprint(&pool).await;
        let others: Vec<Scope> = ALL.into_iter().filter(|s| *s != route.scope).collect();
        let cases: [(Option<&[Scope]>, u16); 2] = [(None, 401), (Some(&others), 403)];
        for (scopes, status) in cases {
            let req = route_request(&pool, route.method, route.path, id.0, scopes).await;
            let response = stack.api.call(&req).await;
            assert_eq!(
                response.status, status,
                "{route:?} {scopes:?}: {:#}",
                response.body
            );
            assert_eq!(
                fingerprint(&pool).await,
                before,
                "{route:?} {scopes:?} changed the database"
            );
        }
        if route.scope != Scope::Read {
            let mut anonymous =
                route_request(&pool, route.method, route.path, id.0, Some(&[route.scope])).await;
            anonymous.caller.as_mut().unwrap().subject = None;
            let response = stack.api.call(&anonymous).await;
            assert_eq!(
                response.status, 401,
                "a review records who made it: {:#}",
                response.body
            );
            assert_eq!(fingerprint(&pool).await, before);
        }
        let allowed =
            route_request(&pool, route.method, route.path, id.0, Some(&allowed_scopes)).await;
        let response = stack.api.call(&allowed).await;
        assert_eq!(
            response.status, 200,
            "{route:?} with its scope: {:#}",
            response.body
        );
    }
    let reviewers: Vec<String> = sqlx::query_scalar(
        "SELECT reviewed_by FROM core.dead_letters WHERE reviewed_by IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        reviewers,
        ["ops-1", "ops-1", "ops-1", "ops-1"],
        "the `sub` claim is the reviewer (the withdrawal's queued replay seeded as ops-1's)"
    );
}

/// AC5: a job that never ran (its five attempts met an outage) is replayed through the API and
/// runs once; a second replay is refused, and the same message delivered twice applies once.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac5_a_replayed_letter_runs_its_job_once(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect).await;
    let (job_id, body) = envelope(json!({"account_id": "a", "points": 7}));
    let letter = seed_letter_for(&pool, &stack.jobs.name, ErrorKind::Exhausted, &body).await;
    let replay = request(
        "POST",
        &format!("/v1/core/dead-letters/{letter}/replay"),
        Some(caller("ops-1", &[Scope::Replay])),
    );
    let response = stack.api.call(&replay).await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(response.body["replay"]["fence_exists"], false);
    assert_eq!(response.body["replay"]["job_id"], json!(job_id.0));
    // The replayed message, delivered twice (an at-least-once queue may do that).
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "one effect");
    let metrics = stack.consumer.metrics();
    assert_eq!(
        (metrics.get("Processed"), metrics.get("DuplicateSkipped")),
        (Some(&1), Some(&1)),
        "{metrics:?}"
    );
    assert_eq!(
        stack.api.call(&replay).await.status,
        409,
        "a second replay sends nothing"
    );
}

/// AC5: replaying a letter whose job had in fact succeeded (its ack was lost, the backstop wrote
/// a `crashed` letter) is acknowledged as a duplicate: no second effect.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac5_replaying_a_job_that_already_succeeded_has_no_second_effect(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect).await;
    let (job_id, body) = envelope(json!({"account_id": "a", "points": 7}));
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            count_awards(&pool, job_id).await.unwrap() == 1
        })
        .await;
    let letter = seed_letter_for(&pool, &stack.jobs.name, ErrorKind::Crashed, &body).await;
    let response = stack
        .api
        .call(&request(
            "POST",
            &format!("/v1/core/dead-letters/{letter}/replay"),
            Some(caller("ops-1", &[Scope::Replay])),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(
        (
            &response.body["replay"]["fence_exists"],
            &response.body["replay"]["sent"],
            &response.body["letter"]["replay_outcome"]
        ),
        (&json!(true), &json!(false), &json!("already_processed")),
        "the job is done: nothing is sent, and the letter says so"
    );
    assert_eq!(stack.in_flight().await, 0, "nothing on the queue");
    stack.run_until(SETTLE, || async { true }).await;
    assert_eq!(
        count_awards(&pool, job_id).await.unwrap(),
        1,
        "no second effect"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_that_fails_again_is_a_new_letter_linked_to_the_first(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect).await;
    let consumer = e2e::consumer_name();
    let (job_id, body) =
        envelope(json!({"account_id": "a", "points": 7, "demo_fault": "permanent"}));
    stack.send(&body.to_string()).await;
    stack
        .run_until(SETTLE, || async {
            !letters_for_job(&pool, job_id, &consumer)
                .await
                .unwrap()
                .is_empty()
        })
        .await;
    let first = letters_for_job(&pool, job_id, &consumer).await.unwrap()[0].id;
    let replay = request(
        "POST",
        &format!("/v1/core/dead-letters/{first}/replay"),
        Some(caller("ops-1", &[Scope::Replay])),
    );
    assert_eq!(stack.api.call(&replay).await.status, 200);
    stack
        .run_until(SETTLE, || async {
            letters_for_job(&pool, job_id, &consumer)
                .await
                .unwrap()
                .len()
                == 2
        })
        .await;
    let letters = letters_for_job(&pool, job_id, &consumer).await.unwrap();
    assert_eq!(
        letters[1].replay_of,
        Some(first),
        "linked to the letter it was replayed from"
    );
    assert_eq!(letters[1].status.as_str(), "pending_review");
    assert_eq!(letters[0].status.as_str(), "replayed");
    let got = stack
        .api
        .call(&request(
            "GET",
            &format!("/v1/core/dead-letters/{first}"),
            Some(caller("ops-1", &[Scope::Read])),
        ))
        .await;
    assert_eq!(got.body["failed_replays"], json!([letters[1].id]));
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 0);

    // Issue 26: the replay emptied the first letter's group (resolved), so the letter of the
    // replay that failed again opened a new group; the group the operator replayed leads to it.
    let (old, new) = (letters[0].group_id.unwrap(), letters[1].group_id.unwrap());
    assert_ne!(old, new, "a resolved group takes no new letter");
    let group = stack
        .api
        .call(&request(
            "GET",
            &format!("/v1/core/dead-letter-groups/{}", old.0),
            Some(caller("ops-1", &[Scope::Read])),
        ))
        .await;
    assert_eq!(group.status, 200, "{:#}", group.body);
    assert_eq!(
        group.body["failed_replays"],
        json!([{"group_id": new.0, "letters": 1}])
    );
}

/// Issue 22, item 7: the event as API Gateway passes it, byte for byte: a raw query string the
/// gateway does not re-encode (quotes, spaces, bytes that are not UTF-8, 70 KB of it), a body
/// marked base64 that is not, a path with a space. Each is the caller's input: a 4xx JSON error
/// naming what is wrong, never a crashed invocation (API Gateway's 500).
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_raw_request_as_the_gateway_passes_it_is_a_4xx_not_a_500(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool, stack) = setup(pool_opts, connect).await;
    let (letter, _) = seed_letter(&pool, &stack.jobs.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    let ops = || Some(caller("ops-1", &ALL));
    let list = request("GET", "/v1/core/dead-letters", ops());
    let groups = request("GET", "/v1/core/dead-letter-groups", ops());
    let discard = with_body(
        request(
            "POST",
            &format!("/v1/core/dead-letters/{letter}/discard"),
            ops(),
        ),
        r#"{"reason": "x"}"#,
    );
    let raw = |req: &ApiRequest, query: &str| {
        let mut event = api_gateway_event(req);
        event["rawQueryString"] = json!(query);
        event
    };
    let long = format!("correlation_id={}", "x".repeat(70_000));
    // (what the refusal names, or None for a value the API takes as it is, the request, the event)
    let mut cases: Vec<(Option<&str>, &ApiRequest, Value)> = vec![
        (None, &list, raw(&list, "correlation_id=\"x\"")),
        (None, &list, raw(&list, "correlation_id={x}&limit=5")),
        (Some("`queue`"), &list, raw(&list, "queue=a b")),
        (Some("`queue`"), &list, raw(&list, "queue=%FF")),
        (
            Some("`correlation_id`"),
            &list,
            raw(&list, "correlation_id=%C3%28"),
        ),
        (
            Some("`message_id`"),
            &list,
            raw(&list, "message_id=%ED%A0%80"),
        ),
        (Some("`queue`"), &list, raw(&list, "queue=%00")),
        (Some("`queue`"), &list, raw(&list, "queue=é")),
        (Some("`queue`"), &groups, raw(&groups, "queue=%FF%FE")),
        (Some("more than once"), &list, raw(&list, "limit=5&limit=6")),
        (
            Some("more than once"),
            &groups,
            raw(&groups, "limit=5&limit=5"),
        ),
        (Some("`limit`"), &list, raw(&list, "limit=5#6")),
        (Some("`cursor`"), &list, raw(&list, "cursor=%")),
        (Some("`cursor`"), &groups, raw(&groups, "cursor=%zz{}")),
        (Some("`correlation_id`"), &list, raw(&list, &long)),
        (Some("query parameter"), &list, raw(&list, "%FF=1")),
        (Some("query parameter"), &list, raw(&list, "\u{0}=1")),
    ];
    let mut base64 = api_gateway_event(&discard);
    base64["isBase64Encoded"] = json!(true);
    base64["body"] = json!("!!! not base64 !!!");
    cases.push((Some("base64"), &discard, base64));
    let mut spaced = api_gateway_event(&list);
    spaced["rawPath"] = json!(format!("/v1/core/dead-letters/{letter} x"));
    cases.push((Some("id"), &list, spaced));
    let mut host = api_gateway_event(&list);
    host["headers"]["host"] = json!("not a host name/\\");
    host["rawQueryString"] = json!("queue=%FF");
    cases.push((Some("`queue`"), &list, host));
    // Only `queryStringParameters`, as a hand-made event may carry: duplicates joined by commas.
    let mut joined = api_gateway_event(&list);
    joined.as_object_mut().unwrap().remove("rawQueryString");
    joined["queryStringParameters"] = json!({"limit": "5,6"});
    cases.push((Some("`limit`"), &list, joined));
    for (needle, req, event) in &cases {
        let what = format!(
            "{} {:?}",
            req.path,
            event["rawQueryString"]
                .as_str()
                .map(|q| q.chars().take(40).collect::<String>())
        );
        let response = stack
            .api
            .serving(req)
            .invoke(event)
            .await
            .unwrap_or_else(|e| {
                panic!("{what}: the invocation failed (API Gateway answers 500): {e}")
            });
        let status = response["statusCode"].as_u64().unwrap_or_default();
        let body: Value = serde_json::from_str(response["body"].as_str().unwrap_or("null"))
            .unwrap_or_else(|e| panic!("{what}: not JSON: {e}: {response}"));
        let Some(needle) = needle else {
            assert_eq!(status, 200, "{what}: {body:#}");
            assert_eq!(body["items"], json!([]), "{what}");
            continue;
        };
        assert!((400..500).contains(&status), "{what}: {status} {body:#}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(body["error"]["code"].is_string(), "{what}: {body:#}");
        assert!(
            message.contains(needle),
            "{what}: names {needle}: {message}"
        );
        assert!(message.len() <= 600, "{what}: {} bytes", message.len());
    }
    assert_eq!(fingerprint(&pool).await, before);
    // The same values percent-encoded as a client should: a query the API takes as meant.
    let mut ok = api_gateway_event(&list);
    ok["rawQueryString"] =
        json!("correlation_id=api-test&limit=5&queue=".to_owned() + &stack.jobs.name);
    let response = stack.api.serving(&list).invoke(&ok).await.unwrap();
    let body: Value = serde_json::from_str(response["body"].as_str().unwrap()).unwrap();
    assert_eq!(response["statusCode"], 200, "{body:#}");
    assert_eq!(body["items"].as_array().unwrap().len(), 1, "{body:#}");
    assert_eq!(body["limit"], 5);
}
