//! The lease-and-loop driver: how the afterlife's background work is claimed and done, whatever
//! it talks to. Pages ([`crate::paging`]: BetterStack) and bulk operations on letters
//! ([`crate::operations`]: PostgreSQL and SQS) are each a [`Leased`] kind of work, and [`deliver`]
//! is the one loop that runs them.
//!
//! Invariants: a step is claimed in a committed row under one [`LEASE`] before the outside is
//! called, and recorded (or released, its attempt counted) after, so no lock is held while the
//! outside answers, two workers never work one step, and a worker that died is taken over when
//! its lease ends. A round works only until its end: a step claimed and not started is released
//! as it was, for the next round.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// How long a claimed step is left to its worker before another round may take it over: longer
/// than any step's budget.
pub(crate) const LEASE: Duration = Duration::from_secs(120);

/// A claim's times: steps due at `now` are claimed until `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The round's now.
    pub now: DateTime<Utc>,
    /// When the claim ends unless recorded or released first.
    pub until: DateTime<Utc>,
}

/// One kind of leased work: its due steps, how each is worked, and how it is recorded or
/// released. Each method is one short statement or one call outside.
pub(crate) trait Leased {
    /// A claimed step, with what working and recording it need.
    type Step;
    /// What the outside answered for a step.
    type Sent;
    /// What a step is worked with (BetterStack's client, an SQS client and a pool).
    type Client: ?Sized;
    /// Why a step was not worked.
    type Error: fmt::Display;
    /// What a recorded step did.
    type Done;
    /// The kind, for logs.
    const KIND: &'static str;

    /// Claims up to `limit` steps due at `lease.now`, until `lease.until`: the due steps a
    /// claim skips (held by another worker, or waiting out a backoff) never fill the limit.
    async fn claim(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        limit: i64,
    ) -> sqlx::Result<Vec<Self::Step>>;

    /// Works `step` with `client` within `budget`.
    async fn send(
        &self,
        client: &Self::Client,
        step: &Self::Step,
        budget: Duration,
    ) -> Result<Self::Sent, Self::Error>;

    /// Records a step that was worked, ending its claim.
    async fn record(
        &self,
        pool: &PgPool,
        step: &Self::Step,
        sent: Self::Sent,
        now: DateTime<Utc>,
    ) -> sqlx::Result<Self::Done>;

    /// Ends the claim of a step not worked: with its `error` (an attempt counted, retried after
    /// a backoff), or with none (out of time: left as it was).
    async fn release(
        &self,
        pool: &PgPool,
        step: &Self::Step,
        error: Option<&Self::Error>,
        now: DateTime<Utc>,
    ) -> sqlx::Result<()>;

    /// Names `step` in logs.
    fn label(step: &Self::Step) -> String;
}

/// Where a round works: the database its steps are claimed in, the client, and time.
pub(crate) struct Round<'a, C: ?Sized> {
    /// Claims and records.
    pub pool: &'a PgPool,
    /// What steps are worked with.
    pub client: &'a C,
    /// The round's clock.
    pub clock: &'a dyn crate::clock::Clock,
    /// No step starts after this; none runs past it.
    pub until: Instant,
    /// The most one step may take.
    pub per_step: Duration,
    /// When a step may start.
    pub pace: Pace,
}

impl<C: ?Sized> Clone for Round<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: ?Sized> Copy for Round<'_, C> {}

/// When a round starts a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// While any time is left: the steps share the round's budget (a letter's own round, which
    /// must not hold its message longer).
    Share,
    /// Only with a whole `per_step` left: a step started short of time would fail, count an
    /// attempt and, if the outside took it all the same, be worked again (the scheduled run's
    /// escalations).
    WholeSteps,
}

/// What became of one claimed step.
pub(crate) enum Outcome<'e, D, E> {
    /// Worked and recorded.
    Done(D),
    /// Not worked: released with its error.
    Failed(&'e E),
    /// Not started for lack of time: released as it was.
    Deferred,
}

/// Claims up to `limit` of `work`'s due steps and works each within the round's time, then
/// records or releases it, telling `tally` what became of it. Only the claim's failure is
/// returned: a record that fails is logged, and its lease's end makes the step due again.
pub(crate) async fn deliver<W: Leased>(
    round: Round<'_, W::Client>,
    work: &W,
    limit: i64,
    mut tally: impl FnMut(Outcome<'_, W::Done, W::Error>),
) -> sqlx::Result<()> {
    let now = round.clock.now();
    let until = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    // Only the wait for a connection is bounded by the round: a claim cut off mid-statement
    // could still commit, and its steps would wait out the lease with no worker.
    let Ok(conn) = tokio::time::timeout_at(round.until, crate::db::acquire(round.pool)).await
    else {
        return Ok(());
    };
    let mut conn = conn?;
    let steps = work.claim(&mut conn, Lease { now, until }, limit).await;
    conn.give_back();
    for step in steps? {
        if let Err(e) = deliver_one(round, work, &step, &mut tally).await {
            tracing::warn!(kind = W::KIND, step = W::label(&step), error = %e,
                "step not recorded; its lease ends and it is taken again");
        }
    }
    Ok(())
}

/// Works one claimed step if the round's pace lets it start, and records or releases it.
async fn deliver_one<W: Leased>(
    round: Round<'_, W::Client>,
    work: &W,
    step: &W::Step,
    tally: &mut impl FnMut(Outcome<'_, W::Done, W::Error>),
) -> sqlx::Result<()> {
    let left = round.until.saturating_duration_since(Instant::now());
    let enough = match round.pace {
        Pace::Share => !left.is_zero(),
        Pace::WholeSteps => left >= round.per_step,
    };
    if !enough {
        tally(Outcome::Deferred);
        return work
            .release(round.pool, step, None, round.clock.now())
            .await;
    }
    match work
        .send(round.client, step, round.per_step.min(left))
        .await
    {
        Ok(sent) => {
            let done = work
                .record(round.pool, step, sent, round.clock.now())
                .await?;
            tally(Outcome::Done(done));
            Ok(())
        }
        Err(error) => {
            tally(Outcome::Failed(&error));
            tracing::warn!(kind = W::KIND, step = W::label(step), %error,
                "step not worked; a later round retries it");
            work.release(round.pool, step, Some(&error), round.clock.now())
                .await
        }
    }
}
