//! Calling the dead-letter API in tests: requests with a chosen caller, the same request as an
//! API Gateway (HTTP API, payload 2.0) event for the real Lambda binaries, letters to review,
//! and a fingerprint of the tables a 4xx must leave unchanged.

use crate::lambda_host::LambdaHost;
use dead_letter_api::api::{ApiRequest, ApiResponse, Caller, Scope};
use serde_json::{Value, json};
use shared::dead_letter::ErrorKind;
use shared::ids::{DeadLetterId, JobId, TenantId};
use shared_testkit::{TestLetter, record_letter};
use sqlx::PgPool;

/// A caller with subject `sub` and `scopes`.
pub fn caller(sub: &str, scopes: &[Scope]) -> Caller {
    Caller {
        subject: Some(sub.to_owned()),
        scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
    }
}

/// A request without a body or query.
pub fn request(method: &str, path: &str, caller: Option<Caller>) -> ApiRequest {
    ApiRequest {
        method: method.into(),
        path: path.into(),
        caller,
        ..Default::default()
    }
}

/// `request` with a JSON body.
pub fn with_body(mut request: ApiRequest, body: &str) -> ApiRequest {
    request.body = body.as_bytes().to_vec();
    request
}

/// `request` as API Gateway would deliver it: the caller's subject and scopes as JWT claims
/// (`scope` space-separated, as Cognito and most issuers put it), none at all without a caller.
pub fn api_gateway_event(request: &ApiRequest) -> Value {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&request.query)
        .finish();
    let authorizer = request.caller.as_ref().map(|c| {
        let mut claims = json!({"scope": c.scopes.join(" "), "iss": "https://issuer.example"});
        if let Some(sub) = &c.subject {
            claims["sub"] = json!(sub);
        }
        json!({"jwt": {"claims": claims, "scopes": null}})
    });
    let mut context = json!({
        "accountId": "123456789012", "apiId": "local", "domainName": "local.example",
        "domainPrefix": "local", "requestId": uuid::Uuid::new_v4(), "routeKey": "$default",
        "stage": "$default", "time": "30/Nov/2026:12:00:00 +0000", "timeEpoch": 1796040000000u64,
        "http": {"method": request.method, "path": request.path, "protocol": "HTTP/1.1",
                 "sourceIp": "127.0.0.1", "userAgent": "e2e"}
    });
    if let Some(authorizer) = authorizer {
        context["authorizer"] = authorizer;
    }
    json!({
        "version": "2.0", "routeKey": "$default", "rawPath": request.path,
        "rawQueryString": query, "headers": {"content-type": "application/json", "host": "local.example"},
        "requestContext": context,
        "body": String::from_utf8_lossy(&request.body), "isBase64Encoded": false
    })
}

/// Invokes a hosted API function with `request`; returns its status and JSON body.
pub async fn invoke(function: &LambdaHost, request: &ApiRequest) -> ApiResponse {
    let response = function
        .invoke(&api_gateway_event(request))
        .await
        .expect("the API function answers");
    let status = response["statusCode"].as_u64().expect("statusCode") as u16;
    let body = response["body"].as_str().unwrap_or("null");
    ApiResponse {
        status,
        body: serde_json::from_str(body).expect("a JSON body"),
    }
}

/// Writes a `kind` letter for a fresh job of the reference consumer on `queue`, as the harness
/// would (3 points to account `a`); returns (letter, job).
pub async fn seed_letter(pool: &PgPool, queue: &str, kind: ErrorKind) -> (DeadLetterId, JobId) {
    let job_id = JobId(uuid::Uuid::new_v4());
    let payload = json!({"job_id": job_id, "tenant_id": TenantId(uuid::Uuid::new_v4()),
        "correlation_id": "api-test", "payload": {"account_id": "a", "points": 3}});
    (seed_letter_for(pool, queue, kind, &payload).await, job_id)
}

/// Writes a `kind` letter with `envelope` as its payload (its `job_id` as the letter's job).
pub async fn seed_letter_for(
    pool: &PgPool,
    queue: &str,
    kind: ErrorKind,
    envelope: &Value,
) -> DeadLetterId {
    let job_id = envelope["job_id"]
        .as_str()
        .and_then(|j| j.parse().ok())
        .map(JobId);
    let tenant_id = envelope["tenant_id"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .map(TenantId);
    let letter = TestLetter {
        tenant_id,
        kind,
        last_error: "database unavailable on every attempt".into(),
        correlation_id: Some("api-test".into()),
        ..TestLetter::new(
            job_id,
            &crate::consumer_name(),
            queue,
            &envelope.to_string(),
        )
    };
    record_letter(pool, &letter, chrono::Utc::now()).await
}

/// A fingerprint of every dead letter, fence and award: equal before and after means unchanged.
pub async fn fingerprint(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "SELECT concat_ws('/',
            (SELECT md5(coalesce(string_agg(d::text, ',' ORDER BY id), '')) FROM core.dead_letters d),
            (SELECT md5(coalesce(string_agg(p::text, ',' ORDER BY job_id, consumer), '')) FROM core.processed_jobs p),
            (SELECT count(*) FROM reference.point_awards))",
    )
    .fetch_one(pool)
    .await
    .expect("fingerprint")
}
