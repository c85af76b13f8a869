//! The pinned set a bulk command works on, and the failures its groups stand for.

use crate::args::Bulk;
use crate::client::{ApiError, Client, Letter};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// The pinned set: every letter pending review that the filter selects, written before `pin`.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The instant the set is pinned at.
    pub pin: DateTime<Utc>,
    /// The letters, newest first.
    pub letters: Vec<Letter>,
}

/// Reads the whole pinned set, page by page.
pub async fn select(client: &Client, bulk: &Bulk) -> Result<Selection, ApiError> {
    let pin = bulk.filter.before.unwrap_or_else(Utc::now);
    let mut filter = bulk.filter.clone();
    filter.before = Some(pin);
    let mut query = filter.query();
    query.push(("status".into(), "pending_review".into()));
    query.push(("limit".into(), "200".into()));
    let mut letters = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut q = query.clone();
        if let Some(c) = &cursor {
            q.push(("cursor".into(), c.clone()));
        }
        let page = client.letters(&q).await?;
        letters.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(Selection { pin, letters })
}

/// The failure each group of the set stands for (its pattern), for the plan; at most the first
/// 20 groups are looked up, the rest show without it.
pub(super) async fn patterns(client: &Client, selection: &Selection) -> BTreeMap<i64, String> {
    let ids: std::collections::BTreeSet<i64> = selection
        .letters
        .iter()
        .filter_map(|l| l.group_id)
        .collect();
    let mut patterns = BTreeMap::new();
    for id in ids.into_iter().take(20) {
        if let Ok(group) = client.group(id).await {
            patterns.insert(id, group.pattern);
        }
    }
    patterns
}
