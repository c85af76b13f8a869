//! What a scheduled run reports: its response, its failed steps and its metrics.

use super::ReplaySends;
use super::sweep::SweepReport;
use super::{DeliveryBacklog, Received};
use crate::metrics::emf_line;
use crate::paging::Pages;
use crate::replay::sends::Unsent;
use serde_json::{Value, json};
use std::time::Duration;

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
    /// Records in the letters' intake: not yet settled, and set aside.
    pub received: Received,
}

/// What one scheduled run did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledReport {
    /// Letters written from the intake (received, not yet settled), or why the step failed.
    pub settled: Result<u64, String>,
    /// Group incident steps delivered and failed.
    pub alerts: Pages,
    /// Escalations of unreviewed groups, or why they failed.
    pub escalation: Result<Pages, String>,
    /// Incidents of queues whose replays stay unsent, or why they failed.
    pub unsent_replays: Result<Pages, String>,
    /// The sweep, or why it failed.
    pub sweep: Result<SweepReport, String>,
    /// Queued replays sent, or why the step failed.
    pub replays: Result<ReplaySends, String>,
    /// What waits, or why it could not be read.
    pub waiting: Result<Waiting, String>,
    /// The heartbeat's ping: `None` without a heartbeat.
    pub heartbeat: Option<Result<(), String>>,
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
    /// The steps that failed, each with why.
    pub(super) fn failures(&self) -> Vec<(&'static str, &str)> {
        let replays_refused = self.replays.is_ok() && replays_failing(&self.replays, &self.waiting);
        [
            ("settle", self.settled.as_ref().err().map(String::as_str)),
            ("replays", self.replays.as_ref().err().map(String::as_str)),
            (
                "replays",
                replays_refused.then_some("queued replays are refused, or unsent past their bound"),
            ),
            (
                "escalation",
                self.escalation.as_ref().err().map(String::as_str),
            ),
            (
                "unsent replays",
                self.unsent_replays.as_ref().err().map(String::as_str),
            ),
            ("sweep", self.sweep.as_ref().err().map(String::as_str)),
            ("waiting", self.waiting.as_ref().err().map(String::as_str)),
        ]
        .into_iter()
        .filter_map(|(step, error)| Some((step, error?)))
        .collect()
    }

    /// Whether a step failed (the heartbeat says so).
    pub(super) fn failed(&self) -> bool {
        !self.failures().is_empty()
    }

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
                   "overdue_replays": w.unsent.overdue, "received_unsettled": w.received.unsettled,
                   "oldest_received_seconds": w.received.oldest.as_secs(),
                   "received_set_aside": w.received.set_aside})
        });
        let a = &self.alerts;
        json!({
            "settled": self.settled.as_ref().map(|n| json!({"letters": n})).unwrap_or_else(|e| json!({"error": e})),
            "alerts": {"opened": a.opened, "updated": a.updated, "resolved": a.resolved, "failed": a.failed,
                       "rejected": a.rejected, "raised_again": a.raised_again},
            "waiting": waiting.unwrap_or_else(|e| json!({"error": e})),
            "heartbeat": match &self.heartbeat {
                None => Value::Null,
                Some(Ok(())) => json!("sent"),
                Some(Err(e)) => json!({"error": e}),
            },
            "escalation": self.escalation.as_ref().map(|e| json!({"pages": e.opened, "letters": e.letters,
                "failed": e.failed, "deferred": e.deferred})).unwrap_or_else(|e| json!({"error": e})),
            "unsent_replays": self.unsent_replays.as_ref().map(|u| json!({"incidents_opened": u.opened,
                "incidents_resolved": u.resolved, "raised_again": u.raised_again, "failed": u.failed,
                "deferred": u.deferred})).unwrap_or_else(|e| json!({"error": e})),
            "sweep": sweep.unwrap_or_else(|e| json!({"error": e})),
            "replays": self.replays.as_ref().map(|r| json!({"sent": r.sent, "failed": r.failed})).unwrap_or_else(|e| json!({"error": e})),
        })
    }

    /// The run's metrics as one EMF document.
    pub fn emf(&self, namespace: &str, at: chrono::DateTime<chrono::Utc>) -> Value {
        let mut values = self.sweep_values();
        values.extend(self.paging_values());
        values.extend(self.waiting_values());
        values.push((
            "ScheduledStepsFailed",
            self.failures().len() as f64,
            "Count",
        ));
        emf_line(namespace, ("Function", "scheduled"), &values, at)
    }

    fn sweep_values(&self) -> Vec<(&'static str, f64, &'static str)> {
        let (deleted, age, backlog) = match &self.sweep {
            Ok(s) => (
                s.deleted as f64,
                s.oldest_age.unwrap_or_default().as_secs_f64(),
                s.backlog.as_secs_f64(),
            ),
            Err(_) => (0.0, 0.0, 0.0),
        };
        vec![
            (
                "ReceivedLettersSettled",
                *self.settled.as_ref().unwrap_or(&0) as f64,
                "Count",
            ),
            ("FencesDeleted", deleted, "Count"),
            ("OldestFenceAgeSeconds", age.floor(), "Seconds"),
            ("SweepBacklogSeconds", backlog.floor(), "Seconds"),
        ]
    }

    fn paging_values(&self) -> Vec<(&'static str, f64, &'static str)> {
        let escalated = self.escalation.as_ref().map_or(0, |e| e.letters) as f64;
        let failed = |pages: &Result<Pages, String>| pages.as_ref().map_or(0, |p| p.failed);
        let failed = self.alerts.failed + failed(&self.escalation) + failed(&self.unsent_replays);
        let alerts = &self.alerts;
        vec![
            ("LettersEscalated", escalated, "Count"),
            ("IncidentStepsDelivered", alerts.delivered() as f64, "Count"),
            ("AlertDeliveriesFailed", failed as f64, "Count"),
            ("AlertsRejected", alerts.rejected as f64, "Count"),
            ("IncidentsRaisedAgain", alerts.raised_again as f64, "Count"),
        ]
    }

    fn waiting_values(&self) -> Vec<(&'static str, f64, &'static str)> {
        let replays = self.replays.clone().unwrap_or_default();
        let w = self.waiting.clone().unwrap_or_default();
        let secs = |d: Duration| d.as_secs() as f64;
        vec![
            (
                "OldestUndeliveredAlertSeconds",
                secs(w.undelivered.oldest),
                "Seconds",
            ),
            ("LettersPendingReview", w.pending_letters as f64, "Count"),
            (
                "OldestPendingLetterAgeSeconds",
                secs(w.oldest_pending),
                "Seconds",
            ),
            ("QueuedReplaysSent", replays.sent as f64, "Count"),
            ("QueuedReplaysFailed", replays.failed as f64, "Count"),
            ("QueuedReplays", w.unsent.queued as f64, "Count"),
            (
                "OldestQueuedReplaySeconds",
                secs(w.unsent.oldest),
                "Seconds",
            ),
            ("QueuedReplaysOverdue", w.unsent.overdue as f64, "Count"),
            ("LettersReceived", w.received.unsettled as f64, "Count"),
            (
                "OldestReceivedLetterSeconds",
                secs(w.received.oldest),
                "Seconds",
            ),
            ("LettersSetAside", w.received.set_aside as f64, "Count"),
        ]
    }
}
