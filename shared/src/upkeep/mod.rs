//! Upkeep: the scheduled run (EventBridge), what keeps a letter's afterlife moving when no
//! message arrives. Its steps, in order: send replays recorded but not sent, page failure groups
//! (read back open incidents, deliver the steps due), escalate unreviewed groups and replays
//! unsent past their bound, sweep expired fences, and measure what waits. Each step is bounded
//! and reports its own failure without stopping the others; [`ScheduledRun::conclude`] is the
//! one place that logs, decides the heartbeat and pings it.
//!
//! Invariant: the sweep, the pages and the escalations always get their turn. With a Lambda
//! deadline, the replay step may spend at most a quarter of the time left at its start (and
//! never more than [`REPLAY_BUDGET`]) and the escalation step a quarter of what is left then
//! ([`ESCALATION_BUDGET`] at most); every send and page is bounded by what its step has left.

mod heartbeat;
mod replays;
mod report;
pub mod sweep;
mod waiting;

pub use heartbeat::Heartbeat;
pub use replays::ReplaySends;
pub use report::{ScheduledReport, Waiting};
pub use waiting::{DeliveryBacklog, Received};
use waiting::{delivery_backlog, pending_review, received_letters};

use crate::clock::Clock;
use crate::paging::{Alerter, Escalations, Pace, Pages, ReadBacks, UnsentReplayIncidents};
use crate::replay::sends::unsent;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use sweep::{SweepReport, SweepSettings};
use tokio::time::Instant;

/// Group incidents whose step is due, delivered per run.
const ALERT_RETRIES_PER_RUN: i64 = 100;
/// Open groups whose incident is read back per run.
const INCIDENT_CHECKS_PER_RUN: i64 = 20;
/// Groups escalated per run.
const ESCALATIONS_PER_RUN: i64 = 100;
/// Queues with replays unsent past the bound handled per run.
const UNSENT_QUEUES_PER_RUN: i64 = 50;
/// The most the settle step may take.
pub(crate) const SETTLE_BUDGET: Duration = Duration::from_secs(60);
/// How long a settle round's claims may wait for a copy of a job inside its transaction.
const SETTLE_WAIT: Duration = Duration::from_secs(2);
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
    /// Pages (incidents, escalations), if alerting is on.
    pub alerter: Option<Alerter>,
    /// Sweep bounds.
    pub sweep: SweepSettings,
    /// Escalation threshold.
    pub escalate_after: Duration,
    /// Sends replays that were recorded but not sent; `None` leaves them queued.
    pub replayer: Option<crate::replay::Replayer>,
    /// A replay recorded this long ago and still unsent alerts: a metric, an incident for its
    /// queue, and a failed heartbeat.
    pub replay_alert_after: Duration,
    /// Pinged at the end of every run, so a scheduler that stopped pages someone.
    pub heartbeat: Option<Heartbeat>,
}

/// A step's result: what it did, or why it failed.
type Done<T> = Result<T, String>;

impl ScheduledRun {
    /// Runs the steps; with a `deadline` (the invocation's, less a margin), each stops in time
    /// for the next, and the sweep stops before it.
    pub async fn run(&self, deadline: Option<Instant>) -> ScheduledReport {
        let settled = self
            .settle_received(step_budget(deadline, SETTLE_BUDGET))
            .await;
        let replays = self
            .send_replays(step_budget(deadline, REPLAY_BUDGET))
            .await;
        let alerts = self.page_groups().await;
        let pages_until = Instant::now() + step_budget(deadline, ESCALATION_BUDGET);
        let escalation = self.escalate(pages_until).await;
        let unsent_replays = self.page_unsent_replays(pages_until).await;
        let sweep = self.sweep(deadline).await;
        let waiting = self.waiting().await;
        let report = ScheduledReport {
            settled,
            alerts,
            escalation,
            unsent_replays,
            sweep,
            replays,
            waiting,
            heartbeat: None,
        };
        self.conclude(report).await
    }

    /// Settles the letters received and not yet settled, every consumer's, within `budget`, and
    /// pages the groups of the letters it wrote: for the bulk operations' invocation (every
    /// minute), which bounds how long a stream's last rows wait (left for the next round, see
    /// [`crate::dead_letter::SETTLE_DUE`]). Answers as the invocation does: the letters written,
    /// or `{"error": …}` (logged).
    pub async fn settle_received_and_page(&self, budget: Duration) -> serde_json::Value {
        let settled = self.settle_received(budget).await;
        if settled.as_ref().is_ok_and(|&n| n > 0) {
            self.page_groups().await;
        }
        match settled {
            Ok(letters) => serde_json::json!(letters),
            Err(e) => {
                tracing::error!(error = %e, "settling the received letters failed");
                serde_json::json!({ "error": e })
            }
        }
    }

    /// Settles the letters received and not yet settled (a stream's tail, left for a round that
    /// did not come, or to a settler at work that stopped), every consumer's, in rounds, within
    /// `budget`: the letters written.
    async fn settle_received(&self, budget: Duration) -> Done<u64> {
        let until = Instant::now() + budget;
        let settle = async {
            let mut written = 0u64;
            for consumer in crate::dead_letter::consumers_with_received(&self.pool).await? {
                while Instant::now() < until {
                    let round = crate::dead_letter::settle_behind(
                        &self.pool,
                        &consumer,
                        self.clock.now(),
                        SETTLE_WAIT,
                        1,
                    );
                    let round = round.await?;
                    written += round.new_letters as u64;
                    if round.busy || round.settled.is_empty() {
                        break;
                    }
                }
            }
            Ok::<u64, crate::fence::FenceError>(written)
        };
        settle.await.map_err(|e| e.to_string())
    }

    /// Sends the replays recorded but not sent, within `budget`.
    async fn send_replays(&self, budget: Duration) -> Done<ReplaySends> {
        let sent = self.send_queued_replays(budget).await;
        sent.map_err(|e| e.to_string())
    }

    /// Reads back open groups' incidents, then delivers the group incident steps due (a group
    /// found resolved by hand is raised again in the same run).
    async fn page_groups(&self) -> Pages {
        let Some(alerter) = &self.alerter else {
            return Pages::default();
        };
        let mut pages = alerter
            .raise_again_resolved_by_hand(INCIDENT_CHECKS_PER_RUN)
            .await;
        pages.add(alerter.deliver_pending(ALERT_RETRIES_PER_RUN).await);
        pages
    }

    /// Pages each unreviewed group once per step, until `until`.
    async fn escalate(&self, until: Instant) -> Done<Pages> {
        let Some(alerter) = &self.alerter else {
            return Ok(Pages::default());
        };
        let routes = alerter.routes();
        let route = routes.escalation.as_ref().unwrap_or(&routes.default);
        let pager = Escalations {
            route,
            after: self.escalate_after,
        };
        let pages = alerter.page(&pager, ESCALATIONS_PER_RUN, until, Pace::WholeSteps);
        let pages = pages.await;
        pages.map_err(|e| e.to_string())
    }

    /// Reads back, opens and resolves the incidents of queues whose replays stay unsent, until
    /// `until`.
    async fn page_unsent_replays(&self, until: Instant) -> Done<Pages> {
        let Some(alerter) = &self.alerter else {
            return Ok(Pages::default());
        };
        let bound = self.replay_alert_after;
        let read_backs = ReadBacks::UnsentReplays { bound };
        let incidents = UnsentReplayIncidents {
            routes: alerter.routes(),
            bound,
        };
        let limit = UNSENT_QUEUES_PER_RUN;
        let paged = async {
            let mut pages = alerter
                .page(&read_backs, limit, until, Pace::WholeSteps)
                .await?;
            pages.add(
                alerter
                    .page(&incidents, limit, until, Pace::WholeSteps)
                    .await?,
            );
            Ok::<_, sqlx::Error>(pages)
        };
        paged.await.map_err(|e| e.to_string())
    }

    /// Deletes expired fences, stopping before `deadline`.
    async fn sweep(&self, deadline: Option<Instant>) -> Done<SweepReport> {
        let swept = sweep::sweep(&self.pool, self.clock.as_ref(), self.sweep, deadline).await;
        swept.map_err(|e| e.to_string())
    }

    /// Measures what waits: letters pending review, incidents not delivered, replays unsent.
    async fn waiting(&self) -> Done<Waiting> {
        let now = self.clock.now();
        let measured = async {
            let (pending_letters, oldest_pending) = pending_review(&self.pool, now).await?;
            Ok::<_, sqlx::Error>(Waiting {
                pending_letters,
                oldest_pending,
                undelivered: delivery_backlog(&self.pool, now).await?,
                unsent: unsent(&self.pool, now, self.replay_alert_after).await?,
                received: received_letters(&self.pool, now).await?,
            })
        };
        measured.await.map_err(|e| e.to_string())
    }

    /// Logs each failed step, and pings the heartbeat: failed if any step did.
    async fn conclude(&self, mut report: ScheduledReport) -> ScheduledReport {
        for (step, error) in report.failures() {
            tracing::error!(step, error, "scheduled step failed");
        }
        if let Some(heartbeat) = &self.heartbeat {
            let pinged = heartbeat.ping(report.failed()).await;
            if let Err(error) = &pinged {
                tracing::warn!(error, "heartbeat not sent");
            }
            report.heartbeat = Some(pinged);
        }
        report
    }
}

/// What a step may spend: `cap`, and with a deadline at most a quarter of the time left.
fn step_budget(deadline: Option<Instant>, cap: Duration) -> Duration {
    match deadline {
        Some(deadline) => cap.min(deadline.saturating_duration_since(Instant::now()) / 4),
        None => cap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_spends_at_most_a_quarter_of_what_is_left_and_never_more_than_its_cap() {
        let cap = Duration::from_secs(60);
        assert_eq!(step_budget(None, cap), cap);
        let soon = Instant::now() + Duration::from_secs(40);
        assert!(step_budget(Some(soon), cap) <= Duration::from_secs(10));
        let later = Instant::now() + Duration::from_secs(3_600);
        assert_eq!(step_budget(Some(later), cap), cap);
    }
}
