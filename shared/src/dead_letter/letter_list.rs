//! Listing dead letters newest first, by any filter the API takes, one keyset page at a time.

use super::list::Listing;
use super::{ErrorKind, LetterHead, ReviewStatus};
use crate::ids::{GroupId, JobId, TenantId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, Postgres, QueryBuilder};
use uuid::Uuid;

/// Characters of `last_error` a list item carries; [`super::letter`] has all of it.
pub(crate) const LIST_ERROR_CHARS: i32 = 300;

/// Which letters to list; every field narrows, `None` does not. Kept as JSON with a bulk
/// operation (its selection), so the same filter selects the same letters there.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListFilter {
    /// Review status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ReviewStatus>,
    /// Source queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Consumer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Error kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Created at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_from: Option<DateTime<Utc>>,
    /// Created strictly before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// The job (any consumer's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    /// The correlation id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
    /// The SQS message id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The failure group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<GroupId>,
    /// Letter ids from the first to the last of a range, both included: the letters whose id
    /// starts with a prefix ([`id_prefix_range`]), found on the primary key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_range: Option<(Uuid, Uuid)>,
}

/// The range of UUIDs that start with the hex digits `prefix` (dashes ignored, 1 to 32 digits):
/// the prefix padded with `0`s, then with `f`s. `None` for anything else.
pub fn id_prefix_range(prefix: &str) -> Option<(Uuid, Uuid)> {
    if prefix.len() > 36 {
        return None; // longer than a whole id, dashes included
    }
    let digits: String = prefix.chars().filter(|c| *c != '-').collect();
    if digits.is_empty() || digits.len() > 32 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let pad = |with: char| {
        let mut full = digits.to_ascii_lowercase();
        full.extend(std::iter::repeat_n(with, 32 - digits.len()));
        Uuid::try_parse(&full).ok()
    };
    Some((pad('0')?, pad('f')?))
}

/// A place in the newest-first order: the page continues with letters strictly after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The last listed letter's `created_at`.
    pub created_at: DateTime<Utc>,
    /// The last listed letter's id (ties on `created_at` are ordered by id).
    pub id: Uuid,
}

/// A letter in a list: its [`LetterHead`] (no payload, `last_error` cut to
/// [`LIST_ERROR_CHARS`]), and what a list shows beside it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct LetterSummary {
    /// The letter, as far as a list shows it.
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub head: LetterHead,
    /// Whether `last_error` was cut.
    pub last_error_truncated: bool,
    /// Whether its job's fence exists (its effect committed, so a replay would send nothing);
    /// `None` for a letter without a job id.
    pub fence_exists: Option<bool>,
}

impl std::ops::Deref for LetterSummary {
    type Target = LetterHead;

    fn deref(&self) -> &LetterHead {
        &self.head
    }
}

impl LetterSummary {
    /// The position right after this letter.
    pub fn position(&self) -> Position {
        Position {
            created_at: self.created_at,
            id: self.id.0,
        }
    }
}

/// Up to `limit` letters matching `filter`, newest first, strictly after `after`.
///
/// Only the conditions that are set reach the SQL, so each filter combination gets a plan for
/// its own index (`migrations/*_dead_letter_list_indexes.sql`).
pub async fn list_letters(
    db: impl PgExecutor<'_>,
    filter: &ListFilter,
    after: Option<Position>,
    limit: u32,
) -> sqlx::Result<Vec<LetterSummary>> {
    // Dynamic: only the set filters, and `LetterSummary` reads its head by `#[sqlx(flatten)]`.
    let mut q = QueryBuilder::<Postgres>::new(
        "SELECT id, job_id, tenant_id, consumer, queue, message_id, attempts, error_kind,
                left(last_error, ",
    );
    q.push_bind(LIST_ERROR_CHARS)
        .push(") AS last_error, char_length(last_error) > ")
        .push_bind(LIST_ERROR_CHARS)
        .push(
            " AS last_error_truncated, correlation_id, replay_of, status, discard_reason,
                reviewed_by, reviewed_at, created_at, replay_outcome, group_id,
                CASE WHEN job_id IS NOT NULL THEN EXISTS (
                    SELECT 1 FROM core.processed_jobs p
                    WHERE p.job_id = d.job_id AND p.consumer = d.consumer) END AS fence_exists
             FROM core.dead_letters d WHERE true",
        );
    let mut list = Listing::new(q);
    filter.narrow(&mut list);
    let after = after.map(|a| (a.created_at, a.id));
    let mut q = list.page("created_at", after, limit);
    q.build_query_as().fetch_all(db).await
}

impl ListFilter {
    /// Adds the conditions that are set to `list`, each on the column of its own index.
    pub(super) fn narrow(&self, list: &mut Listing) {
        list.test("status =", self.status.map(ReviewStatus::as_str))
            .test("queue =", self.queue.clone())
            .test("consumer =", self.consumer.clone())
            .test("error_kind =", self.error_kind.map(ErrorKind::as_str))
            .test("created_at >=", self.created_from)
            .test("created_at <", self.created_before)
            .test("job_id =", self.job_id.map(|j| j.0))
            .test("correlation_id =", self.correlation_id.clone())
            .test("tenant_id =", self.tenant_id.map(|t| t.0))
            .test("message_id =", self.message_id.clone())
            .test("group_id =", self.group_id.map(|g| g.0))
            .test("id >=", self.id_range.map(|(first, _)| first))
            .test("id <=", self.id_range.map(|(_, last)| last));
    }
}

#[cfg(test)]
mod id_prefix_tests {
    use super::*;

    #[test]
    fn a_prefix_is_the_range_of_ids_that_start_with_it() {
        let (first, last) = id_prefix_range("481E82ee-07").unwrap();
        assert_eq!(first.to_string(), "481e82ee-0700-0000-0000-000000000000");
        assert_eq!(last.to_string(), "481e82ee-07ff-ffff-ffff-ffffffffffff");
        let whole = "481e82ee-0733-4a23-bad4-7a61e82b1778";
        assert_eq!(
            id_prefix_range(whole),
            Some((whole.parse().unwrap(), whole.parse().unwrap()))
        );
        for bad in ["", "-", "xyz", "481e82ee-0733-4a23-bad4-7a61e82b17780"] {
            assert_eq!(id_prefix_range(bad), None, "{bad:?}");
        }
    }
}
