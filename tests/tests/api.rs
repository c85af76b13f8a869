//! The dead-letter API in process, against real PostgreSQL and the local SQS API: validation,
//! the review state machine, pagination, and concurrent reviews of one letter.
//! The Lambda binaries, the auth matrix and AC5 end to end are in `api_lambda.rs`.

use dead_letter_api::api::{Api, ApiRequest, ApiResponse, Scope};
use e2e::api_client::{caller, fingerprint, request, seed_letter, with_body};
use e2e::event_source::{Queue, create_queue, depth, sqs_client};
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::dead_letter::ErrorKind;
use shared::ids::DeadLetterId;
use shared::replay::Replayer;
use shared_testkit::{TestLetter, record_letter};
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const ALL: &[Scope] = &[Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit];
const LETTERS: &str = "/v1/core/dead-letters";

struct Apis {
    read: Api,
    replay: Api,
    discard: Api,
    queue: Queue,
    sqs: aws_sdk_sqs::Client,
}

async fn setup(test_pool: PgPool) -> (PgPool, Apis) {
    // A pool of its own on the test's database (the test's pool is capped lower): eight
    // concurrent reviews each hold a connection.
    let connect = (*test_pool.connect_options()).clone();
    let pool = shared_testkit::own_pool(connect, 16).await;
    let sqs = sqs_client().await;
    let queue = create_queue(
        &sqs,
        &format!("api-{}", &Uuid::new_v4().simple().to_string()[..12]),
        &[],
    )
    .await;
    let clock = Arc::new(SystemClock);
    let wait = Duration::from_secs(2);
    let apis = Apis {
        read: Api::read(pool.clone(), clock.clone(), wait),
        replay: Api::replay(
            pool.clone(),
            clock.clone(),
            wait,
            Replayer::new(sqs.clone()),
        ),
        discard: Api::discard(pool.clone(), clock, wait),
        queue,
        sqs,
    };
    (pool, apis)
}

impl Apis {
    async fn call(&self, request: ApiRequest) -> ApiResponse {
        let api = match dead_letter_api::api::function_for(&request.method, &request.path) {
            Some("dead-letters-replay") => &self.replay,
            Some("dead-letters-discard") => &self.discard,
            _ => &self.read,
        };
        api.handle(&request).await
    }

    async fn sent(&self) -> u64 {
        depth(&self.sqs, &self.queue).await
    }
}

fn ops() -> Option<dead_letter_api::api::Caller> {
    Some(caller("ops-1", ALL))
}

fn discard(id: impl std::fmt::Display, body: &str) -> ApiRequest {
    with_body(
        request("POST", &format!("{LETTERS}/{id}/discard"), ops()),
        body,
    )
}

fn replay(id: impl std::fmt::Display) -> ApiRequest {
    request("POST", &format!("{LETTERS}/{id}/replay"), ops())
}

fn list(query: &[(&str, &str)]) -> ApiRequest {
    let mut r = request("GET", LETTERS, ops());
    r.query = query
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

fn assert_error(response: &ApiResponse, status: u16, code: &str) {
    assert_eq!(response.status, status, "{:#}", response.body);
    assert_eq!(response.body["error"]["code"], code, "{:#}", response.body);
    let message = response.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !message.is_empty(),
        "a message for a person: {:#}",
        response.body
    );
    for leak in ["sqlx", "SQL", "core.", "postgres", "panicked", "ErrorKind"] {
        assert!(!message.contains(leak), "leaks {leak:?}: {message}");
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn ac7_discarding_without_a_reason_is_rejected_and_the_letter_is_unchanged(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    for (body, status, code) in [
        ("", 400, "invalid_json"),
        ("{}", 422, "invalid_body"),
        (r#"{"reason": ""}"#, 422, "invalid_body"),
        (r#"{"reason": "   \n\t "}"#, 422, "invalid_body"),
        (r#"{"reason": null}"#, 422, "invalid_body"),
    ] {
        let response = apis.call(discard(id, body)).await;
        assert_error(&response, status, code);
        assert_eq!(fingerprint(&pool).await, before, "changed by {body:?}");
    }
    let response = apis
        .call(discard(
            id,
            r#"{"reason": "account closed; points reissued by hand (OPS-12)"}"#,
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    let letter = &response.body["letter"];
    assert_eq!(letter["status"], "discarded");
    assert_eq!(
        letter["discard_reason"],
        "account closed; points reissued by hand (OPS-12)"
    );
    assert_eq!(letter["reviewed_by"], "ops-1");
    assert_eq!(apis.sent().await, 0, "a discard sends nothing");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn bad_input_gets_a_4xx_naming_the_problem_and_changes_nothing(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Permanent).await;
    let before = fingerprint(&pool).await;
    let long_reason = json!({"reason": "x".repeat(1001)}).to_string();
    let cases: Vec<(ApiRequest, u16, &str)> = vec![
        (
            request("GET", &format!("{LETTERS}/not-a-uuid"), ops()),
            400,
            "invalid_parameter",
        ),
        (replay("12345"), 400, "invalid_parameter"),
        (
            discard("zzz", r#"{"reason": "x"}"#),
            400,
            "invalid_parameter",
        ),
        (
            list(&[("cursor", "bm90LWEtY3Vyc29y")]),
            400,
            "invalid_parameter",
        ),
        (list(&[("cursor", "%%%")]), 400, "invalid_parameter"),
        (list(&[("status", "open")]), 400, "invalid_parameter"),
        (list(&[("error_kind", "timeout")]), 400, "invalid_parameter"),
        (list(&[("limit", "0")]), 400, "invalid_parameter"),
        (list(&[("limit", "100000")]), 400, "invalid_parameter"),
        (list(&[("limit", "-1")]), 400, "invalid_parameter"),
        (list(&[("stauts", "replayed")]), 400, "invalid_parameter"),
        (
            list(&[("created_from", "last tuesday")]),
            400,
            "invalid_parameter",
        ),
        (discard(id, "reason: because"), 400, "invalid_json"),
        (discard(id, "[\"because\"]"), 422, "invalid_body"),
        (discard(id, &long_reason), 422, "invalid_body"),
        (
            discard(id, r#"{"reason": "ok", "force": true}"#),
            422,
            "invalid_body",
        ),
        (
            request("DELETE", &format!("{LETTERS}/{id}"), ops()),
            405,
            "method_not_allowed",
        ),
        (
            request("GET", "/v1/core/dead-letters/x/y/z", ops()),
            404,
            "not_found",
        ),
    ];
    for (req, status, code) in cases {
        let response = apis.call(req.clone()).await;
        assert_error(&response, status, code);
        assert_eq!(fingerprint(&pool).await, before, "changed by {req:?}");
    }
    // A route of another function is not served here (the gateway never sends it).
    let elsewhere = apis.read.handle(&discard(id, r#"{"reason": "x"}"#)).await;
    assert_error(&elsewhere, 404, "not_found");
    assert_eq!(fingerprint(&pool).await, before);
    assert_eq!(apis.sent().await, 0, "nothing was sent");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn unknown_letters_are_404_and_reviewed_ones_409_without_a_second_send(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let unknown = Uuid::new_v4();
    assert_error(
        &apis
            .call(request("GET", &format!("{LETTERS}/{unknown}"), ops()))
            .await,
        404,
        "not_found",
    );
    assert_error(&apis.call(replay(unknown)).await, 404, "not_found");
    assert_error(
        &apis.call(discard(unknown, r#"{"reason": "x"}"#)).await,
        404,
        "not_found",
    );

    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let first = apis.call(replay(id)).await;
    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(first.body["letter"]["status"], "replayed");
    assert_eq!(first.body["replay"]["fence_exists"], false);
    let after_first = fingerprint(&pool).await;
    let again = apis.call(replay(id)).await;
    assert_error(&again, 409, "not_pending");
    assert!(
        again.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ops-1")
    );
    assert_error(
        &apis.call(discard(id, r#"{"reason": "late"}"#)).await,
        409,
        "not_pending",
    );
    assert_eq!(fingerprint(&pool).await, after_first);
    assert_eq!(apis.sent().await, 1, "one replay, one message");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_poison_letter_without_a_job_id_cannot_be_replayed(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let letter = TestLetter {
        message_id: "m-poison".into(),
        attempts: 1,
        kind: ErrorKind::Poison,
        last_error: "not JSON".into(),
        ..TestLetter::new(
            None,
            &e2e::consumer_name(),
            &apis.queue.name,
            "not json at all",
        )
    };
    let id = record_letter(&pool, &letter, chrono::Utc::now()).await;
    let before = fingerprint(&pool).await;
    assert_error(&apis.call(replay(id.0)).await, 409, "not_replayable");
    assert_eq!(fingerprint(&pool).await, before);
    assert_eq!(apis.sent().await, 0);
    let discarded = apis
        .call(discard(id.0, r#"{"reason": "garbage from a test client"}"#))
        .await;
    assert_eq!(discarded.status, 200, "{:#}", discarded.body);
}

/// Issue 13: a replay used to send before it committed, so a send followed by a failed
/// commit left a letter that could later be discarded, although its message was out. A replay
/// now records itself first: if the queue then refuses the message, the letter says `queued`,
/// no discard can close it, and the scheduled run sends it once the queue takes it.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_is_recorded_before_it_is_sent_and_a_refused_send_is_sent_later(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let queue = format!("late-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let (id, _) = seed_letter(&pool, &queue, ErrorKind::Exhausted).await;
    let response = apis.call(replay(id)).await;
    assert_eq!(response.status, 202, "{:#}", response.body);
    assert_eq!(response.body["replay"]["sent"], false);
    assert_eq!(response.body["letter"]["status"], "replayed");
    assert_eq!(response.body["letter"]["replay_outcome"], "queued");
    assert_error(
        &apis
            .call(discard(id, r#"{"reason": "changed my mind"}"#))
            .await,
        409,
        "not_pending",
    );

    // The queue comes back; the scheduled run, a minute later, sends what stayed queued.
    let late = create_queue(&apis.sqs, &queue, &[]).await;
    let scheduled = shared::upkeep::ScheduledRun {
        pool: pool.clone(),
        clock: Arc::new(shared::clock::ManualClock::new(
            chrono::Utc::now() + chrono::Duration::minutes(2),
        )),
        alerter: None,
        sweep: shared_testkit::SWEEP,
        escalate_after: Duration::from_secs(3 * 86_400),
        replayer: Some(Replayer::new(apis.sqs.clone())),
        heartbeat: None,
        replay_alert_after: shared::config::REPLAY_ALERT_AFTER,
    };
    let report = scheduled.run(None).await;
    assert_eq!(
        report.replays,
        Ok(shared::upkeep::ReplaySends { sent: 1, failed: 0 })
    );
    assert_eq!(depth(&apis.sqs, &late).await, 1);
    let letter = shared::dead_letter::letter(&pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        letter.replay_outcome,
        Some(shared::dead_letter::ReplayOutcome::Sent)
    );
    assert!(letter.replay_message_id.is_some());
    let again = scheduled.run(None).await;
    assert_eq!(
        again.replays,
        Ok(shared::upkeep::ReplaySends::default()),
        "sent once"
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_list_pages_newest_first_by_cursor_and_filters_without_payloads(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let mut seeded = Vec::new();
    for i in 0..25 {
        let kind = if i % 5 == 0 {
            ErrorKind::Crashed
        } else {
            ErrorKind::Exhausted
        };
        seeded.push(seed_letter(&pool, &apis.queue.name, kind).await.0);
    }
    let (other_queue, _) = seed_letter(&pool, "other-queue", ErrorKind::Permanent).await;

    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("limit", "10"), ("queue", apis.queue.name.as_str())];
        if let Some(c) = &cursor {
            query.push(("cursor", c));
        }
        let page = apis.call(list(&query)).await;
        assert_eq!(page.status, 200, "{:#}", page.body);
        let items = page.body["items"].as_array().unwrap().clone();
        for item in &items {
            assert!(item.get("payload").is_none(), "no payloads in a list");
        }
        pages.push(items);
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
    let listed: Vec<&Value> = pages.iter().flatten().collect();
    let ids: Vec<Uuid> = listed
        .iter()
        .map(|i| i["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        25,
        "each letter once"
    );
    let mut newest_first = seeded
        .iter()
        .map(|d: &DeadLetterId| d.0)
        .collect::<Vec<_>>();
    newest_first.reverse();
    assert_eq!(ids, newest_first, "newest first");
    assert!(!ids.contains(&other_queue.0), "filtered by queue");

    let crashed = apis.call(list(&[("error_kind", "crashed")])).await;
    let kinds: Vec<&Value> = crashed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["error_kind"])
        .collect();
    assert_eq!(kinds.len(), 5);
    assert!(kinds.iter().all(|k| *k == "crashed"));

    apis.call(discard(seeded[3], r#"{"reason": "test"}"#)).await;
    let discarded = apis.call(list(&[("status", "discarded")])).await;
    assert_eq!(discarded.body["items"][0]["id"], json!(seeded[3].0));
    assert_eq!(discarded.body["items"].as_array().unwrap().len(), 1);
    let future = apis
        .call(list(&[("created_from", "2999-01-01T00:00:00Z")]))
        .await;
    assert_eq!(future.body["items"], json!([]));
    assert_eq!(future.body["next_cursor"], Value::Null);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn get_returns_the_whole_letter_with_its_fence_state(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, job) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let got = apis
        .call(request("GET", &format!("{LETTERS}/{id}"), ops()))
        .await;
    assert_eq!(got.status, 200, "{:#}", got.body);
    assert_eq!(got.body["letter"]["payload"]["job_id"], json!(job.0));
    assert_eq!(
        got.body["letter"]["last_error"],
        "database unavailable on every attempt"
    );
    assert_eq!(got.body["fence_exists"], false);
    assert_eq!(got.body["failed_replays"], json!([]));
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn concurrent_replays_and_discards_of_one_letter_let_exactly_one_win(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let apis = Arc::new(apis);
    let mut replay_wins = 0;
    for round in 0..10 {
        let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..8 {
            let apis = apis.clone();
            tasks.spawn(async move {
                let req = if (i + round) % 2 == 0 {
                    replay(id)
                } else {
                    discard(id, r#"{"reason": "racing"}"#)
                };
                (req.path.ends_with("/replay"), apis.call(req).await)
            });
        }
        let outcomes = tasks.join_all().await;
        let winners: Vec<_> = outcomes.iter().filter(|(_, r)| r.status == 200).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:#?}");
        for (_, loser) in outcomes.iter().filter(|(_, r)| r.status != 200) {
            assert_eq!(loser.status, 409, "{:#}", loser.body);
        }
        let (won_by_replay, response) = winners[0];
        let expected = if *won_by_replay {
            "replayed"
        } else {
            "discarded"
        };
        assert_eq!(response.body["letter"]["status"], expected);
        replay_wins += u64::from(*won_by_replay);
        assert_eq!(
            apis.sent().await,
            replay_wins,
            "round {round}: one message per replay won"
        );
    }
}

/// A support ticket names a job, a correlation id, a tenant or a message: each finds its letter.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn any_letter_is_found_by_job_correlation_tenant_or_message(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (target, job) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    for _ in 0..5 {
        seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    }
    let letter = shared::dead_letter::letter(&pool, target)
        .await
        .unwrap()
        .unwrap();
    let found = |query: Vec<(&'static str, String)>| {
        let apis = &apis;
        async move {
            let pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let response = apis.call(list(&pairs)).await;
            assert_eq!(response.status, 200, "{:#}", response.body);
            response.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let id = vec![target.to_string()];
    assert_eq!(found(vec![("job_id", job.to_string())]).await, id);
    assert_eq!(
        found(vec![("message_id", letter.message_id.clone())]).await,
        id
    );
    // The seeded letters share a correlation id; each has a tenant of its own.
    assert_eq!(
        found(vec![("correlation_id", "api-test".into())])
            .await
            .len(),
        6
    );
    let tenant = letter.tenant_id.expect("the envelope's tenant").to_string();
    assert_eq!(found(vec![("tenant_id", tenant)]).await, id);
    // By the first hex digits of its id, as git takes a commit's (dlq show 481e82ee).
    let whole = target.to_string();
    assert_eq!(found(vec![("id_prefix", whole[..8].to_owned())]).await, id);
    assert_eq!(found(vec![("id_prefix", whole.to_uppercase())]).await, id);
    let digit = &whole[..1];
    let mut expected: Vec<String> =
        sqlx::query_scalar("SELECT id::text FROM core.dead_letters WHERE id::text LIKE $1 || '%'")
            .bind(digit)
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut by_one_digit = found(vec![("id_prefix", digit.to_owned())]).await;
    expected.sort();
    by_one_digit.sort();
    assert_eq!(
        by_one_digit, expected,
        "every letter whose id starts with {digit}, no other"
    );
    for (name, value) in [
        ("id_prefix", "xyz"),
        ("id_prefix", "-"),
        ("id_prefix", "481e82ee-0733-4a23-bad4-7a61e82b17780"),
        ("job_id", "nope"),
        ("tenant_id", "1"),
        ("group_id", "x"),
        ("group_id", "0"),
    ] {
        assert_error(
            &apis.call(list(&[(name, value)])).await,
            400,
            "invalid_parameter",
        );
    }
    let summary = &apis.call(list(&[("job_id", &job.to_string())])).await.body["items"][0];
    assert_eq!(summary["fence_exists"], false, "{summary:#}");
    assert!(summary["group_id"].as_i64().is_some(), "{summary:#}");
}

/// Failures grouped as they page: the groups resource, letters by group, a group resolved once
/// its letters are reviewed, and the same error format.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn groups_list_their_counts_and_letters_are_listed_by_group(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let mut exhausted = Vec::new();
    for _ in 0..3 {
        exhausted.push(
            seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted)
                .await
                .0,
        );
    }
    seed_letter(&pool, &apis.queue.name, ErrorKind::Permanent).await;
    let groups = |query: &[(&str, &str)]| {
        let mut r = request("GET", "/v1/core/dead-letter-groups", ops());
        r.query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        r
    };
    let open = apis.call(groups(&[])).await;
    assert_eq!(open.status, 200, "{:#}", open.body);
    let items = open.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    let group = items
        .iter()
        .find(|g| g["error_kind"] == "exhausted")
        .expect("the exhausted group");
    assert_eq!(
        (
            group["letter_count"].as_i64(),
            group["pending_count"].as_i64()
        ),
        (Some(3), Some(3))
    );
    assert_eq!(group["status"], "open");
    assert_eq!(group["consumer"], "award-points");
    assert_eq!(group["pattern"], "database unavailable on every attempt");
    let id = group["id"].as_i64().unwrap();

    let letters = apis.call(list(&[("group_id", &id.to_string())])).await;
    let mut listed: Vec<&str> = letters.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = exhausted.iter().map(|l| l.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);

    for letter in &exhausted {
        let r = apis
            .call(discard(
                letter,
                r#"{"reason": "provider fixed it by hand"}"#,
            ))
            .await;
        assert_eq!(r.status, 200, "{:#}", r.body);
    }
    let one = apis
        .call(request(
            "GET",
            &format!("/v1/core/dead-letter-groups/{id}"),
            ops(),
        ))
        .await;
    assert_eq!(one.status, 200, "{:#}", one.body);
    assert_eq!(one.body["group"]["status"], "resolved");
    assert_eq!(one.body["group"]["pending_count"], 0);
    assert_eq!(
        apis.call(groups(&[])).await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        apis.call(groups(&[("status", "all")])).await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    for (req, status, code) in [
        (groups(&[("status", "closed")]), 400, "invalid_parameter"),
        (groups(&[("stauts", "open")]), 400, "invalid_parameter"),
        (
            request("GET", "/v1/core/dead-letter-groups/999999", ops()),
            404,
            "not_found",
        ),
        (
            request("GET", "/v1/core/dead-letter-groups/abc", ops()),
            400,
            "invalid_parameter",
        ),
    ] {
        assert_error(&apis.call(req).await, status, code);
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_keeps_the_reason_it_was_given(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    for bad in [r#"{"reason": "  "}"#, r#"{"why": "x"}"#, "not json"] {
        let response = apis.call(with_body(replay(id), bad)).await;
        assert!(
            matches!(response.status, 400 | 422),
            "{bad}: {:#}",
            response.body
        );
    }
    assert_eq!(
        fingerprint(&pool).await,
        before,
        "a refused replay changes nothing"
    );
    let response = apis
        .call(with_body(
            replay(id),
            r#"{"reason": "ledger back after INC-42"}"#,
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(
        response.body["letter"]["replay_reason"],
        "ledger back after INC-42"
    );
}

// Issue 22, item 7: every value an operator types is bounded and checked before it reaches SQL,
// an index or a typed column; a value out of its class is a 4xx naming the field, never a 500.

const GROUPS: &str = "/v1/core/dead-letter-groups";

fn list_groups(query: &[(&str, &str)]) -> ApiRequest {
    let mut r = request("GET", GROUPS, ops());
    r.query = query
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

/// Base64url without padding, as the API's cursors are written, of any bytes.
fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// PostgreSQL's earliest `timestamptz`, 4714-11-24 00:00:00 UTC BC, in Unix microseconds.
const PG_MIN_MICROS: i64 = -210_866_803_200_000_000;

/// An error that names `field` and is short enough to read: a hostile value is not echoed whole.
fn assert_names(response: &ApiResponse, status: u16, code: &str, field: &str, what: &str) {
    assert_eq!(response.status, status, "{what}: {:#}", response.body);
    assert_error(response, status, code);
    let message = response.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(field), "{what}: names {field}: {message}");
    assert!(
        message.len() <= 600,
        "{what}: {} bytes of message",
        message.len()
    );
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_cursor_outside_postgres_time_range_is_a_400_not_a_500(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    let id = Uuid::new_v4();
    let too_early = [
        PG_MIN_MICROS - 1,
        -3 * 10_i64.pow(17),
        -8_000_000_000_000_000_000,
        -8_334_601_228_800_000_000, // chrono's earliest day, -262143-01-01
    ];
    // Past chrono's last day (262142-12-31) and PostgreSQL's (294276-12-31), and past i64.
    let beyond = [
        i64::MIN.to_string(),
        i64::MAX.to_string(),
        "8210298412800000000".into(),
        "9224318016000000000".into(),
        "18446744073709551616".into(),
    ];
    let garbage = [
        "",
        "1e5",
        "0x10",
        "--1",
        "+-1",
        " 1",
        "1 ",
        "١٢",
        "99999999999999999999999",
        "NaN",
        "infinity",
        "-infinity",
        "1.5",
        "\u{0}",
        "1\u{0}",
    ];
    let mut cases: Vec<(String, String)> = Vec::new();
    let times = too_early.iter().map(i64::to_string).chain(beyond);
    for micros in times {
        cases.push((
            "letters".into(),
            b64url(format!("v1|{micros}|{id}").as_bytes()),
        ));
        cases.push(("groups".into(), b64url(format!("g1|{micros}|7").as_bytes())));
    }
    for micros in garbage {
        cases.push((
            "letters".into(),
            b64url(format!("v1|{micros}|{id}").as_bytes()),
        ));
        cases.push(("groups".into(), b64url(format!("g1|{micros}|7").as_bytes())));
    }
    for id in ["", "x", "\u{0}", "99999999999999999999", "1|2"] {
        cases.push(("letters".into(), b64url(format!("v1|0|{id}").as_bytes())));
        cases.push(("groups".into(), b64url(format!("g1|0|{id}").as_bytes())));
    }
    let huge = b64url(format!("v1|0|{}", "9".repeat(10_000)).as_bytes());
    cases.push(("letters".into(), huge.clone()));
    cases.push(("groups".into(), huge));
    cases.push(("letters".into(), b64url(&[0xff, 0xfe, b'|', 0x80])));
    cases.push(("groups".into(), "a".repeat(100_000)));
    for (route, cursor) in &cases {
        let req = if route == "letters" {
            list(&[("cursor", cursor)])
        } else {
            list_groups(&[("cursor", cursor)])
        };
        let response = apis.call(req).await;
        let what = format!("{route} cursor {:?}", cursor.get(..60).unwrap_or(cursor));
        assert_names(&response, 400, "invalid_parameter", "`cursor`", &what);
    }
    // The earliest time PostgreSQL holds is still a position (nothing is older).
    for (route, cursor) in [
        (
            "letters",
            b64url(format!("v1|{PG_MIN_MICROS}|{id}").as_bytes()),
        ),
        ("groups", b64url(format!("g1|{PG_MIN_MICROS}|7").as_bytes())),
    ] {
        let req = if route == "letters" {
            list(&[("cursor", &cursor)])
        } else {
            list_groups(&[("cursor", &cursor), ("status", "all")])
        };
        let response = apis.call(req).await;
        assert_eq!(response.status, 200, "{route}: {:#}", response.body);
        assert_eq!(response.body["items"], json!([]), "{route}");
    }
    assert_eq!(fingerprint(&pool).await, before);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn every_filter_out_of_its_class_is_a_400_naming_it_before_any_sql(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    let kb10 = "c".repeat(10_000);
    // 129 characters but 257 bytes: longer than the 256 bytes a letter keeps of a correlation id.
    let wide = format!("{}x", "é".repeat(128));
    let text_filters = ["queue", "consumer", "correlation_id", "message_id"];
    let mut cases: Vec<(&str, String)> = Vec::new();
    for name in text_filters {
        for bad in [
            "",
            " ",
            "a\u{0}b",
            "\u{0}",
            "a\u{7}",
            "tab\there",
            "line\nbreak",
            "\u{7f}",
            "\u{9b}31m",
            kb10.as_str(),
            wide.as_str(),
        ] {
            cases.push((name, bad.to_owned()));
        }
    }
    for bad in [
        "a".repeat(81),
        "a b".into(),
        "q;drop".into(),
        "é".into(),
        "q\u{200b}".into(),
    ] {
        cases.push(("queue", bad));
    }
    for bad in [
        "Award-Points".to_owned(),
        "a".repeat(129),
        "a b".into(),
        "a/b".into(),
    ] {
        cases.push(("consumer", bad));
    }
    for name in ["job_id", "tenant_id"] {
        for bad in [
            "nope",
            "1",
            "",
            "00000000-0000-0000-0000-00000000000g",
            "\u{0}",
            &kb10,
        ] {
            cases.push((name, bad.to_owned()));
        }
    }
    for bad in [
        "x",
        "0",
        "-1",
        "9223372036854775808",
        "1e3",
        "1.0",
        " 1",
        "",
        &kb10,
    ] {
        cases.push(("group_id", bad.to_owned()));
    }
    for bad in [
        "0",
        "-1",
        "201",
        "4294967296",
        "99999999999999999999999",
        "1e2",
        "ten",
        "",
        "\u{0}",
    ] {
        cases.push(("limit", bad.to_owned()));
    }
    for name in ["created_from", "created_before"] {
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "+275760-09-13T00:00:00Z",
            "-4714-11-24T00:00:00Z",
            "2026-11-30",
            "",
            &kb10,
        ] {
            cases.push((name, bad.to_owned()));
        }
    }
    for name in ["status", "error_kind"] {
        for bad in ["", "open\u{0}", "PENDING_REVIEW", &kb10] {
            cases.push((name, bad.to_owned()));
        }
    }
    let group_parameters = ["queue", "consumer", "limit", "error_kind"];
    for (name, value) in &cases {
        let shown = value.get(..40).unwrap_or(value);
        let mut requests = vec![(list(&[(name, value)]), format!("{name}={shown:?}"))];
        if group_parameters.contains(name) {
            let groups = list_groups(&[(name, value)]);
            requests.push((groups, format!("groups {name}={shown:?}")));
        }
        for (request, what) in requests {
            let response = apis.call(request).await;
            let field = format!("`{name}`");
            assert_names(&response, 400, "invalid_parameter", &field, &what);
        }
    }
    // A name that is not a parameter, however long, is named but not echoed whole.
    for r in [list(&[(&kb10, "x")]), list_groups(&[(&kb10, "x")])] {
        assert_names(
            &apis.call(r).await,
            400,
            "invalid_parameter",
            "unknown",
            "long name",
        );
    }
    // Given twice, even with the same value.
    for r in [
        list(&[("limit", "5"), ("limit", "5")]),
        list_groups(&[("queue", "a"), ("queue", "b")]),
    ] {
        assert_names(
            &apis.call(r).await,
            400,
            "invalid_parameter",
            "more than once",
            "twice",
        );
    }
    // Path ids: a letter's is a UUID, a group's a positive i64; neither is echoed whole.
    for id in [
        kb10.as_str(),
        "\u{0}",
        "%00",
        "00000000-0000-0000-0000-00000000000g",
        "x y",
    ] {
        for (method, path) in [
            ("GET", format!("{LETTERS}/{id}")),
            ("POST", format!("{LETTERS}/{id}/replay")),
            ("POST", format!("{LETTERS}/{id}/discard")),
        ] {
            let r = with_body(request(method, &path, ops()), r#"{"reason": "x"}"#);
            let what = format!("{method} {:?}", path.get(..60).unwrap_or(&path));
            assert_names(&apis.call(r).await, 400, "invalid_parameter", "id", &what);
        }
    }
    for id in [
        kb10.as_str(),
        "0",
        "-1",
        "9223372036854775808",
        "1e3",
        "\u{0}",
    ] {
        let response = apis
            .call(request("GET", &format!("{GROUPS}/{id}"), ops()))
            .await;
        assert_names(&response, 400, "invalid_parameter", "`id`", "group id");
    }
    // The largest group id is a well-formed id of no group.
    let largest = apis
        .call(request("GET", &format!("{GROUPS}/{}", i64::MAX), ops()))
        .await;
    assert_error(&largest, 404, "not_found");
    // At the bounds, each is accepted.
    let at_bounds: Vec<(&str, String)> = vec![
        ("correlation_id", "é".repeat(128)),
        ("message_id", "m".repeat(256)),
        ("queue", "q".repeat(80)),
        ("queue", "jobs-1.fifo".into()),
        ("consumer", "c".repeat(128)),
        ("limit", "200".into()),
        ("group_id", i64::MAX.to_string()),
        ("created_from", "0001-01-01T00:00:00Z".into()),
        ("created_before", "9999-12-31T23:59:59.999999Z".into()),
    ];
    for (name, value) in &at_bounds {
        let response = apis.call(list(&[(name, value)])).await;
        assert_eq!(response.status, 200, "{name}: {:#}", response.body);
    }
    assert_eq!(fingerprint(&pool).await, before);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_reason_of_only_control_characters_is_rejected(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    let invisible = [
        "\u{1}\u{2}\u{3}\u{7}",
        "\u{7f}",
        "\u{80}\u{9f}",
        " \u{1b} ",
        "\u{0}",
        "\u{2066}\u{2069}",
        "\u{202e}",
        "\u{e0020}\u{e007f}",
        "\u{fe0f}\u{fe00}",
        "\u{3164}",
        "\u{115f}\u{1160}",
        "\u{ffa0}",
        "\u{2800}",
        "\u{34f}",
        "\u{180b}",
        "\u{61c}",
        "\u{fff9}",
        "\u{1d173}",
        "\u{200b}\u{2060}\u{feff}",
        "\u{85}\u{a0}\u{3000}",
    ];
    // Visible text around a character that is not plain text (terminal escapes, NUL, bell).
    let not_plain = [
        "fixed\u{1b}[2J by hand",
        "a\u{0}b",
        "ring \u{7} the bell",
        "\u{9b}31m red",
        "back\u{8}space",
    ];
    let too_long = ["x".repeat(1001), "é".repeat(1001), "😀".repeat(1001)];
    for reason in invisible
        .iter()
        .chain(&not_plain)
        .map(|r| r.to_string())
        .chain(too_long)
    {
        let body = json!({ "reason": reason }).to_string();
        for r in [discard(id, &body), with_body(replay(id), &body)] {
            let route = r.path.rsplit('/').next().unwrap().to_owned();
            let response = apis.call(r).await;
            let what = format!("{route} {:?}", reason.get(..40).unwrap_or(&reason));
            assert_names(&response, 422, "invalid_body", "`reason`", &what);
        }
    }
    assert_eq!(
        fingerprint(&pool).await,
        before,
        "a refused reason changes nothing"
    );
    assert_eq!(apis.sent().await, 0, "nothing was sent");
    // Plain text, at the bound, with line breaks and tabs, kept as given (trimmed).
    let (other, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let longest = format!("  {}\n", "é".repeat(1000));
    let response = apis
        .call(discard(id, &json!({ "reason": longest }).to_string()))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(response.body["letter"]["discard_reason"], "é".repeat(1000));
    let multi = "ledger back after INC-42:\n\tsee the ticket\r\nfor the list";
    let response = apis
        .call(with_body(
            replay(other),
            &json!({ "reason": multi }).to_string(),
        ))
        .await;
    assert_eq!(response.status, 200, "{:#}", response.body);
    assert_eq!(response.body["letter"]["replay_reason"], multi);
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_body_that_is_not_the_json_asked_for_is_a_4xx_json_error(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let (id, _) = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted).await;
    let before = fingerprint(&pool).await;
    let deep = format!("{}{}", "[".repeat(1_000), "]".repeat(1_000));
    let padded = format!("{}{{\"reason\": \"x\"}}", " ".repeat(1 << 20));
    let big_reason = json!({"reason": "x".repeat(1 << 20)}).to_string();
    let big_field = json!({"reason": "x", "pad": "p".repeat(100_000)}).to_string();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{\"reason\": \"x\"".to_vec(), 400, "invalid_json"),
        (b"{reason: \"x\"}".to_vec(), 400, "invalid_json"),
        (b"\xff\xfe{\"reason\": \"x\"}".to_vec(), 400, "invalid_json"),
        (b"{\"reason\": \"\xff\"}".to_vec(), 400, "invalid_json"),
        (br#"{"reason": "\ud800"}"#.to_vec(), 400, "invalid_json"),
        (
            b"\xef\xbb\xbf{\"reason\": \"x\"}".to_vec(),
            400,
            "invalid_json",
        ),
        (
            br#"{"reason": "x"} {"reason": "y"}"#.to_vec(),
            400,
            "invalid_json",
        ),
        // Nested deeper than the parser reads: not JSON it takes. Not an object at all, or an
        // unknown field (skipped without reading it deeply): 422.
        (
            format!(r#"{{"reason": {deep}}}"#).into_bytes(),
            400,
            "invalid_json",
        ),
        (
            format!(r#"{{"pad": {deep}, "reason": "x"}}"#).into_bytes(),
            422,
            "invalid_body",
        ),
        (deep.into_bytes(), 422, "invalid_body"),
        (b"null".to_vec(), 422, "invalid_body"),
        (b"\"x\"".to_vec(), 422, "invalid_body"),
        (b"1e99999".to_vec(), 422, "invalid_body"),
        (br#"{"reason": ["x"]}"#.to_vec(), 422, "invalid_body"),
        (
            br#"{"reason": {"text": "x"}}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (br#"{"reason": true}"#.to_vec(), 422, "invalid_body"),
        (br#"{"reason": 1e99999}"#.to_vec(), 422, "invalid_body"),
        (br#"{"Reason": "x"}"#.to_vec(), 422, "invalid_body"),
        (
            br#"{"reason": "x", "reason": "y"}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            br#"{"reason": "x", "reason": "x"}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (padded.into_bytes(), 413, "body_too_large"),
        (big_reason.into_bytes(), 413, "body_too_large"),
        (big_field.into_bytes(), 413, "body_too_large"),
    ];
    for (body, status, code) in &cases {
        for path in [
            format!("{LETTERS}/{id}/discard"),
            format!("{LETTERS}/{id}/replay"),
        ] {
            let mut r = request("POST", &path, ops());
            r.body = body.clone();
            let response = apis.call(r).await;
            let what = format!(
                "{path}: {:?}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
            assert_eq!(response.status, *status, "{what}: {:#}", response.body);
            assert_error(&response, *status, code);
        }
    }
    assert_eq!(fingerprint(&pool).await, before);
    assert_eq!(apis.sent().await, 0);
}

mod never_a_5xx {
    use super::*;
    use dead_letter_api::api::list_query::{GROUP_PARAMETERS, LIST_PARAMETERS};
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};

    fn generate<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
        strategy.new_tree(runner).expect("a value").current()
    }

    /// What an operator (or a script gone wrong) can put in one query value.
    fn value() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| n.to_string()),
            "[+-]?[0-9]{15,40}",
            Just("1e308".to_owned()),
        ];
        let time = "[+-]?[0-9]{4,6}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|z|[+-][0-9]{2}:[0-9]{2})?";
        prop_oneof![
            prop::sample::select(vec![
                "pending_review",
                "all",
                "open",
                "crashed",
                "50",
                "award-points",
                "points-award-jobs",
                "api-test",
            ])
            .prop_map(str::to_owned),
            any::<String>(),
            "[\\x00-\\x1f\\x7f-\\x9f\u{200b}-\u{200f}\u{feff}]{0,6}",
            number,
            time,
            cursor(),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| b64url(&b)),
            (0usize..3000, any::<char>()).prop_map(|(n, c)| c.to_string().repeat(n)),
        ]
    }

    /// A cursor of the API's shape (version, time in microseconds, id) with any parts.
    fn cursor() -> impl Strategy<Value = String> {
        let micros = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            (-8_400_000_000_000_000_000i64..-200_000_000_000_000_000).prop_map(|n| n.to_string()),
            (0i64..4_000_000_000_000_000).prop_map(|n| n.to_string()),
            ".{0,12}",
        ];
        let id = prop_oneof![
            any::<u128>().prop_map(|n| Uuid::from_u128(n).to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            ".{0,12}",
        ];
        (
            prop::sample::select(vec!["v1", "g1", "v1", "g1", "", "v2"]),
            micros,
            id,
        )
            .prop_map(|(v, m, i)| b64url(format!("{v}|{m}|{i}").as_bytes()))
    }

    fn name() -> impl Strategy<Value = String> {
        let mut names: Vec<&str> = LIST_PARAMETERS.to_vec();
        names.extend(GROUP_PARAMETERS);
        prop_oneof![
            4 => prop::sample::select(names).prop_map(str::to_owned),
            1 => any::<String>(),
        ]
    }

    fn reason_body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            any::<String>().prop_map(|r| json!({ "reason": r }).to_string().into_bytes()),
            "[\\x00-\\x1f\\x7f-\\x9f\u{2060}-\u{206f}\u{e0000}-\u{e007f} ]{1,8}"
                .prop_map(|r| json!({ "reason": r }).to_string().into_bytes()),
            (0usize..1100, any::<char>()).prop_map(|(n, c)| {
                json!({ "reason": c.to_string().repeat(n) })
                    .to_string()
                    .into_bytes()
            }),
            prop::collection::vec(any::<u8>(), 0..200),
        ]
    }

    /// Any query on the two lists, any cursor, any reason: a 4xx JSON error or a success, never
    /// a 5xx, and a 4xx changes nothing.
    #[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
    async fn no_query_cursor_or_reason_an_operator_sends_gets_a_5xx(pool: PgPool) {
        let (pool, apis) = setup(pool).await;
        let mut runner = TestRunner::new(Config::default());
        let query = prop_oneof![
            prop::collection::vec((name(), value()), 0..4),
            cursor().prop_map(|c| vec![("cursor".to_owned(), c)]),
        ];
        let mut letter = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted)
            .await
            .0;
        for case in 0..600 {
            let request = if case % 3 == 2 {
                let route = if case % 2 == 0 { "discard" } else { "replay" };
                let mut r = request("POST", &format!("{LETTERS}/{letter}/{route}"), ops());
                r.body = generate(&mut runner, &reason_body());
                r
            } else {
                let pairs = generate(&mut runner, &query);
                let mut r = request("GET", if case % 3 == 0 { LETTERS } else { GROUPS }, ops());
                r.query = pairs;
                r
            };
            let before = fingerprint(&pool).await;
            let response = apis.call(request.clone()).await;
            let shown = format!(
                "{:?} {:?}",
                request.path,
                request
                    .query
                    .iter()
                    .map(|(k, v)| (
                        k.chars().take(40).collect::<String>(),
                        v.chars().take(60).collect::<String>()
                    ))
                    .collect::<Vec<_>>()
            );
            assert!(
                response.status < 500,
                "{shown} → {} {:#}",
                response.status,
                response.body
            );
            if response.status >= 400 {
                assert!(
                    response.body["error"]["code"].is_string(),
                    "{shown} → {:#}",
                    response.body
                );
                assert!(response.body["error"]["message"].is_string());
                assert_eq!(
                    fingerprint(&pool).await,
                    before,
                    "{shown}: a 4xx changed something"
                );
            } else if request.method == "POST" {
                letter = seed_letter(&pool, &apis.queue.name, ErrorKind::Exhausted)
                    .await
                    .0;
            }
        }
    }
}

/// Issue 22: a letter of a job whose id another job then committed under was replayable,
/// and the replay answered "already processed" (the other job's fence): a false record of a job
/// that never ran. So was a `conflict` letter. Both are refused now, and nothing is marked.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_whose_job_id_another_job_took_is_not_replayable(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let harness = e2e::harness(
        pool.clone(),
        consumer::AwardPoints::new(e2e::consumer_name()),
    );
    let job_id = Uuid::new_v4();
    let envelope = |points: i64| {
        json!({"job_id": job_id, "tenant_id": Uuid::new_v4(), "correlation_id": "c",
            "payload": {"account_id": "a", "points": points}})
        .to_string()
    };
    let message = |body: &str| shared_testkit::message_on(&apis.queue.name, body, 1);
    let x = envelope(0); // poison: points must be positive
    assert!(harness.process(&message(&x)).await.is_ack());
    let y = envelope(7);
    assert_eq!(
        harness.process(&message(&y)).await,
        shared::harness::RecordOutcome::Processed
    );
    let z = envelope(9); // a third job under the id: a conflict letter
    assert_eq!(
        harness.process(&message(&z)).await.dead_letter_kind(),
        Some(ErrorKind::Conflict)
    );
    let letters = e2e::letters(&pool, shared::ids::JobId(job_id)).await;
    assert_eq!(letters.len(), 2);
    let before = fingerprint(&pool).await;
    for letter in &letters {
        assert_error(&apis.call(replay(letter.id.0)).await, 409, "not_replayable");
    }
    assert_eq!(fingerprint(&pool).await, before);
    assert_eq!(apis.sent().await, 0);
}

/// Issue 34, item 2: the API never advises re-sending a job that committed. A `conflict` letter
/// of a body of the committed job's family of edits (a copy of the original that raced the
/// edit's commit) answered 409 "this job never ran … send it under a new job_id": following it
/// applied the job twice. The fence decides, with the family: the replay is already processed
/// and sends nothing.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_conflict_letter_of_an_edited_jobs_family_is_already_processed_never_resent(
    pool: PgPool,
) {
    let (pool, apis) = setup(pool).await;
    let harness = e2e::harness(
        pool.clone(),
        consumer::AwardPoints::new(e2e::consumer_name()),
    );
    let job_id = Uuid::new_v4();
    let envelope = |points: Value| {
        json!({"job_id": job_id, "tenant_id": Uuid::nil(), "correlation_id": "c",
            "payload": {"account_id": "a", "points": points}})
        .to_string()
    };
    let message = |body: &str| shared_testkit::message_on(&apis.queue.name, body, 1);
    let received = envelope(json!("seven"));
    assert!(harness.process(&message(&received)).await.is_ack());
    let letter = e2e::letters(&pool, shared::ids::JobId(job_id))
        .await
        .remove(0);
    let mut locked =
        shared::dead_letter::lock_letter(&pool, letter.id, std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
    let edited = envelope(json!(7));
    let verdict = shared::dead_letter::Verdict::Replayed {
        outcome: shared::dead_letter::ReplayOutcome::Queued,
        reason: Some("points as a number".into()),
        body: Some(edited.clone()),
    };
    locked
        .mark(&verdict, "ops-1", chrono::Utc::now())
        .await
        .unwrap();
    locked.commit().await.unwrap();
    let replayed = shared::harness::IncomingMessage {
        replay_of: Some(letter.id),
        ..message(&edited)
    };
    assert_eq!(
        harness.process(&replayed).await,
        shared::harness::RecordOutcome::Processed
    );
    // The copy of the original that raced the commit, written as a conflict.
    let raced: Uuid = sqlx::query_scalar(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, created_at, job_digest)
         SELECT job_id, tenant_id, consumer, queue, 'raced-copy', payload, body, 1, 'conflict',
                'raced the edit', now(), job_digest
         FROM core.dead_letters WHERE id = $1 RETURNING id",
    )
    .bind(letter.id.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    let answer = apis.call(replay(raced)).await;
    assert_eq!(answer.status, 200, "{:#}", answer.body);
    assert_eq!(answer.body["letter"]["replay_outcome"], "already_processed");
    assert_eq!(apis.sent().await, 0, "nothing sent");
    assert_eq!(
        consumer::count_awards(&pool, shared::ids::JobId(job_id))
            .await
            .unwrap(),
        1
    );
}

/// `GET /v1/core/processed-jobs/{id}?consumer=…`: a committed job's fence (what a deploy's smoke
/// test and "did this job run?" read), 404 for a job without one, 400 for a bad id or consumer,
/// and only with the read scope.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_processed_job_shows_its_fence_and_one_without_is_404(pool: PgPool) {
    let (pool, apis) = setup(pool).await;
    let job = Uuid::new_v4();
    let tenant = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
         VALUES ($1, 'award-points', $2, now(), now() + interval '14 days')",
    )
    .bind(job)
    .bind(tenant)
    .execute(&pool)
    .await
    .unwrap();
    let get = |id: String, query: &[(&str, &str)], scopes: &[Scope]| {
        let mut r = request(
            "GET",
            &format!("/v1/core/processed-jobs/{id}"),
            Some(caller("ops-1", scopes)),
        );
        r.query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        r
    };
    let found = apis
        .call(get(
            job.to_string(),
            &[("consumer", "award-points")],
            &[Scope::Read],
        ))
        .await;
    assert_eq!(found.status, 200, "{:#}", found.body);
    let fence = &found.body["processed_job"];
    assert_eq!(
        (
            fence["job_id"].as_str(),
            fence["consumer"].as_str(),
            fence["tenant_id"].as_str()
        ),
        (
            Some(job.to_string().as_str()),
            Some("award-points"),
            Some(tenant.to_string().as_str())
        )
    );
    assert!(fence["processed_at"].is_string() && fence["expires_at"].is_string());

    let before = fingerprint(&pool).await;
    let other_consumer = apis
        .call(get(
            job.to_string(),
            &[("consumer", "redeem-reward")],
            &[Scope::Read],
        ))
        .await;
    assert_error(&other_consumer, 404, "not_found");
    let unknown = apis
        .call(get(
            Uuid::new_v4().to_string(),
            &[("consumer", "award-points")],
            &[Scope::Read],
        ))
        .await;
    assert_error(&unknown, 404, "not_found");
    for (id, query) in [
        ("not-a-uuid".to_owned(), vec![("consumer", "award-points")]),
        (job.to_string(), vec![]),
        (job.to_string(), vec![("consumer", "")]),
        (
            job.to_string(),
            vec![("consumer", "award-points"), ("consumer", "x")],
        ),
        (
            job.to_string(),
            vec![("consumer", "award-points"), ("status", "x")],
        ),
    ] {
        let bad = apis.call(get(id.clone(), &query, &[Scope::Read])).await;
        assert_error(&bad, 400, "invalid_parameter");
    }
    let no_scope = apis
        .call(get(
            job.to_string(),
            &[("consumer", "award-points")],
            &[Scope::Replay],
        ))
        .await;
    assert_eq!(no_scope.status, 403, "{:#}", no_scope.body);
    assert_eq!(fingerprint(&pool).await, before, "a read changes nothing");
}
