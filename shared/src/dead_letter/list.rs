//! The one shape of a list, of letters or of groups: a `SELECT … WHERE true`, then only the
//! conditions that are set (so each combination gets a plan for its own index), then one page
//! in newest-first keyset order, strictly after the last row of the page before.

use sqlx::{Encode, Postgres, QueryBuilder, Type};

/// A list query being built.
pub(super) struct Listing(QueryBuilder<Postgres>);

impl Listing {
    /// Starts from `select`, which ends in `WHERE true`.
    pub(super) fn new(select: QueryBuilder<Postgres>) -> Self {
        Self(select)
    }

    /// Adds ` AND <sql>`, as written.
    pub(super) fn and(&mut self, sql: &str) -> &mut Self {
        self.0.push(" AND ").push(sql);
        self
    }

    /// Adds ` AND <test> $n` (`test` is a column and an operator: `"queue ="`) if `value` is
    /// set.
    pub(super) fn test<T>(&mut self, test: &str, value: Option<T>) -> &mut Self
    where
        T: for<'t> Encode<'t, Postgres> + Type<Postgres>,
    {
        if let Some(value) = value {
            self.0.push(" AND ").push(test).push(" ").push_bind(value);
        }
        self
    }

    /// The query as narrowed, for a caller that ends it its own way (a count).
    pub(super) fn into_query(self) -> QueryBuilder<Postgres> {
        self.0
    }

    /// The page: rows strictly before `after` in `(<key>, id)` order, newest first, at most
    /// `limit`.
    pub(super) fn page<K, I>(
        mut self,
        key: &str,
        after: Option<(K, I)>,
        limit: u32,
    ) -> QueryBuilder<Postgres>
    where
        K: for<'t> Encode<'t, Postgres> + Type<Postgres>,
        I: for<'t> Encode<'t, Postgres> + Type<Postgres>,
    {
        let q = &mut self.0;
        if let Some((at, id)) = after {
            q.push(" AND (").push(key).push(", id) < (");
            q.push_bind(at).push(", ").push_bind(id).push(")");
        }
        q.push(" ORDER BY ").push(key).push(" DESC, id DESC LIMIT ");
        q.push_bind(i64::from(limit));
        self.0
    }
}
