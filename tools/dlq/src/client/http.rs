//! The HTTP client: the token on every request, and the retries.

use super::error::{ApiError, refused};
use super::types::Answer;
use serde_json::Value;
use std::fmt;
use std::time::Duration;

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

    pub(super) async fn get(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> Result<Answer, ApiError> {
        let url = format!("{}{path}", self.base);
        self.send(|| self.http.get(&url).query(query), Retry::Unanswered)
            .await
    }

    pub(super) async fn post(&self, path: &str, body: &Value) -> Result<Answer, ApiError> {
        let url = format!("{}{path}", self.base);
        self.send(|| self.http.post(&url).json(body), Retry::Unanswered)
            .await
    }

    /// A POST that is not repeated once it may have reached the function (no answer, a 502,
    /// 503 or 504): only a throttled one (429, never served) is tried again. For a request
    /// whose repeat would do it twice (starting a bulk operation).
    pub(super) async fn post_once(&self, path: &str, body: &Value) -> Result<Answer, ApiError> {
        let url = format!("{}{path}", self.base);
        self.send(|| self.http.post(&url).json(body), Retry::Throttled)
            .await
    }

    /// Sends `request` until it is answered, retrying throttling (and, with
    /// [`Retry::Unanswered`], unavailability and no answer) with backoff (or the `Retry-After`
    /// the API asks for).
    async fn send(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
        retry: Retry,
    ) -> Result<Answer, ApiError> {
        let mut delay = Duration::from_millis(500);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt > self.retries;
            let next = match request().bearer_auth(&self.token).send().await {
                Ok(response) => answered(response, last, retry).await,
                Err(e) if retry == Retry::Throttled => Next::Return(Err(ApiError::Unreachable(
                    format!("no answer from {}: {}", self.base, causes(e)),
                ))),
                Err(e) => self.unanswered(e, attempt, last),
            };
            match next {
                Next::Return(result) => return result,
                Next::Retry(after) => {
                    tokio::time::sleep(after.unwrap_or(delay)).await;
                    delay *= 2;
                }
            }
        }
    }

    /// No answer to a try: said at once on the first (not after the retries' backoff), an
    /// error on the last.
    fn unanswered(&self, e: reqwest::Error, attempt: u32, last: bool) -> Next {
        if last {
            return Next::Return(Err(ApiError::Unreachable(format!(
                "no answer from {} after {attempt} tries: {}",
                self.base,
                causes(e)
            ))));
        }
        if attempt == 1 {
            eprintln!(
                "dlq: no answer from {} ({}); trying {} more time(s)",
                self.base,
                causes(e),
                self.retries
            );
        }
        Next::Retry(None)
    }
}

/// Which failures of a request are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Throttling, unavailability (502–504) and no answer: a request safe to repeat.
    Unanswered,
    /// Throttling only (429: the gateway served nothing).
    Throttled,
}

/// What follows one try of a request.
enum Next {
    /// Done: this is the answer (or the error).
    Return(Result<Answer, ApiError>),
    /// Try again after this long (`None`: the backoff's delay).
    Retry(Option<Duration>),
}

/// An answer: a success, a throttling or unavailability to retry (unless it was the last try),
/// or a refusal.
async fn answered(response: reqwest::Response, last: bool, retry: Retry) -> Next {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = response.text().await.unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Next::Return(Ok(Answer { status, body }));
    }
    let again = match retry {
        Retry::Unanswered => matches!(status, 429 | 502 | 503 | 504),
        Retry::Throttled => status == 429,
    };
    if again && !last {
        return Next::Retry(retry_after);
    }
    Next::Return(Err(refused(status, &body, &text)))
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
