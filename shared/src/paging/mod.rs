//! Paging: what happens to a letter's failure after it is written, as far as a person is told.
//!
//! Every kind of page is a [`Pager`]: a failure group's incident ([`GroupIncidents`]: open,
//! update with the count, resolve), the read-back of an open incident that a person may have
//! resolved by hand ([`ReadBacks`]), the escalation of a group
//! nobody reviewed ([`Escalations`]) and the incident of a queue whose replays stay unsent
//! ([`UnsentReplayIncidents`]). [`deliver`] is the one loop that runs them.
//!
//! Invariants: a step is claimed in a committed row under one [`LEASE`] before BetterStack is
//! called and recorded (or released, its attempt counted) after, so no lock is held while
//! BetterStack answers, two senders never send one step, and a sender that died is taken over
//! when its lease ends. A round sends only until its end: a step claimed and not started is
//! released as it was, for the next round.

mod alerter;
mod betterstack;
mod escalations;
mod group_incident_text;
mod group_incidents;
mod read_backs;
mod routes;
mod unsent_replays;

pub use alerter::Alerter;
pub use betterstack::{AlertError, BetterStack};
pub(crate) use escalations::Escalations;
pub(crate) use group_incidents::GroupIncidents;
pub(crate) use read_backs::ReadBacks;
pub use routes::{Route, Routes};
pub(crate) use unsent_replays::UnsentReplayIncidents;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;
use tokio::time::Instant;

/// How long a claimed step is left to its sender before another round may take it over: longer
/// than any page's budget.
pub(crate) const LEASE: Duration = Duration::from_secs(120);

/// How often an open incident is read back from BetterStack, to find one a person resolved
/// there while what it stands for is still open.
pub(crate) const INCIDENT_CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// A claim's times: steps due at `now` are claimed until `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The round's now.
    pub now: DateTime<Utc>,
    /// When the claim ends unless recorded or released first.
    pub until: DateTime<Utc>,
}

/// What a step that went out did, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paged {
    /// An incident (or escalation page) was opened; `letters` it stands for.
    Opened { letters: u64 },
    /// An incident was brought up to its group's count.
    Updated,
    /// An incident was resolved.
    Resolved,
    /// An incident read back is still open.
    StillOpen,
    /// An incident read back was resolved by hand while what it stands for is open: due again.
    RaisedAgain,
}

/// One kind of page: its due steps, how each is sent, and how it is recorded or released.
/// Each method is one short statement or one BetterStack call.
pub(crate) trait Pager {
    /// A claimed step, with what sending and recording it need.
    type Step;
    /// What BetterStack answered for a step.
    type Sent;
    /// The kind, for logs.
    const KIND: &'static str;

    /// Claims up to `limit` steps due at `lease.now`, until `lease.until`: the due steps a
    /// claim skips (held by another sender, or waiting out a backoff) never fill the limit.
    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<Self::Step>>;

    /// Sends `step` to BetterStack within `budget`.
    async fn send(
        &self,
        client: &BetterStack,
        step: &Self::Step,
        budget: Duration,
    ) -> Result<Self::Sent, AlertError>;

    /// Records a step that went out, ending its claim.
    async fn record(
        &self,
        pool: &PgPool,
        step: &Self::Step,
        sent: Self::Sent,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Paged>;

    /// Ends the claim of a step not sent: with its `error` (an attempt counted, retried after a
    /// backoff), or with none (out of time: left as it was).
    async fn release(
        &self,
        pool: &PgPool,
        step: &Self::Step,
        error: Option<&AlertError>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<()>;

    /// Names `step` in logs.
    fn label(step: &Self::Step) -> String;
}

/// What a round of one or more pagers did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pages {
    /// Incidents (or escalation pages) opened.
    pub opened: usize,
    /// Incidents updated with their group's count.
    pub updated: usize,
    /// Incidents resolved.
    pub resolved: usize,
    /// Incidents found resolved by hand while what they stand for is open: each is due a new
    /// incident (opened by the same round, or the next).
    pub raised_again: usize,
    /// Letters still pending in what was opened (escalations).
    pub letters: u64,
    /// Steps that failed and are left for a later round.
    pub failed: usize,
    /// Of those, refused for the token (401/403): paging is broken until it is fixed.
    pub rejected: usize,
    /// Steps claimed and left for the next round for lack of time.
    pub deferred: usize,
}

impl Pages {
    /// Steps delivered.
    pub fn delivered(&self) -> usize {
        self.opened + self.updated + self.resolved
    }

    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: Pages) {
        self.opened += other.opened;
        self.updated += other.updated;
        self.resolved += other.resolved;
        self.raised_again += other.raised_again;
        self.letters += other.letters;
        self.failed += other.failed;
        self.rejected += other.rejected;
        self.deferred += other.deferred;
    }

    fn count(&mut self, paged: Paged) {
        match paged {
            Paged::Opened { letters } => {
                self.opened += 1;
                self.letters += letters;
            }
            Paged::Updated => self.updated += 1,
            Paged::Resolved => self.resolved += 1,
            Paged::RaisedAgain => self.raised_again += 1,
            Paged::StillOpen => {}
        }
    }

    fn count_failure(&mut self, error: &AlertError) {
        self.failed += 1;
        if matches!(error, AlertError::Rejected { .. }) {
            self.rejected += 1;
        }
    }
}

/// Where a round sends: the database its steps are claimed in, BetterStack, and time.
#[derive(Clone, Copy)]
pub(crate) struct Round<'a> {
    /// Claims and records.
    pub pool: &'a PgPool,
    /// Where pages go.
    pub client: &'a BetterStack,
    /// The round's clock.
    pub clock: &'a dyn crate::clock::Clock,
    /// No step starts after this; none runs past it.
    pub until: Instant,
    /// The most one step may take.
    pub per_page: Duration,
    /// When a step may start.
    pub pace: Pace,
}

/// When a round starts a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// While any time is left: the steps share the round's budget (a letter's own round, which
    /// must not hold its message longer).
    Share,
    /// Only with a whole `per_page` left: a step started short of time would fail, count an
    /// attempt and, if BetterStack took it all the same, be sent again (the scheduled run's
    /// escalations).
    WholePages,
}

/// Claims up to `limit` of `pager`'s due steps and sends each within the round's time, then
/// records it or releases it. Only the claim's failure is returned: a record that fails is
/// logged, and its lease's end makes the step due again.
pub(crate) async fn deliver<P: Pager>(
    round: Round<'_>,
    pager: &P,
    limit: i64,
) -> sqlx::Result<Pages> {
    let now = round.clock.now();
    let until = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    // Only the wait for a connection is bounded by the round: a claim cut off mid-statement
    // could still commit, and its steps would wait out the lease with no sender.
    let Ok(conn) = tokio::time::timeout_at(round.until, round.pool.acquire()).await else {
        return Ok(Pages::default());
    };
    let steps = pager.claim(&mut *conn?, Lease { now, until }, limit).await;
    let mut pages = Pages::default();
    for step in steps? {
        if let Err(e) = deliver_one(round, pager, &step, &mut pages).await {
            tracing::warn!(kind = P::KIND, step = P::label(&step), error = %e,
                "page not recorded; its lease ends and it is taken again");
        }
    }
    Ok(pages)
}

/// Sends one claimed step if the round's pace lets it start, and records or releases it.
async fn deliver_one<P: Pager>(
    round: Round<'_>,
    pager: &P,
    step: &P::Step,
    pages: &mut Pages,
) -> sqlx::Result<()> {
    let left = round.until.saturating_duration_since(Instant::now());
    let enough = match round.pace {
        Pace::Share => !left.is_zero(),
        Pace::WholePages => left >= round.per_page,
    };
    if !enough {
        pages.deferred += 1;
        return pager
            .release(round.pool, step, None, round.clock.now())
            .await;
    }
    match pager
        .send(round.client, step, round.per_page.min(left))
        .await
    {
        Ok(sent) => {
            let paged = pager
                .record(round.pool, step, sent, round.clock.now())
                .await?;
            pages.count(paged);
            Ok(())
        }
        Err(error) => {
            pages.count_failure(&error);
            tracing::warn!(kind = P::KIND, step = P::label(step), %error,
                "page not sent; a later round retries it");
            pager
                .release(round.pool, step, Some(&error), round.clock.now())
                .await
        }
    }
}

/// When a step that failed `failures` times before is due again: 10 s, doubling, up to 320 s.
pub(crate) fn retry_at(now: DateTime<Utc>, failures: i32) -> DateTime<Utc> {
    now + chrono::Duration::seconds(10 << failures.clamp(0, 5))
}

/// `error` as a step's `last_error` column takes it.
pub(crate) fn stored(error: &AlertError) -> String {
    crate::dead_letter::storable_error(&error.to_string()).into_owned()
}
