//! The BetterStack Uptime API: incidents, their comments, their resolution and their read-back. The API token never appears in logs or `Debug`.

use crate::secrets::Secret;
use serde_json::{Value, json};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// A BetterStack Uptime API client: incidents, their comments and their resolution.
#[derive(Clone)]
pub struct BetterStack {
    http: reqwest::Client,
    base_url: String,
    token: Secret,
    requester_email: Option<String>,
}

impl fmt::Debug for BetterStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BetterStack")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Why BetterStack did not take a request.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    /// The token was refused (401 or 403): every page fails until it is replaced.
    #[error("BetterStack refused the API token ({status}): {body}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The API answered with another error status.
    #[error("BetterStack answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// No answer (connection refused, timeout).
    #[error("BetterStack unreachable: {0}")]
    Unreachable(String),
    /// The time budget ran out.
    #[error("gave up after {0:?}")]
    OutOfTime(Duration),
    /// The token's secret could not be read.
    #[error("the BetterStack token could not be read: {0}")]
    Token(String),
}

impl AlertError {
    /// The HTTP status BetterStack answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Rejected { status, .. } | Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl BetterStack {
    /// A client for `base_url` (for example `https://uptime.betterstack.com`). Every request is
    /// bounded by its caller's budget; connecting by 2 s.
    pub fn new(
        base_url: &str,
        token: impl Into<Secret>,
        requester_email: Option<String>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.into(),
            requester_email,
        })
    }

    /// Creates the incident `incident` (`name`, `summary`, `description`, and a route's
    /// `policy_id` / `team_name`). Returns its id.
    pub async fn create_incident(
        &self,
        incident: &Value,
        budget: Duration,
    ) -> Result<String, AlertError> {
        let mut body = incident.clone();
        if let Some(email) = &self.requester_email {
            body["requester_email"] = json!(email);
        }
        let created = self.send("/api/v3/incidents", &body, budget).await?;
        Ok(created["data"]["id"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| "unknown".into()))
    }

    /// Adds `content` (Markdown) to the incident's timeline.
    pub async fn comment(
        &self,
        incident_id: &str,
        content: &str,
        budget: Duration,
    ) -> Result<(), AlertError> {
        let path = format!("/api/v2/incidents/{incident_id}/comments");
        self.send(&path, &json!({ "content": content }), budget)
            .await
            .map(drop)
    }

    /// Resolves the incident; one already resolved (409) counts as resolved.
    pub async fn resolve(
        &self,
        incident_id: &str,
        resolved_by: &str,
        budget: Duration,
    ) -> Result<(), AlertError> {
        let path = format!("/api/v3/incidents/{incident_id}/resolve");
        match self
            .send(&path, &json!({ "resolved_by": resolved_by }), budget)
            .await
        {
            Err(AlertError::Status { status: 409, .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Whether the incident is resolved in BetterStack (`GET /api/v3/incidents/{id}`: its
    /// `resolved_at`), by the harness or by a person. One BetterStack no longer knows (404,
    /// deleted there) counts as resolved: it pages nobody either.
    pub(crate) async fn incident_resolved(
        &self,
        incident_id: &str,
        budget: Duration,
    ) -> Result<bool, AlertError> {
        let path = format!("/api/v3/incidents/{incident_id}");
        match self
            .request(reqwest::Method::GET, &path, None, budget)
            .await
        {
            Ok(incident) => Ok(!incident["data"]["attributes"]["resolved_at"].is_null()
                || incident["data"]["attributes"]["status"] == "Resolved"),
            Err(AlertError::Status { status: 404, .. }) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// POSTs `body` to `path`; see [`Self::request`].
    async fn send(&self, path: &str, body: &Value, budget: Duration) -> Result<Value, AlertError> {
        self.request(reqwest::Method::POST, path, Some(body), budget)
            .await
    }

    /// One try of a request, within `left`.
    async fn send_once(
        &self,
        method: reqwest::Method,
        url: &str,
        token: &str,
        body: Option<&Value>,
        left: Duration,
    ) -> reqwest::Result<reqwest::Response> {
        let request = self
            .http
            .request(method, url)
            .bearer_auth(token)
            .timeout(left);
        match body {
            Some(body) => request.json(body).send().await,
            None => request.send().await,
        }
    }

    /// Sends `method path` (with `body` as JSON, if any), retrying 429 and 5xx with backoff (or
    /// `Retry-After`) while `budget` lasts. A refused token read from Secrets Manager is read
    /// again and tried once more (it may have been rotated). Returns the answer's JSON (`null`
    /// if it has none).
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        budget: Duration,
    ) -> Result<Value, AlertError> {
        let (deadline, url) = (Instant::now() + budget, format!("{}{path}", self.base_url));
        let mut delay = Duration::from_millis(100);
        let mut token = self.token.value().await.map_err(token_error)?;
        let mut token_reread = !self.token.is_managed();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AlertError::OutOfTime(budget));
            }
            let sent = self
                .send_once(method.clone(), &url, &token, body, left)
                .await;
            let wait = match Answer::of(sent, token_reread).await {
                Answer::Done(value) => return Ok(value),
                Answer::Failed(error) => return Err(error),
                Answer::TokenRefused(error) => {
                    token_reread = true;
                    let fresh = self.token.refreshed().await.map_err(token_error)?;
                    if fresh == token {
                        return Err(error);
                    }
                    tracing::warn!(
                        "BetterStack refused the token; trying the one just read from its secret"
                    );
                    token = fresh;
                    continue;
                }
                Answer::Retry(wait) => wait.unwrap_or(delay),
                Answer::Unreachable(_) if Instant::now() + delay < deadline => delay,
                Answer::Unreachable(error) => return Err(AlertError::Unreachable(error)),
            };
            if Instant::now() + wait >= deadline {
                return Err(AlertError::OutOfTime(budget));
            }
            tokio::time::sleep(wait).await;
            delay *= 2;
        }
    }
}

fn token_error(e: impl fmt::Display) -> AlertError {
    AlertError::Token(e.to_string())
}

/// What one answer from BetterStack means for the request.
enum Answer {
    /// Taken: its JSON.
    Done(Value),
    /// Refused for good.
    Failed(AlertError),
    /// The token was refused, and it has not been read again yet.
    TokenRefused(AlertError),
    /// Throttled or failing: try again, after `Retry-After` if it says.
    Retry(Option<Duration>),
    /// No answer.
    Unreachable(String),
}

impl Answer {
    async fn of(sent: reqwest::Result<reqwest::Response>, token_reread: bool) -> Self {
        let response = match sent {
            Ok(response) => response,
            Err(e) => return Self::Unreachable(e.without_url().to_string()),
        };
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Self::Done(response.json().await.unwrap_or_default());
        }
        if status == 429 || response.status().is_server_error() {
            tracing::warn!(status, "BetterStack refused the request; retrying");
            let retry_after = response.headers().get(reqwest::header::RETRY_AFTER);
            let seconds = retry_after.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            return Self::Retry(seconds.map(Duration::from_secs));
        }
        let text = response.text().await.unwrap_or_default();
        let body = text.chars().take(300).collect();
        match status {
            401 | 403 if !token_reread => Self::TokenRefused(AlertError::Rejected { status, body }),
            401 | 403 => Self::Failed(AlertError::Rejected { status, body }),
            _ => Self::Failed(AlertError::Status { status, body }),
        }
    }
}

/// `s` cut to `chars` characters, marked when cut.
pub(crate) fn clip(s: &str, chars: usize) -> String {
    let mut clipped: String = s.chars().take(chars).collect();
    if clipped.len() < s.len() {
        clipped.push('…');
    }
    clipped
}
