//! BetterStack alerting: one incident per failure group ([`crate::dead_letter::Group`]) while
//! it lasts.
//!
//! Invariants: a dead letter is committed before any alert is tried; an alert never blocks
//! processing longer than its time budget; a step that could not be delivered stays due in
//! PostgreSQL and the scheduled run delivers it. A group's incident is opened once, updated with
//! the group's count at most every `update_every`, and resolved when the group is; one a person
//! resolves in BetterStack while the group's letters are still pending is found by the
//! scheduled run (it reads open incidents back every [`INCIDENT_CHECK_INTERVAL`]) and raised
//! again. The API token never appears in logs or `Debug`.

use crate::clock::Clock;
use crate::dead_letter::{
    Group, IncidentStep, claim_due, claim_incident_checks, previous_incident,
    record_delivery_failed, record_incident_checked, record_opened, record_resolved,
    record_resolved_by_hand, record_updated,
};
use crate::metrics::{Metric, Metrics};
use crate::secrets::Secret;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long a sender holds a claimed group before another may try it.
const LEASE: Duration = Duration::from_secs(60);

/// How often the scheduled run reads an open group's incident back from BetterStack, to find
/// one a person resolved there while the group's letters are still pending.
pub(crate) const INCIDENT_CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// Whom a queue's incidents page: a BetterStack escalation policy and/or team.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The escalation policy's id.
    pub policy_id: Option<String>,
    /// The team that owns the incident (needed with a global API token).
    pub team_name: Option<String>,
}

/// Whom each queue pages: a route per queue, else the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// For queues without a route of their own.
    pub default: Route,
    /// By queue name.
    pub by_queue: BTreeMap<String, Route>,
    /// Escalations of unreviewed letters, if they page someone else.
    pub escalation: Option<Route>,
}

impl Routes {
    /// The route of `queue`.
    pub(crate) fn for_queue(&self, queue: &str) -> &Route {
        self.by_queue.get(queue).unwrap_or(&self.default)
    }
}

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
        let deadline = Instant::now() + budget;
        let url = format!("{}{path}", self.base_url);
        let mut delay = Duration::from_millis(100);
        let mut token = self
            .token
            .value()
            .await
            .map_err(|e| AlertError::Token(e.to_string()))?;
        let mut token_reread = !self.token.is_managed();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AlertError::OutOfTime(budget));
            }
            let mut request = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&token)
                .timeout(left);
            if let Some(body) = body {
                request = request.json(body);
            }
            let sent = request.send().await;
            let retry_after = match sent {
                Ok(response) if response.status().is_success() => {
                    return Ok(response.json().await.unwrap_or_default());
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
                        path,
                        "BetterStack refused the request; retrying"
                    );
                    wait.unwrap_or(delay)
                }
                Ok(response)
                    if matches!(response.status().as_u16(), 401 | 403) && !token_reread =>
                {
                    token_reread = true;
                    let fresh = self
                        .token
                        .refreshed()
                        .await
                        .map_err(|e| AlertError::Token(e.to_string()))?;
                    if fresh == token {
                        let status = response.status().as_u16();
                        let text = response.text().await.unwrap_or_default();
                        let body = text.chars().take(300).collect();
                        return Err(AlertError::Rejected { status, body });
                    }
                    tracing::warn!(
                        "BetterStack refused the token; trying the one just read from its secret"
                    );
                    token = fresh;
                    continue;
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap_or_default();
                    let body = text.chars().take(300).collect();
                    return Err(if status == 401 || status == 403 {
                        AlertError::Rejected { status, body }
                    } else {
                        AlertError::Status { status, body }
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

/// The incident for a group: what failed, how often, an example, where to look, and whom it
/// pages.
pub(crate) fn incident_body(group: &Group, route: &Route) -> Value {
    let mut body = json!({
        "name": format!("Dead letters: {} / {} on {}", group.consumer, group.error_kind, group.queue),
        "summary": format!("{} {} dead letter(s) on {}: {}", group.letter_count, group.error_kind,
            group.queue, clip(&group.pattern, 120)),
        "description": description(group),
    });
    with_route(&mut body, route);
    body
}

/// Sets `route`'s policy and team on an incident body.
pub(crate) fn with_route(body: &mut Value, route: &Route) {
    if let Some(policy) = &route.policy_id {
        body["policy_id"] = json!(policy);
    }
    if let Some(team) = &route.team_name {
        body["team_name"] = json!(team);
    }
}

fn description(group: &Group) -> String {
    format!(
        "Group {id}: {count} dead letter(s) of consumer {consumer}, kind {kind}, on queue {queue}, \
         since {first}.\nThe failure: {pattern}\nFirst error: {sample}\nSample job_id: {job}, \
         correlation_id: {corr}\n\n\
         See it: dlq group {id}   (or GET /v1/core/dead-letter-groups/{id})\n\
         Its letters: dlq list --group {id}\n\
         Once the cause is fixed: dlq replay --group {id} --dry-run, then without --dry-run.\n\
         This incident is updated with the group's count and resolved when every letter of the \
         group has been replayed or discarded.",
        id = group.id,
        count = group.letter_count,
        consumer = group.consumer,
        kind = group.error_kind,
        queue = group.queue,
        first = group.first_letter_at.to_rfc3339(),
        pattern = group.pattern,
        sample = clip(&group.sample_error, 1000),
        job = group
            .sample_job_id
            .map(|j| j.to_string())
            .unwrap_or_else(|| "(none)".into()),
        corr = group.sample_correlation_id.as_deref().unwrap_or("(none)"),
    )
}

/// The comment that brings an incident up to the group's count.
pub(crate) fn update_comment(group: &Group) -> String {
    format!(
        "Group {}: now {} dead letter(s), {} pending review; the latest at {}.\nLatest error: {}",
        group.id,
        group.letter_count,
        group.pending_count,
        group.last_letter_at.to_rfc3339(),
        clip(&group.last_error, 1000)
    )
}

/// What a group's new incident says when its previous one was resolved by hand.
pub(crate) fn raised_again_note(group: &Group, previous: &str) -> String {
    format!(
        "Raised again: incident {previous} was resolved in BetterStack while {pending} letter(s) \
         of group {id} were still pending review. This incident stays open until they are \
         replayed or discarded (dlq replay|discard --group {id}); the harness resolves it then. \
         Resolving it by hand raises it again.",
        pending = group.pending_count,
        id = group.id,
    )
}

fn clip(s: &str, chars: usize) -> String {
    let mut clipped: String = s.chars().take(chars).collect();
    if clipped.len() < s.len() {
        clipped.push('…');
    }
    clipped
}

/// What one delivery round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Incidents opened.
    pub opened: usize,
    /// Incidents updated with their group's count.
    pub updated: usize,
    /// Incidents resolved.
    pub resolved: usize,
    /// Steps that failed and are left for a later round.
    pub failed: usize,
    /// Of those, refused for the token (401/403): the alert path is broken until it is fixed.
    pub rejected: usize,
    /// Incidents found resolved by hand in BetterStack while their group was still open: each
    /// group is due a new incident (opened by the same round, or the next).
    pub raised_again: usize,
}

impl Delivery {
    /// Steps delivered.
    pub fn delivered(&self) -> usize {
        self.opened + self.updated + self.resolved
    }
}

impl Metrics {
    /// Counts what an alert delivery round failed to deliver.
    pub(crate) fn count_delivery(&self, delivery: &Delivery) {
        self.add(Metric::AlertDeliveryFailed, delivery.failed as u64);
        self.add(Metric::AlertRejected, delivery.rejected as u64);
    }
}

/// Delivers the incidents of failure groups to BetterStack.
#[derive(Clone)]
pub struct Alerter {
    pool: PgPool,
    client: BetterStack,
    routes: Arc<Routes>,
    clock: Arc<dyn Clock>,
    budget: Duration,
    update_every: Duration,
}

impl fmt::Debug for Alerter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerter")
            .field("client", &self.client)
            .field("budget", &self.budget)
            .field("update_every", &self.update_every)
            .finish()
    }
}

impl Alerter {
    /// An alerter that spends at most `budget` per delivery round and updates an incident with
    /// its group's count at most every `update_every`.
    pub fn new(
        pool: PgPool,
        client: BetterStack,
        routes: Routes,
        clock: Arc<dyn Clock>,
        budget: Duration,
        update_every: Duration,
    ) -> Self {
        Self {
            pool,
            client,
            routes: Arc::new(routes),
            clock,
            budget,
            update_every,
        }
    }

    /// The BetterStack client.
    pub fn client(&self) -> &BetterStack {
        &self.client
    }

    /// The routes.
    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// Claims up to `limit` groups whose incident is due a step and delivers each, within the
    /// budget. Failures are recorded with a backoff and left for the next round. Never returns
    /// an error: alerting must not fail the caller.
    pub async fn deliver_pending(&self, limit: i64) -> Delivery {
        let started = Instant::now();
        let now = self.clock.now();
        let claimed =
            async { claim_due(&mut *self.pool.acquire().await?, now, LEASE, limit).await };
        let groups = match tokio::time::timeout(self.budget, claimed).await {
            Ok(Ok(groups)) => groups,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not read the incidents due");
                return Delivery::default();
            }
            Err(_) => return Delivery::default(),
        };
        let mut delivery = Delivery::default();
        for group in groups {
            let left = self.budget.saturating_sub(started.elapsed());
            let Some(step) = group.incident_step() else {
                continue;
            };
            let result = self.deliver(&group, step, left).await;
            let recorded = match result {
                Ok(()) => {
                    match step {
                        IncidentStep::Open => delivery.opened += 1,
                        IncidentStep::Update => delivery.updated += 1,
                        IncidentStep::Resolve => delivery.resolved += 1,
                    }
                    Ok(())
                }
                Err(error) => {
                    delivery.failed += 1;
                    if matches!(error, AlertError::Rejected { .. }) {
                        delivery.rejected += 1;
                    }
                    let backoff = Duration::from_secs(10u64 << group.delivery_failures.clamp(0, 5));
                    let retry_at =
                        self.clock.now() + chrono::Duration::from_std(backoff).unwrap_or_default();
                    tracing::warn!(group = %group.id, ?step, %error, ?backoff,
                        "incident step not delivered; retried later");
                    record_delivery_failed(&self.pool, group.id, &error.to_string(), retry_at).await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(group = %group.id, error = %e,
                    "could not record the incident's state; its lease expires and it is retried");
            }
        }
        delivery
    }

    /// Reads back from BetterStack up to `limit` open groups' incidents not read for
    /// [`INCIDENT_CHECK_INTERVAL`], within the budget. One resolved there (by a person) while
    /// its group's letters are still pending leaves the group without an incident, so the next
    /// delivery round raises it again ([`raised_again_note`]). Returns how many were (in
    /// `raised_again`) and the reads that failed (in `failed`, retried by a later run). Never
    /// returns an error.
    pub(crate) async fn raise_again_resolved_by_hand(&self, limit: i64) -> Delivery {
        let started = Instant::now();
        let now = self.clock.now();
        let checked_before = now
            - chrono::Duration::from_std(INCIDENT_CHECK_INTERVAL).unwrap_or(chrono::Duration::MAX);
        let claimed = async {
            claim_incident_checks(
                &mut *self.pool.acquire().await?,
                now,
                checked_before,
                LEASE,
                limit,
            )
            .await
        };
        let groups = match tokio::time::timeout(self.budget, claimed).await {
            Ok(Ok(groups)) => groups,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not read the open incidents to check");
                return Delivery::default();
            }
            Err(_) => return Delivery::default(),
        };
        let mut delivery = Delivery::default();
        for group in groups {
            let incident = incident_id(&group);
            let left = self.budget.saturating_sub(started.elapsed());
            let recorded = match self.client.incident_resolved(incident, left).await {
                Ok(true) => {
                    tracing::warn!(group = %group.id, incident, pending = group.pending_count,
                        "the group's incident was resolved in BetterStack while its letters are pending; raising it again");
                    match record_resolved_by_hand(&self.pool, group.id, incident, now).await {
                        Ok(true) => {
                            delivery.raised_again += 1;
                            Ok(())
                        }
                        Ok(false) => record_incident_checked(&self.pool, group.id, now).await,
                        Err(e) => Err(e),
                    }
                }
                Ok(false) => record_incident_checked(&self.pool, group.id, now).await,
                Err(error) => {
                    delivery.failed += 1;
                    if matches!(error, AlertError::Rejected { .. }) {
                        delivery.rejected += 1;
                    }
                    tracing::warn!(group = %group.id, incident, %error,
                        "could not read the group's incident back; read again later");
                    record_incident_checked(&self.pool, group.id, now).await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(group = %group.id, error = %e,
                    "could not record the incident's check; its lease expires and it is read again");
            }
        }
        delivery
    }

    /// Delivers one step and records it. The record's own failure is logged, not returned: the
    /// step went out, and a lease that expires only repeats it.
    async fn deliver(
        &self,
        group: &Group,
        step: IncidentStep,
        budget: Duration,
    ) -> Result<(), AlertError> {
        let now = self.clock.now();
        let next_update = now + chrono::Duration::from_std(self.update_every).unwrap_or_default();
        let recorded = match step {
            IncidentStep::Open => {
                let route = self.routes.for_queue(&group.queue);
                let mut body = incident_body(group, route);
                match previous_incident(&self.pool, group.id).await {
                    Ok(Some(previous)) => {
                        body["description"] = json!(format!(
                            "{}\n\n{}",
                            raised_again_note(group, &previous),
                            body["description"].as_str().unwrap_or_default()
                        ))
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(group = %group.id, error = %e,
                        "could not read the group's previous incident; opening without it"),
                }
                let incident = self.client.create_incident(&body, budget).await?;
                tracing::info!(group = %group.id, incident, letters = group.letter_count, "incident opened");
                record_opened(
                    &self.pool,
                    group.id,
                    &incident,
                    group.letter_count,
                    now,
                    next_update,
                )
                .await
            }
            IncidentStep::Update => {
                let incident = incident_id(group);
                self.client
                    .comment(incident, &update_comment(group), budget)
                    .await?;
                tracing::info!(group = %group.id, incident, letters = group.letter_count, "incident updated");
                record_updated(&self.pool, group.id, group.letter_count, now, next_update).await
            }
            IncidentStep::Resolve => {
                let incident = incident_id(group);
                let by = format!(
                    "job harness: every letter of group {} was reviewed",
                    group.id
                );
                self.client.resolve(incident, &by, budget).await?;
                tracing::info!(group = %group.id, incident, "incident resolved");
                record_resolved(&self.pool, group.id, now).await
            }
        };
        if let Err(e) = recorded {
            tracing::warn!(group = %group.id, error = %e, "incident step delivered but not recorded");
        }
        Ok(())
    }
}

fn incident_id(group: &Group) -> &str {
    group
        .incident
        .as_ref()
        .map(|i| i.id.as_str())
        .unwrap_or_default()
}
