//! What the tests of bulk operations share (`tests/operations.rs`, `tests/operations_attacks.rs`):
//! the API's three functions in process, an operator, the worker's tools, letters seeded by SQL
//! through the same triggers as any letter, and small reads.

use crate::api_client::{caller, request, with_body};
use crate::event_source::{Queue, create_queue};
use dead_letter_api::api::{Api, ApiRequest, ApiResponse, Scope};
use serde_json::{Value, json};
use shared::clock::SystemClock;
use shared::operations::{self, OperationTools};
use shared::replay::Replayer;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The operations' routes.
pub const OPERATIONS: &str = "/v1/core/dead-letter-operations";

/// The API's three functions, each serving its own routes.
pub struct Apis {
    /// The read function.
    pub read: Api,
    /// The replay function.
    pub replay: Api,
    /// The discard function.
    pub discard: Api,
}

impl Apis {
    #[allow(missing_docs)]
    pub fn new(pool: &PgPool, sqs: &aws_sdk_sqs::Client) -> Self {
        let clock = Arc::new(SystemClock);
        let wait = Duration::from_secs(2);
        Self {
            read: Api::read(pool.clone(), clock.clone(), wait),
            replay: Api::replay(
                pool.clone(),
                clock.clone(),
                wait,
                Replayer::new(sqs.clone()),
            ),
            discard: Api::discard(pool.clone(), clock, wait),
        }
    }

    #[allow(missing_docs)]
    pub async fn call(&self, request: ApiRequest) -> ApiResponse {
        let api = match dead_letter_api::api::function_for(&request.method, &request.path) {
            Some("dead-letters-replay") => &self.replay,
            Some("dead-letters-discard") => &self.discard,
            _ => &self.read,
        };
        api.handle(&request).await
    }

    #[allow(missing_docs)]
    pub async fn post(
        &self,
        path: &str,
        who: dead_letter_api::api::Caller,
        body: &str,
    ) -> ApiResponse {
        self.call(with_body(request("POST", path, Some(who)), body))
            .await
    }

    #[allow(missing_docs)]
    pub async fn start(&self, action: &str, filter: Value) -> Uuid {
        let body = json!({"reason": "partner back after INC-42", "filter": filter}).to_string();
        let answer = self
            .post(&format!("{OPERATIONS}/{action}"), operator(), &body)
            .await;
        assert_eq!(answer.status, 202, "{:#}", answer.body);
        answer.body["operation"]["id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[allow(missing_docs)]
    pub async fn operation(&self, id: Uuid) -> Value {
        let answer = self
            .call(request(
                "GET",
                &format!("{OPERATIONS}/{id}"),
                Some(operator()),
            ))
            .await;
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        answer.body["operation"].clone()
    }

    #[allow(missing_docs)]
    pub async fn cancel(&self, id: Uuid) -> ApiResponse {
        self.post(
            &format!("{OPERATIONS}/{id}/cancel"),
            operator(),
            r#"{"reason": "wrong selection"}"#,
        )
        .await
    }
}

/// The on-call operator, with every scope.
pub fn operator() -> dead_letter_api::api::Caller {
    caller(
        "oncall@example.com",
        &[Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit],
    )
}

/// The worker's tools on `pool`, sending to the local SQS API.
pub fn tools(pool: &PgPool, sqs: &aws_sdk_sqs::Client) -> OperationTools {
    OperationTools {
        pool: pool.clone(),
        clock: Arc::new(SystemClock),
        replayer: Some(Replayer::new(sqs.clone())),
    }
}

/// Works every running operation to its end, in process.
pub async fn work_all(tools: &OperationTools) {
    for _ in 0..400 {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        let round = operations::work(tools, until, 10).await.unwrap();
        if round.operations == 0 && round.failed == 0 {
            return;
        }
    }
    panic!("the operations never ended");
}

/// `n` pending letters of one failure on `queue`, by SQL in one statement through the same
/// triggers as any letter (as tests/tests/operations.rs seeds them).
pub async fn seed(pool: &PgPool, queue: &str, n: i64, kind: &str, with_job: bool, error: &str) {
    // In statements of 2,000 at most: each letter takes an advisory lock of its message until its
    // transaction ends, and thousands at once (with other tests' locks) fill the lock table.
    let mut left = n;
    while left > 0 {
        let now = left.min(2_000);
        seed_once(pool, queue, now, kind, with_job, error).await;
        left -= now;
    }
}

/// One statement of [`seed`].
pub async fn seed_once(
    pool: &PgPool,
    queue: &str,
    n: i64,
    kind: &str,
    with_job: bool,
    error: &str,
) {
    sqlx::query(
        "INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
             body, attempts, error_kind, last_error, created_at)
         SELECT CASE WHEN $5 THEN j END, '00000000-0000-0000-0000-000000000001', 'award-points', $1,
                'm-' || gen_random_uuid(),
                jsonb_build_object('job_id', j, 'tenant_id', '00000000-0000-0000-0000-000000000001',
                                   'payload', jsonb_build_object('account_id', 'a', 'points', i)),
                json_build_object('job_id', j, 'tenant_id', '00000000-0000-0000-0000-000000000001',
                                  'payload', json_build_object('account_id', 'a', 'points', i))::text,
                CASE WHEN $3 = 'poison' THEN 1 ELSE 5 END, $3, $4,
                now() - make_interval(secs => i::float8 / 1000)
         FROM (SELECT i, gen_random_uuid() AS j FROM generate_series(1, $2) AS i) AS jobs",
    )
    .bind(queue)
    .bind(n)
    .bind(kind)
    .bind(error)
    .bind(with_job)
    .execute(pool)
    .await
    .unwrap();
}

/// The first failure group of `queue`.
pub async fn group_of(pool: &PgPool, queue: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT id FROM core.dead_letter_groups WHERE queue = $1 ORDER BY id LIMIT 1",
    )
    .bind(queue)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A number `sql` answers.
pub async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A standard queue of its own on the local SQS API.
pub async fn queue(sqs: &aws_sdk_sqs::Client) -> Queue {
    let name = format!("ops-{}", &Uuid::new_v4().simple().to_string()[..12]);
    create_queue(sqs, &name, &[]).await
}
