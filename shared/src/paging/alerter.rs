//! The alerter: what the harness, the DLQ ingester and the scheduled run page with. A dead
//! letter is committed before any page is tried, and a page never holds its caller longer than
//! the alerter's budget; a step not delivered stays due in PostgreSQL for the scheduled run.

use super::{BetterStack, GroupIncidents, Pace, Pager, Pages, ReadBacks, Routes, deliver};
use crate::clock::Clock;
use crate::lease::Round;
use crate::metrics::{Metric, Metrics};
use sqlx::PgPool;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Delivers pages to BetterStack: failure groups' incidents, and, for the scheduled run, every
/// other kind.
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
        let routes = Arc::new(routes);
        Self {
            pool,
            client,
            routes,
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

    /// The time budget of one page.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The incidents of failure groups.
    pub(crate) fn group_incidents(&self) -> GroupIncidents<'_> {
        GroupIncidents {
            routes: &self.routes,
            update_every: self.update_every,
        }
    }

    /// Delivers up to `limit` due steps of `pager` until `until`, each within the budget,
    /// started at `pace`.
    pub(crate) async fn page<P: Pager>(
        &self,
        pager: &P,
        limit: i64,
        until: Instant,
        pace: Pace,
    ) -> sqlx::Result<Pages> {
        let round = Round {
            pool: &self.pool,
            client: &self.client,
            clock: self.clock.as_ref(),
            until,
            per_step: self.budget,
            pace,
        };
        deliver(round, pager, limit).await
    }

    /// Claims up to `limit` groups whose incident is due a step and delivers each, all within
    /// the budget. Never returns an error: alerting must not fail the caller. Boxed and erased:
    /// every message's future that writes a letter carries it, and inline its type is deep
    /// enough to overflow the compiler's `Send` check in callers.
    pub fn deliver_pending(&self, limit: i64) -> Pin<Box<dyn Future<Output = Pages> + Send + '_>> {
        Box::pin(async move {
            let until = Instant::now() + self.budget;
            let pages = self
                .page(&self.group_incidents(), limit, until, Pace::Share)
                .await;
            pages.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not read the incidents due");
                Pages::default()
            })
        })
    }

    /// Reads back up to `limit` open groups' incidents not read lately, within the budget: one a
    /// person resolved in BetterStack while its letters are pending is raised again by the next
    /// [`Self::deliver_pending`]. Never returns an error.
    pub(crate) async fn raise_again_resolved_by_hand(&self, limit: i64) -> Pages {
        let until = Instant::now() + self.budget;
        let pages = self
            .page(&ReadBacks::Groups, limit, until, Pace::Share)
            .await;
        pages.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read the open incidents to check");
            Pages::default()
        })
    }
}

impl Alerter {
    /// The paging rounds for `new_letters` just written: rounds of up to `per_round` incidents
    /// until one claims fewer (at most one round per `per_round` letters), so every group they
    /// opened is paged before the writer returns, not left to the scheduled run. Each round's
    /// failures are counted in `metrics`.
    pub(crate) async fn page_new_letters(
        &self,
        new_letters: usize,
        per_round: i64,
        metrics: &Metrics,
    ) {
        let per = usize::try_from(per_round).unwrap_or(1).max(1);
        for _ in 0..new_letters.div_ceil(per) {
            let delivery = self.deliver_pending(per_round).await;
            metrics.count_delivery(&delivery);
            let claimed = delivery.delivered() + delivery.failed + delivery.deferred;
            if claimed < per {
                break;
            }
        }
    }
}

impl Metrics {
    /// Counts what a paging round failed to deliver.
    pub(crate) fn count_delivery(&self, pages: &Pages) {
        self.add(Metric::AlertDeliveryFailed, pages.failed as u64);
        self.add(Metric::AlertRejected, pages.rejected as u64);
    }
}
