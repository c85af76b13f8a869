//! BetterStack alerting for dead letters.
//!
//! Invariants: a dead letter is committed before any alert is tried; an alert never blocks
//! processing longer than its time budget; a group that could not be sent stays unsent in
//! PostgreSQL and the scheduled run sends it. The API token never appears in logs or `Debug`.

use crate::alert_store::{AlertGroup, claim_unsent, mark_send_failed, mark_sent};
use crate::clock::Clock;
use serde_json::json;
use sqlx::PgPool;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long a sender holds a claimed group before another may try it.
const LEASE: Duration = Duration::from_secs(60);

/// A BetterStack Uptime API client that creates incidents.
#[derive(Clone)]
pub struct BetterStack {
    http: reqwest::Client,
    incidents_url: String,
    token: String,
    requester_email: Option<String>,
}

impl fmt::Debug for BetterStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BetterStack")
            .field("incidents_url", &self.incidents_url)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Why an incident was not created.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    /// The API answered with an error status.
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
}

impl BetterStack {
    /// A client for `base_url` (for example `https://uptime.betterstack.com`).
    pub fn new(
        base_url: &str,
        token: String,
        requester_email: Option<String>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        let incidents_url = format!("{}/api/v3/incidents", base_url.trim_end_matches('/'));
        Ok(Self {
            http,
            incidents_url,
            token,
            requester_email,
        })
    }

    /// Creates an incident for `group` (see [`BetterStack::send`]).
    pub async fn create_incident(
        &self,
        group: &AlertGroup,
        budget: Duration,
    ) -> Result<String, AlertError> {
        self.send(&incident_body(group), budget).await
    }

    /// Creates the incident `incident` (`name`, `summary`, `description`), retrying 429 and 5xx
    /// with backoff (or `Retry-After`) while `budget` lasts. Returns the incident id.
    pub async fn send(
        &self,
        incident: &serde_json::Value,
        budget: Duration,
    ) -> Result<String, AlertError> {
        let deadline = Instant::now() + budget;
        let mut body = incident.clone();
        if let Some(email) = &self.requester_email {
            body["requester_email"] = json!(email);
        }
        let mut delay = Duration::from_millis(100);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AlertError::OutOfTime(budget));
            }
            let sent = self
                .http
                .post(&self.incidents_url)
                .bearer_auth(&self.token)
                .timeout(left)
                .json(&body)
                .send()
                .await;
            let retry_after = match sent {
                Ok(response) if response.status().is_success() => {
                    let created: serde_json::Value = response.json().await.unwrap_or_default();
                    let id = created["data"]["id"]
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| "unknown".into());
                    return Ok(id);
                }
                Ok(response)
                    if response.status().as_u16() == 429 || response.status().is_server_error() =>
                {
                    let wait = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .map(Duration::from_secs);
                    tracing::warn!(
                        status = response.status().as_u16(),
                        "BetterStack refused the incident; retrying"
                    );
                    wait.unwrap_or(delay)
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap_or_default();
                    return Err(AlertError::Status {
                        status,
                        body: text.chars().take(300).collect(),
                    });
                }
                Err(e) if Instant::now() + delay >= deadline => {
                    return Err(AlertError::Unreachable(e.without_url().to_string()));
                }
                Err(_) => delay,
            };
            if Instant::now() + retry_after >= deadline {
                return Err(AlertError::OutOfTime(budget));
            }
            tokio::time::sleep(retry_after).await;
            delay *= 2;
        }
    }
}

/// The incident for a group: what failed, how often, an example, and where to look.
pub fn incident_body(group: &AlertGroup) -> serde_json::Value {
    let sample = group
        .sample_job_id
        .map(|j| j.to_string())
        .unwrap_or_else(|| "(no job id)".into());
    let description = format!(
        "{count} dead letter(s) of kind {kind} on queue {queue} since {first}.\n\
         First error: {first_error}\nLast error: {last_error}\n\
         Sample job_id: {sample}, correlation_id: {corr}\n\n\
         List them: GET /v1/core/dead-letters?queue={queue}&error_kind={kind}&status=pending_review\n\
         or: SELECT * FROM core.dead_letters WHERE queue = '{queue}' AND error_kind = '{kind}' AND status = 'pending_review';\n\
         Later letters of this group raise its count in core.dead_letter_alerts (id {id}) without paging again.",
        count = group.letter_count,
        kind = group.error_kind,
        queue = group.queue,
        first = group.first_letter_at.to_rfc3339(),
        first_error = group.first_error,
        last_error = group.last_error,
        corr = group.sample_correlation_id.as_deref().unwrap_or("(none)"),
        id = group.id,
    );
    json!({
        "name": format!("Dead letters: {} / {}", group.queue, group.error_kind),
        "summary": format!("{} {} dead letter(s) on {}", group.letter_count, group.error_kind, group.queue),
        "description": description,
    })
}

/// What one delivery round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Groups that paged.
    pub sent: usize,
    /// Groups left for a later round.
    pub failed: usize,
}

/// Sends unsent alert groups to BetterStack.
#[derive(Clone)]
pub struct Alerter {
    pool: PgPool,
    client: BetterStack,
    clock: Arc<dyn Clock>,
    budget: Duration,
}

impl fmt::Debug for Alerter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerter")
            .field("client", &self.client)
            .field("budget", &self.budget)
            .finish()
    }
}

impl Alerter {
    /// An alerter that spends at most `budget` per delivery round.
    pub fn new(pool: PgPool, client: BetterStack, clock: Arc<dyn Clock>, budget: Duration) -> Self {
        Self {
            pool,
            client,
            clock,
            budget,
        }
    }

    /// Claims up to `limit` due groups and pages each, within the budget. Failures are recorded
    /// with a backoff and left for the next round. Never returns an error: alerting must not
    /// fail the caller.
    pub async fn deliver_pending(&self, limit: i64) -> Delivery {
        let started = Instant::now();
        let now = self.clock.now();
        let claimed =
            async { claim_unsent(&mut *self.pool.acquire().await?, now, LEASE, limit).await };
        let groups = match tokio::time::timeout(self.budget, claimed).await {
            Ok(Ok(groups)) => groups,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not read unsent alerts");
                return Delivery::default();
            }
            Err(_) => return Delivery::default(),
        };
        let mut delivery = Delivery::default();
        for group in groups {
            let left = self.budget.saturating_sub(started.elapsed());
            let result = self.client.create_incident(&group, left).await;
            let recorded = match &result {
                Ok(incident) => {
                    delivery.sent += 1;
                    tracing::info!(
                        group = group.id,
                        incident,
                        letters = group.letter_count,
                        "alert sent"
                    );
                    mark_sent(&self.pool, &group, incident, self.clock.now()).await
                }
                Err(error) => {
                    delivery.failed += 1;
                    let backoff = Duration::from_secs(10u64 << group.send_attempts.clamp(0, 5));
                    let retry_at =
                        self.clock.now() + chrono::Duration::from_std(backoff).unwrap_or_default();
                    tracing::warn!(group = group.id, %error, ?backoff, "alert not sent; the scheduled run retries it");
                    mark_send_failed(&self.pool, group.id, &error.to_string(), retry_at).await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(group = group.id, error = %e, "could not record the alert's state; its lease expires and it is retried");
            }
        }
        delivery
    }
}
