//! The scheduled run (EventBridge): send replays that were recorded but not sent, deliver the
//! incident steps still due, escalate unreviewed groups, sweep expired fences, and measure what
//! waits (letters pending review, incidents not delivered). Each step is bounded; a failing step
//! is reported and does not stop the others.

use crate::alerting::{Alerter, Delivery};
use crate::clock::Clock;
use crate::escalation::{EscalationReport, escalate};
use crate::groups::{DeliveryBacklog, delivery_backlog, pending_review};
use crate::metrics::emf_line;
use crate::sweeper::{SweepReport, SweepSettings, sweep};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Unsent alert groups retried per run.
const ALERT_RETRIES_PER_RUN: i64 = 100;
/// Queued replays sent per run.
const REPLAYS_PER_RUN: i64 = 500;
/// A queued replay younger than this is left to the replay request that recorded it.
const REPLAY_GRACE: Duration = Duration::from_secs(60);

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
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

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
    pub async fn ping(&self, failed: bool) -> Result<(), String> {
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
    /// Still queued.
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
    /// Runs the three steps; the sweep stops before `deadline`.
    pub async fn run(&self, deadline: Option<Instant>) -> ScheduledReport {
        let replays = self.send_queued_replays().await.map_err(|e| e.to_string());
        let alerts = match &self.alerter {
            Some(alerter) => alerter.deliver_pending(ALERT_RETRIES_PER_RUN).await,
            None => Delivery::default(),
        };
        let escalation = match &self.alerter {
            Some(alerter) => {
                let routes = alerter.routes();
                escalate(
                    &self.pool,
                    alerter.client(),
                    routes.escalation.as_ref().unwrap_or(&routes.default),
                    self.clock.now(),
                    self.escalate_after,
                    self.page_budget,
                )
                .await
            }
            None => Ok(EscalationReport::default()),
        }
        .map_err(|e| e.to_string());
        let sweep = sweep(&self.pool, self.clock.as_ref(), self.sweep, deadline)
            .await
            .map_err(|e| e.to_string());
        let waiting = self.waiting().await.map_err(|e| e.to_string());
        for (step, error) in [
            ("replays", replays.as_ref().err()),
            ("escalation", escalation.as_ref().err()),
            ("sweep", sweep.as_ref().err()),
            ("waiting", waiting.as_ref().err()),
        ] {
            if let Some(error) = error {
                tracing::error!(step, error, "scheduled step failed");
            }
        }
        let failed = [
            replays.is_err(),
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

    async fn waiting(&self) -> sqlx::Result<Waiting> {
        let now = self.clock.now();
        let (pending_letters, oldest_pending) = pending_review(&self.pool, now).await?;
        Ok(Waiting {
            pending_letters,
            oldest_pending,
            undelivered: delivery_backlog(&self.pool, now).await?,
        })
    }

    /// Sends the replays recorded over a minute ago that no queue accepted yet (the replay's own
    /// send failed, or its process died right after the commit). A message sent twice is
    /// harmless: it carries the same job id, and the consumer's fence applies it once.
    async fn send_queued_replays(&self) -> sqlx::Result<ReplaySends> {
        let Some(replayer) = &self.replayer else {
            return Ok(ReplaySends::default());
        };
        let before =
            self.clock.now() - chrono::Duration::from_std(REPLAY_GRACE).unwrap_or_default();
        let mut sends = ReplaySends::default();
        for letter in crate::review::queued_replays(&self.pool, before, REPLAYS_PER_RUN).await? {
            let id = letter.id;
            match replayer.send(&letter).await {
                Ok(sent) => {
                    crate::review::record_replay_sent(
                        &self.pool,
                        id,
                        &sent.message_id,
                        self.clock.now(),
                    )
                    .await?;
                    sends.sent += 1;
                }
                Err(error) => {
                    tracing::error!(letter = %id, error, "queued replay still not sent");
                    sends.failed += 1;
                }
            }
        }
        Ok(sends)
    }
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
                   "undelivered_incidents": w.undelivered.groups, "oldest_undelivered_seconds": w.undelivered.oldest.as_secs()})
        });
        let a = &self.alerts;
        json!({
            "alerts": {"opened": a.opened, "updated": a.updated, "resolved": a.resolved, "failed": a.failed, "rejected": a.rejected},
            "waiting": waiting.unwrap_or_else(|e| json!({"error": e})),
            "heartbeat": match &self.heartbeat {
                None => Value::Null,
                Some(Ok(())) => json!("sent"),
                Some(Err(e)) => json!({"error": e}),
            },
            "escalation": self.escalation.as_ref().map(|e| json!({"pages": e.pages, "letters": e.letters, "failed": e.failed})).unwrap_or_else(|e| json!({"error": e})),
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
                + u8::from(self.replays.is_err())
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
        ];
        emf_line(namespace, ("Function", "scheduled"), &values, at)
    }
}
