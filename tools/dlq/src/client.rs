//! The dead-letter API over HTTP: what the tool reads and does, with the token it was given.
//!
//! Invariant: the token goes only into the `Authorization` header; no error, log line or
//! `Debug` shows it. Throttling and unavailability (429, 502–504, no answer) are retried with
//! backoff; every other answer is returned as it came.

use serde::Deserialize;
use serde_json::{Value, json};
use std::fmt;
use std::time::Duration;

/// A letter as the list endpoint returns it (what the tool needs of it).
#[derive(Debug, Clone, Deserialize)]
pub struct Letter {
    /// Its id.
    pub id: uuid::Uuid,
    /// Its job.
    pub job_id: Option<uuid::Uuid>,
    /// The consumer.
    pub consumer: String,
    /// The queue.
    pub queue: String,
    /// Its kind.
    pub error_kind: String,
    /// Executions.
    pub attempts: i64,
    /// Its review status.
    pub status: String,
    /// The start of its last error.
    pub last_error: String,
    /// Its group.
    pub group_id: Option<i64>,
    /// Whether its job's fence exists (a replay would send nothing).
    pub fence_exists: Option<bool>,
    /// When it was written.
    pub created_at: String,
    /// Its correlation id.
    pub correlation_id: Option<String>,
}

/// A failure group as the API returns it.
#[derive(Debug, Clone, Deserialize)]
pub struct Group {
    /// Its id.
    pub id: i64,
    /// open or resolved.
    pub status: String,
    /// The consumer.
    pub consumer: String,
    /// The queue.
    pub queue: String,
    /// The kind.
    pub error_kind: String,
    /// The masked error.
    pub pattern: String,
    /// Letters.
    pub letter_count: i64,
    /// Letters pending review.
    pub pending_count: i64,
    /// First letter.
    pub first_letter_at: String,
    /// Latest letter.
    pub last_letter_at: String,
    /// Its incident.
    pub incident: Option<Value>,
    /// The first letter's error.
    pub sample_error: String,
    /// The other groups its failed replays went to, with how many letters (`dlq group` only).
    #[serde(default)]
    pub failed_replays: Vec<FailedReplays>,
}

/// Letters written when replays of a group's letters failed again, in another group.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FailedReplays {
    /// The group they are in.
    pub group_id: i64,
    /// How many.
    pub letters: i64,
}

/// One page of a list.
#[derive(Debug, Clone, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The next page's cursor.
    pub next_cursor: Option<String>,
}

/// An answer that was not a success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API answered with an error: `{"error": {"code", "message"}}` or the gateway's own.
    #[error("{status} {code}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The API's code (`not_pending`, `forbidden`, …).
        code: String,
        /// Its sentence.
        message: String,
    },
    /// No usable answer after the retries.
    #[error("{0}")]
    Unreachable(String),
}

impl ApiError {
    /// The API's error code, if it answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Refused { code, .. } => Some(code),
            Self::Unreachable(_) => None,
        }
    }
}

/// A successful answer: its status (200, or 202 for a replay left queued) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
}

/// The API client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    retries: u32,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Client {
    /// A client of the API at `base` with `token`.
    pub fn new(base: &str, token: String) -> Result<Self, String> {
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(format!(
                "--api / DLQ_API_URL must be an http(s) URL, got {base:?}"
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("dlq/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            retries: 4,
        })
    }

    /// The fence of `job_id` for `consumer`, if the job committed there (`None` on 404).
    pub async fn processed_job(
        &self,
        job_id: uuid::Uuid,
        consumer: &str,
    ) -> Result<Option<Value>, ApiError> {
        let path = format!("/v1/core/processed-jobs/{job_id}");
        match self
            .get(&path, &[("consumer".into(), consumer.into())])
            .await
        {
            Ok(answer) => Ok(Some(answer.body["processed_job"].clone())),
            // The function's own 404 (`not_found`); API Gateway's for a route it does not
            // have (an older stack) is an error.
            Err(ApiError::Refused {
                status: 404, code, ..
            }) if code == "not_found" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One page of letters.
    pub async fn letters(&self, query: &[(String, String)]) -> Result<Page<Letter>, ApiError> {
        decode(self.get("/v1/core/dead-letters", query).await?)
    }

    /// One page of letters, as the API sent it (`items`, `next_cursor`).
    pub async fn letters_raw(&self, query: &[(String, String)]) -> Result<Value, ApiError> {
        Ok(self.get("/v1/core/dead-letters", query).await?.body)
    }

    /// One letter whole, with its fence and failed replays (the API's body).
    pub async fn letter(&self, id: uuid::Uuid) -> Result<Value, ApiError> {
        Ok(self
            .get(&format!("/v1/core/dead-letters/{id}"), &[])
            .await?
            .body)
    }

    /// One page of groups.
    pub async fn groups(&self, query: &[(String, String)]) -> Result<Page<Group>, ApiError> {
        decode(self.get("/v1/core/dead-letter-groups", query).await?)
    }

    /// One group.
    pub async fn group(&self, id: i64) -> Result<Group, ApiError> {
        let answer = self
            .get(&format!("/v1/core/dead-letter-groups/{id}"), &[])
            .await?;
        let mut group = answer.body["group"].clone();
        if let (Some(fields), Some(again)) = (
            group.as_object_mut(),
            answer.body["failed_replays"].as_array(),
        ) {
            fields.insert("failed_replays".into(), Value::Array(again.clone()));
        }
        decode(Answer {
            status: answer.status,
            body: group,
        })
    }

    /// Replays a letter, saying why.
    pub async fn replay(&self, id: uuid::Uuid, reason: &str) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/replay");
        self.post(&path, &json!({ "reason": reason })).await
    }

    /// Replays a letter with an edited envelope, saying why; with `dry_run`, only the API's
    /// check and plan.
    pub async fn edit(
        &self,
        id: uuid::Uuid,
        body: &Value,
        reason: &str,
        dry_run: bool,
    ) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/edit");
        let request = json!({ "body": body, "reason": reason, "dry_run": dry_run });
        self.post(&path, &request).await
    }

    /// Discards a letter, saying why.
    pub async fn discard(&self, id: uuid::Uuid, reason: &str) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/discard");
        self.post(&path, &json!({ "reason": reason })).await
    }

    async fn get(&self, path: &str, query: &[(String, String)]) -> Result<Answer, ApiError> {
        let url = format!("{}{path}", self.base);
        self.send(|| self.http.get(&url).query(query)).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Answer, ApiError> {
        let url = format!("{}{path}", self.base);
        self.send(|| self.http.post(&url).json(body)).await
    }

    async fn send(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Answer, ApiError> {
        let mut delay = Duration::from_millis(500);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt > self.retries;
            match request().bearer_auth(&self.token).send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let text = response.text().await.unwrap_or_default();
                    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    if (200..300).contains(&status) {
                        return Ok(Answer { status, body });
                    }
                    if matches!(status, 429 | 502 | 503 | 504) && !last {
                        tokio::time::sleep(retry_after.unwrap_or(delay)).await;
                        delay *= 2;
                        continue;
                    }
                    return Err(refused(status, &body, &text));
                }
                Err(e) if last => {
                    return Err(ApiError::Unreachable(format!(
                        "no answer from {} after {attempt} tries: {}",
                        self.base,
                        causes(e)
                    )));
                }
                Err(e) => {
                    if attempt == 1 {
                        // Said at once, not after the retries' backoff.
                        eprintln!(
                            "dlq: no answer from {} ({}); trying {} more time(s)",
                            self.base,
                            causes(e),
                            self.retries
                        );
                    }
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
}

/// What failed, with every cause under it (reqwest's own message alone, "error sending
/// request", drops the one that says why: connection refused, a DNS name unknown, a timeout).
fn causes(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// An error answer: the API's `{"error": {"code", "message"}}`, or API Gateway's own
/// `{"message": "Unauthorized"}`.
fn refused(status: u16, body: &Value, text: &str) -> ApiError {
    let code = body["error"]["code"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| match status {
            401 => "unauthenticated".into(),
            403 => "forbidden".into(),
            _ => "error".into(),
        });
    let message = body["error"]["message"]
        .as_str()
        .or_else(|| body["message"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| text.chars().take(200).collect());
    ApiError::Refused {
        status,
        code,
        message: as_flags(&message),
    }
}

/// The API's parameters and the `dlq` flags that set them.
const FLAGS: [(&str, &str); 13] = [
    ("group_id", "--group"),
    ("queue", "--queue"),
    ("consumer", "--consumer"),
    ("error_kind", "--kind"),
    ("job_id", "--job-id"),
    ("correlation_id", "--correlation-id"),
    ("tenant_id", "--tenant-id"),
    ("message_id", "--message-id"),
    ("created_from", "--from"),
    ("created_before", "--before"),
    ("status", "--status"),
    ("limit", "--limit"),
    ("id_prefix", "the letter id"),
];

/// An API message naming its parameters (`` `error_kind` ``) as the operator typed them: the flag
/// (`--kind`).
pub fn as_flags(message: &str) -> String {
    FLAGS
        .iter()
        .fold(message.to_owned(), |m, (parameter, flag)| {
            m.replace(&format!("`{parameter}`"), flag)
        })
}

fn decode<T: serde::de::DeserializeOwned>(answer: Answer) -> Result<T, ApiError> {
    serde_json::from_value(answer.body).map_err(|e| {
        ApiError::Unreachable(format!(
            "the API's answer is not what this tool expects: {e}"
        ))
    })
}

#[cfg(test)]
mod flag_tests {
    #[test]
    fn the_apis_parameters_are_named_as_the_flags_that_set_them() {
        assert_eq!(
            super::as_flags(
                "`error_kind` must be one of poison, permanent; `created_from` must be earlier than `created_before`"
            ),
            "--kind must be one of poison, permanent; --from must be earlier than --before"
        );
        assert_eq!(super::as_flags("no parameter here"), "no parameter here");
    }
}
