//! Paging: what happens to a letter's failure after it is written, as far as a person is told.
//!
//! Every kind of page is a [`Pager`]: a failure group's incident ([`GroupIncidents`]: open,
//! update with the count, resolve), the read-back of an open incident that a person may have
//! resolved by hand ([`ReadBacks`]), the escalation of a group
//! nobody reviewed ([`Escalations`]) and the incident of a queue whose replays stay unsent
//! ([`UnsentReplayIncidents`]). [`deliver`] is the one loop that runs them.
//!
//! Invariants: each kind is [`Leased`] work ([`crate::lease`]): a step is claimed in a committed
//! row under one lease before BetterStack is called and recorded (or released, its attempt
//! counted) after, so no lock is held while BetterStack answers, two senders never send one
//! step, and a sender that died is taken over when its lease ends.

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

pub(crate) use crate::lease::{Lease, Pace};
use crate::lease::{Leased, Outcome, Round};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// How often an open incident is read back from BetterStack, to find one a person resolved
/// there while what it stands for is still open.
pub(crate) const INCIDENT_CHECK_INTERVAL: Duration = Duration::from_secs(300);

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

/// One kind of page: [`Leased`] work sent to BetterStack, each step recorded as what it
/// [`Paged`].
pub(crate) trait Pager:
    Leased<Client = BetterStack, Error = AlertError, Done = Paged>
{
}

impl<T: Leased<Client = BetterStack, Error = AlertError, Done = Paged>> Pager for T {}

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

/// Claims up to `limit` of `pager`'s due steps and sends each within the round's time, then
/// records it or releases it ([`crate::lease::deliver`]); what became of them, counted.
pub(crate) async fn deliver<P: Pager>(
    round: Round<'_, BetterStack>,
    pager: &P,
    limit: i64,
) -> sqlx::Result<Pages> {
    let mut pages = Pages::default();
    crate::lease::deliver(round, pager, limit, |outcome| match outcome {
        Outcome::Done(paged) => pages.count(paged),
        Outcome::Failed(error) => pages.count_failure(error),
        Outcome::Deferred => pages.deferred += 1,
    })
    .await?;
    Ok(pages)
}

/// When a step that failed `failures` times before is due again: 10 s, doubling, up to 320 s.
pub(crate) fn retry_at(now: DateTime<Utc>, failures: i32) -> DateTime<Utc> {
    now + chrono::Duration::seconds(10 << failures.clamp(0, 5))
}

/// `error` as a step's `last_error` column takes it.
pub(crate) fn stored(error: &AlertError) -> String {
    crate::dead_letter::storable_error(&error.to_string()).into_owned()
}
