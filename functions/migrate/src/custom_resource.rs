//! CloudFormation's custom resource protocol: a request comes in as the invocation's event, and
//! the answer goes to the pre-signed `ResponseURL` as a `PUT`.
//!
//! Invariant: every request gets an answer before the Lambda deadline (a custom resource that
//! never answers holds the deploy for an hour): the work is bounded by the time left, and its
//! failure, a panic included, is answered `FAILED` with the reason, which fails the deploy.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// The id of the one resource this function stands for.
pub const PHYSICAL_ID: &str = "job-harness-schema";

/// A custom resource request (the fields this function reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Request {
    /// `Create`, `Update` or `Delete`.
    pub request_type: RequestType,
    /// Where the answer goes (a pre-signed S3 URL).
    #[serde(rename = "ResponseURL")]
    pub response_url: String,
    /// The stack.
    pub stack_id: String,
    /// This request.
    pub request_id: String,
    /// The resource's logical id in the template.
    pub logical_resource_id: String,
}

/// What CloudFormation asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RequestType {
    /// The stack is created.
    Create,
    /// A deploy changed the resource's properties (the migrate function's version).
    Update,
    /// The resource (or the stack) is deleted.
    Delete,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Response {
    /// `SUCCESS` or `FAILED`.
    pub status: &'static str,
    /// Why, for a failure (shown in the stack's events).
    pub reason: String,
    /// Always [`PHYSICAL_ID`]: the resource is never replaced.
    pub physical_resource_id: &'static str,
    /// Echoed.
    pub stack_id: String,
    /// Echoed.
    pub request_id: String,
    /// Echoed.
    pub logical_resource_id: String,
    /// What was done, for `Fn::GetAtt`.
    pub data: Value,
}

/// CloudFormation keeps at most 4,096 bytes of an answer; the reason is cut well within.
const MAX_REASON_CHARS: usize = 3_000;

impl Response {
    /// The answer to `request`: `Ok(data)` is `SUCCESS`, `Err(reason)` is `FAILED`.
    pub fn to(request: &Request, outcome: Result<Value, String>) -> Self {
        let (status, reason, data) = match outcome {
            Ok(data) => ("SUCCESS", "done".to_owned(), data),
            Err(reason) => (
                "FAILED",
                reason.chars().take(MAX_REASON_CHARS).collect(),
                Value::Null,
            ),
        };
        Self {
            status,
            reason,
            physical_resource_id: PHYSICAL_ID,
            stack_id: request.stack_id.clone(),
            request_id: request.request_id.clone(),
            logical_resource_id: request.logical_resource_id.clone(),
            data,
        }
    }
}

/// PUTs `response` to the request's URL, three tries of at most 5 s each. The pre-signed URL
/// was signed for an empty `Content-Type`.
pub async fn send(http: &reqwest::Client, url: &str, response: &Response) -> Result<(), String> {
    let body = serde_json::to_vec(response).map_err(|e| e.to_string())?;
    let mut last = String::new();
    for attempt in 1..=3 {
        let sent = http
            .put(url)
            .header(reqwest::header::CONTENT_TYPE, "")
            .timeout(Duration::from_secs(5))
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("answered {}", r.status().as_u16()),
            Err(e) => last = e.without_url().to_string(),
        }
        tracing::warn!(attempt, error = %last, "the custom resource's answer was not taken");
        tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
    }
    Err(last)
}
