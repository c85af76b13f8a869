//! The scheduled run (EventBridge): send replays that were recorded but not sent, deliver the
//! incident steps still due (and raise again those resolved by hand while their group is
//! open), escalate unreviewed groups and replays unsent past their bound, sweep expired fences,
//! and measure what waits (letters pending review, incidents not delivered, replays unsent).
//! Each step is bounded; a failing step is reported and does not stop the others.
//!
//! Invariant: the sweep, the alerts and the escalations always get their turn. With a Lambda
//! deadline, the replay step may spend at most a quarter of the time left at its start (and
//! never more than [`REPLAY_BUDGET`]) and the escalation step a quarter of what is left then
//! ([`ESCALATION_BUDGET`] at most); every send and page is bounded by what its step has left.

use crate::alerting::{Alerter, Delivery};
use crate::clock::Clock;
use crate::dead_letter::{DeliveryBacklog, delivery_backlog, pending_review};
use crate::escalation::{EscalationReport, escalate};
use crate::metrics::emf_line;
use crate::replay::Refusal;
use crate::replay_sends::{Unsent, due_replays, record_send_refused, unsent};
use crate::sweeper::{SweepReport, SweepSettings, sweep};
use crate::unsent_replays::page_unsent_replays;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Unsent alert groups retried per run.
const ALERT_RETRIES_PER_RUN: i64 = 100;
/// Open groups whose incident is read back per run.
const INCIDENT_CHECKS_PER_RUN: i64 = 20;
/// Queued replays tried per run, the one due longest first (those left untried, their queue
/// having refused one itself, do not count).
const REPLAYS_PER_RUN: i64 = 500;
/// A queued replay younger than this is left to the replay request that recorded it.
const REPLAY_GRACE: Duration = Duration::from_secs(60);
/// The most the replay step may take (without a deadline, all of it).
pub(crate) const REPLAY_BUDGET: Duration = Duration::from_secs(60);
/// The most the escalation step may take.
pub(crate) const ESCALATION_BUDGET: Duration = Duration::from_secs(60);

/// What the scheduled run works with.
pub struct ScheduledRun {
    /// The database.
    pub pool: PgPool,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Incident delivery and escalation pages, if alerting is on.
    pub alerter: Option<Alerter>,
    /// Sweep bounds.
    pub sweep: SweepSettings,
    /// Escalation threshold.
    pub escalate_after: Duration,
    /// Time budget of one page.
    pub page_budget: Duration,
    /// Sends replays that were recorded but not sent; `None` leaves them queued.
    pub replayer: Option<crate::replay::Replayer>,
    /// A replay recorded this long ago and still unsent alerts: a metric, an incident for its
    /// queue, and a failed heartbeat.
    pub replay_alert_after: Duration,
    /// Pinged at the end of every run, so a scheduler that stopped pages someone.
    pub heartbeat: Option<Heartbeat>,
}

/// A BetterStack heartbeat: a URL that expects a request every period, else it pages.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    http: reqwest::Client,
    url: String,
}

/// How long a heartbeat ping may take.
pub(crate) const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

impl Heartbeat {
    /// A heartbeat at `url`.
    pub fn new(url: String) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(HEARTBEAT_TIMEOUT)
                .build()
                .unwrap_or_default(),
            url: url.trim_end_matches('/').to_owned(),
        }
    }

    /// Pings it: `url` after a good run, `url/fail` when a step failed (BetterStack then pages
    /// at once instead of waiting for the period). The error is for the report.
    pub(crate) async fn ping(&self, failed: bool) -> Result<(), String> {
        let url = if failed {
            format!("{}/fail", self.url)
        } else {
            self.url.clone()
        };
        match self.http.get(&url).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("the heartbeat answered {}", r.status().as_u16())),
            Err(e) => Err(format!("the heartbeat is unreachable: {}", e.without_url())),
        }
    }
}

/// Queued replays this run sent, and those the queue still refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaySends {
    /// Sent and recorded.
    pub sent: u64,
    /// Tried and refused: still queued, each due again after its backoff. (Those not tried, their
    /// queue having refused one itself this run, are not counted: they wait as they were.)
    pub failed: u64,
}

/// What waits, as the run found it at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Letters pending review.
    pub pending_letters: i64,
    /// How long the oldest of them has waited.
    pub oldest_pending: Duration,
    /// Incidents still to be opened or resolved.
    pub undelivered: DeliveryBacklog,
    /// Replays recorded and not yet sent, and those past the bound.
    pub unsent: Unsent,
}

/// What one scheduled run did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledReport {
    /// Incident steps delivered and failed.
    pub alerts: Delivery,
    /// Escalations, or why they failed.
    pub escalation: Result<EscalationReport, String>,
    /// The sweep, or why it failed.
    pub sweep: Result<SweepReport, String>,
    /// Queued replays sent, or why the step failed.
    pub replays: Result<ReplaySends, String>,
    /// What waits, or why it could not be read.
    pub waiting: Result<Waiting, String>,
    /// The heartbeat's ping: `None` without a heartbeat.
    pub heartbeat: Option<Result<(), String>>,
}

impl ScheduledRun {
    /// Runs the steps; with a `deadline` (the invocation's, less a margin), each stops in time
    /// for the next, and the sweep stops before it.
    pub async fn run(&self, deadline: Option<Instant>) -> ScheduledReport {
        let replays = self
            .send_queued_replays(step_budget(deadline, REPLAY_BUDGET))
            .await
            .map_err(|e| e.to_string());
        let alerts = match &self.alerter {
            Some(alerter) => {
                let checked = alerter
                    .raise_again_resolved_by_hand(INCIDENT_CHECKS_PER_RUN)
                    .await;
                let mut delivered = alerter.deliver_pending(ALERT_RETRIES_PER_RUN).await;
                delivered.raised_again = checked.raised_again;
                delivered.failed += checked.failed;
                delivered.rejected += checked.rejected;
                delivered
            }
            None => Delivery::default(),
        };
        let escalation = self
            .escalate(Instant::now() + step_budget(deadline, ESCALATION_BUDGET))
            .await
            .map_err(|e| e.to_string());
        let sweep = sweep(&self.pool, self.clock.as_ref(), self.sweep, deadline)
            .await
            .map_err(|e| e.to_string());
        let waiting = self.waiting().await.map_err(|e| e.to_string());
        let replays_failing = replays_failing(&replays, &waiting);
        for (step, error) in [
            ("replays", replays.as_ref().err().map(String::as_str)),
            (
                "replays",
                (replays.is_ok() && replays_failing)
                    .then_some("queued replays are refused, or unsent past their bound"),
            ),
            ("escalation", escalation.as_ref().err().map(String::as_str)),
            ("sweep", sweep.as_ref().err().map(String::as_str)),
            ("waiting", waiting.as_ref().err().map(String::as_str)),
        ] {
            if let Some(error) = error {
                tracing::error!(step, error, "scheduled step failed");
            }
        }
        let failed = [
            replays_failing,
            escalation.is_err(),
            sweep.is_err(),
            waiting.is_err(),
        ]
        .contains(&true);
        let heartbeat = match &self.heartbeat {
            Some(heartbeat) => Some(heartbeat.ping(failed).await),
            None => None,
        };
        if let Some(Err(error)) = &heartbeat {
            tracing::warn!(error, "heartbeat not sent");
        }
        ScheduledReport {
            alerts,
            escalation,
            sweep,
            replays,
            waiting,
            heartbeat,
        }
    }

    /// Pages unreviewed groups, then queues whose replays stay unsent, until `until`.
    async fn escalate(&self, until: Instant) -> sqlx::Result<EscalationReport> {
        let Some(alerter) = &self.alerter else {
            return Ok(EscalationReport::default());
        };
        let routes = alerter.routes();
        let now = self.clock.now();
        let mut report = escalate(
            &self.pool,
            alerter.client(),
            routes.escalation.as_ref().unwrap_or(&routes.default),
            now,
            self.escalate_after,
            self.page_budget,
            until,
        )
        .await?;
        report.add(
            page_unsent_replays(
                &self.pool,
                alerter.client(),
                routes,
                now,
                self.replay_alert_after,
                self.page_budget,
                until,
            )
            .await?,
        );
        Ok(report)
    }

    async fn waiting(&self) -> sqlx::Result<Waiting> {
        let now = self.clock.now();
        let (pending_letters, oldest_pending) = pending_review(&self.pool, now).await?;
        Ok(Waiting {
            pending_letters,
            oldest_pending,
            undelivered: delivery_backlog(&self.pool, now).await?,
            unsent: unsent(&self.pool, now, self.replay_alert_after).await?,
        })
    }

    /// Sends the replays recorded over a minute ago that no queue accepted yet (the replay's own
    /// send failed, or its process died right after the commit), the one due longest first,
    /// at most [`REPLAYS_PER_RUN`] within `budget`. A refusal is recorded on the replay tried,
    /// with its backoff, and only there. A queue that refused itself ([`Refusal::Queue`]: it is
    /// gone, denies access, throttles, does not answer) is not asked again in this run: its
    /// other replays are left as they are, and the scan goes on past them, so a dead queue costs
    /// one call per run, not one per replay, and holds no other queue's replays back. A message
    /// refused for itself ([`Refusal::Message`]) holds back nothing: the next of its queue goes.
    /// A message sent twice is harmless: it carries the same job id, and the consumer's fence
    /// applies it once.
    async fn send_queued_replays(&self, budget: Duration) -> sqlx::Result<ReplaySends> {
        let Some(replayer) = &self.replayer else {
            return Ok(ReplaySends::default());
        };
        let started = Instant::now();
        let now = self.clock.now();
        let before = now - chrono::Duration::from_std(REPLAY_GRACE).unwrap_or_default();
        let mut refusing: Vec<String> = Vec::new();
        let mut after = None;
        let mut tried = 0;
        let mut sends = ReplaySends::default();
        'run: while tried < REPLAYS_PER_RUN {
            let page = due_replays(
                &self.pool,
                now,
                before,
                after,
                &refusing,
                REPLAYS_PER_RUN - tried,
            )
            .await?;
            if page.is_empty() {
                break;
            }
            for due in page {
                after = Some(due.position());
                let letter = &due.letter;
                if refusing.contains(&letter.queue) {
                    continue; // its queue refused another in this page: not tried, left as it is
                }
                let left = budget.saturating_sub(started.elapsed());
                if left.is_zero() {
                    tracing::warn!(
                        ?budget,
                        "replay step out of time; the rest is sent by the next run"
                    );
                    break 'run;
                }
                tried += 1;
                let result = match tokio::time::timeout(left, replayer.send(letter)).await {
                    Ok(sent) => sent,
                    Err(_) => Err(Refusal::Queue(format!(
                        "the send did not finish within the replay step's {budget:?}"
                    ))),
                };
                match result {
                    Ok(sent) => {
                        crate::dead_letter::record_replay_sent(
                            &self.pool,
                            letter.id,
                            &sent.message_id,
                            self.clock.now(),
                        )
                        .await?;
                        sends.sent += 1;
                    }
                    Err(refusal) => {
                        let attempts = u32::try_from(due.send_attempts).unwrap_or(0) + 1;
                        let queue_level = refusal.queue_level();
                        tracing::error!(letter = %letter.id, queue = letter.queue, attempts,
                            queue_level, error = %refusal, "queued replay still not sent");
                        record_send_refused(
                            &self.pool,
                            letter.id,
                            attempts,
                            refusal.error(),
                            self.clock.now(),
                        )
                        .await?;
                        sends.failed += 1;
                        if queue_level {
                            refusing.push(letter.queue.clone());
                        }
                    }
                }
            }
        }
        Ok(sends)
    }
}

/// What a step may spend: `cap`, and with a deadline at most a quarter of the time left.
fn step_budget(deadline: Option<Instant>, cap: Duration) -> Duration {
    match deadline {
        Some(deadline) => cap.min(deadline.saturating_duration_since(Instant::now()) / 4),
        None => cap,
    }
}

/// Whether sending replays is failing: the step failed, a due send was refused this run, or a
/// replay is unsent past its bound.
fn replays_failing(
    replays: &Result<ReplaySends, String>,
    waiting: &Result<Waiting, String>,
) -> bool {
    let refused = replays.as_ref().map_or(true, |r| r.failed > 0);
    let overdue = waiting.as_ref().is_ok_and(|w| w.unsent.overdue > 0);
    refused || overdue
}

impl ScheduledReport {
    /// The run as JSON (the function's response).
    pub fn to_json(&self) -> Value {
        let sweep = self.sweep.as_ref().map(|s| {
            json!({"deleted": s.deleted, "batches": s.batches, "stop": format!("{:?}", s.stop),
                   "oldest_age_seconds": s.oldest_age.map(|a| a.as_secs()), "backlog_seconds": s.backlog.as_secs()})
        });
        let waiting = self.waiting.as_ref().map(|w| {
            json!({"pending_letters": w.pending_letters, "oldest_pending_seconds": w.oldest_pending.as_secs(),
                   "undelivered_incidents": w.undelivered.groups, "oldest_undelivered_seconds": w.undelivered.oldest.as_secs(),
                   "queued_replays": w.unsent.queued, "oldest_queued_replay_seconds": w.unsent.oldest.as_secs(),
                   "overdue_replays": w.unsent.overdue})
        });
        let a = &self.alerts;
        json!({
            "alerts": {"opened": a.opened, "updated": a.updated, "resolved": a.resolved, "failed": a.failed,
                       "rejected": a.rejected, "raised_again": a.raised_again},
            "waiting": waiting.unwrap_or_else(|e| json!({"error": e})),
            "heartbeat": match &self.heartbeat {
                None => Value::Null,
                Some(Ok(())) => json!("sent"),
                Some(Err(e)) => json!({"error": e}),
            },
            "escalation": self.escalation.as_ref().map(|e| json!({"pages": e.pages, "letters": e.letters, "failed": e.failed,
                "unsent_replay_incidents_opened": e.unsent_opened, "unsent_replay_incidents_resolved": e.unsent_resolved,
                "deferred": e.deferred})).unwrap_or_else(|e| json!({"error": e})),
            "sweep": sweep.unwrap_or_else(|e| json!({"error": e})),
            "replays": self.replays.as_ref().map(|r| json!({"sent": r.sent, "failed": r.failed})).unwrap_or_else(|e| json!({"error": e})),
        })
    }

    /// The run's metrics as one EMF document.
    pub fn emf(&self, namespace: &str, at: chrono::DateTime<chrono::Utc>) -> Value {
        let (deleted, age, backlog) = match &self.sweep {
            Ok(s) => (
                s.deleted as f64,
                s.oldest_age.unwrap_or_default().as_secs_f64(),
                s.backlog.as_secs_f64(),
            ),
            Err(_) => (0.0, 0.0, 0.0),
        };
        let escalated = self
            .escalation
            .as_ref()
            .map(|e| e.letters as f64)
            .unwrap_or(0.0);
        let failed_steps = f64::from(
            u8::from(self.escalation.is_err())
                + u8::from(self.sweep.is_err())
                + u8::from(replays_failing(&self.replays, &self.waiting))
                + u8::from(self.waiting.is_err()),
        );
        let replays = self.replays.clone().unwrap_or_default();
        let waiting = self.waiting.clone().unwrap_or_default();
        let escalation_failed = self
            .escalation
            .as_ref()
            .map(|e| e.failed as f64)
            .unwrap_or(0.0);
        let values = [
            ("FencesDeleted", deleted, "Count"),
            ("OldestFenceAgeSeconds", age.floor(), "Seconds"),
            ("SweepBacklogSeconds", backlog.floor(), "Seconds"),
            ("LettersEscalated", escalated, "Count"),
            (
                "IncidentStepsDelivered",
                self.alerts.delivered() as f64,
                "Count",
            ),
            (
                "AlertDeliveriesFailed",
                self.alerts.failed as f64 + escalation_failed,
                "Count",
            ),
            ("AlertsRejected", self.alerts.rejected as f64, "Count"),
            (
                "OldestUndeliveredAlertSeconds",
                waiting.undelivered.oldest.as_secs() as f64,
                "Seconds",
            ),
            (
                "LettersPendingReview",
                waiting.pending_letters as f64,
                "Count",
            ),
            (
                "OldestPendingLetterAgeSeconds",
                waiting.oldest_pending.as_secs() as f64,
                "Seconds",
            ),
            ("ScheduledStepsFailed", failed_steps, "Count"),
            ("QueuedReplaysSent", replays.sent as f64, "Count"),
            ("QueuedReplaysFailed", replays.failed as f64, "Count"),
            ("QueuedReplays", waiting.unsent.queued as f64, "Count"),
            (
                "OldestQueuedReplaySeconds",
                waiting.unsent.oldest.as_secs() as f64,
                "Seconds",
            ),
            (
                "QueuedReplaysOverdue",
                waiting.unsent.overdue as f64,
                "Count",
            ),
            (
                "IncidentsRaisedAgain",
                self.alerts.raised_again as f64,
                "Count",
            ),
        ];
        emf_line(namespace, ("Function", "scheduled"), &values, at)
    }
}
