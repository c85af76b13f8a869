//! The list endpoint's query string: filters, a bounded limit and an opaque cursor.
//!
//! Invariant: everything is validated before any SQL runs, and every refusal names the parameter
//! and what it accepts. An unknown parameter is refused too: a typo (`stauts=`) must not silently
//! list everything. Every value is bounded by what a letter can hold (a queue name as SQS allows
//! it, a consumer name as [`ConsumerName`] does, a correlation id as the letter writer cuts it,
//! a time PostgreSQL can store), so nothing an operator types reaches an index comparison or a
//! typed column out of range. A refusal quotes at most [`SHOWN_CHARS`] of the value.

pub use super::cursor::{decode_cursor, decode_group_cursor, encode_cursor, encode_group_cursor};
use super::error::ApiError;
use super::values::*;
pub use super::values::{
    DEFAULT_LIMIT, MAX_CURSOR_CHARS, MAX_LIMIT, MAX_QUEUE_CHARS, MAX_TEXT_BYTES, PG_MIN_MICROS,
    SHOWN_CHARS, a_group_id, shown,
};
use shared::dead_letter::{
    ErrorKind, GroupFilter, GroupPosition, GroupStatus, ListFilter, Position, ReviewStatus,
};
use shared::ids::{JobId, TenantId};

/// The query parameters the list endpoint accepts (the OpenAPI document lists the same).
pub const LIST_PARAMETERS: [&str; 14] = [
    "status",
    "queue",
    "consumer",
    "error_kind",
    "job_id",
    "correlation_id",
    "tenant_id",
    "message_id",
    "group_id",
    "id_prefix",
    "created_from",
    "created_before",
    "limit",
    "cursor",
];

/// The query parameters the group list accepts (the OpenAPI document lists the same).
pub const GROUP_PARAMETERS: [&str; 6] = [
    "status",
    "queue",
    "consumer",
    "error_kind",
    "limit",
    "cursor",
];

/// A validated list request.
#[derive(Debug, Clone, PartialEq)]
pub struct ListQuery {
    /// Which letters.
    pub filter: ListFilter,
    /// Continue after this letter.
    pub after: Option<Position>,
    /// Page size.
    pub limit: u32,
}

/// A validated group list request.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupQuery {
    /// Which groups.
    pub filter: GroupFilter,
    /// Continue after this group.
    pub after: Option<GroupPosition>,
    /// Page size.
    pub limit: u32,
}

/// The pairs of a request, each name at most once, every name one of `accepted`.
fn each_once<'p>(
    pairs: &'p [(String, String)],
    accepted: &[&str],
    what: &str,
) -> Result<Vec<(&'p str, &'p str)>, ApiError> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (name, value) in pairs {
        if !accepted.contains(&name.as_str()) {
            return Err(ApiError::invalid_parameter(format!(
                "unknown query parameter {}; {what} accepts {}",
                shown(name),
                accepted.join(", ")
            )));
        }
        if seen.iter().any(|(n, _)| n == name) {
            return Err(ApiError::invalid_parameter(format!(
                "`{name}` is given more than once; give it once"
            )));
        }
        seen.push((name, value));
    }
    Ok(seen)
}

/// Parses the query pairs of a list request.
pub fn parse_list_query(pairs: &[(String, String)]) -> Result<ListQuery, ApiError> {
    let mut query = ListQuery {
        filter: ListFilter::default(),
        after: None,
        limit: DEFAULT_LIMIT,
    };
    for (name, value) in each_once(pairs, &LIST_PARAMETERS, "the list")? {
        let f = &mut query.filter;
        match name {
            "status" => f.status = Some(one_of(name, value, ReviewStatus::parse, &statuses())?),
            "error_kind" => f.error_kind = Some(one_of(name, value, ErrorKind::parse, &kinds())?),
            "queue" => f.queue = Some(a_queue(name, value)?),
            "consumer" => f.consumer = Some(a_consumer(name, value)?),
            "job_id" => f.job_id = Some(JobId(a_uuid(name, value)?)),
            "correlation_id" => f.correlation_id = Some(a_text(name, value)?),
            "tenant_id" => f.tenant_id = Some(TenantId(a_uuid(name, value)?)),
            "message_id" => f.message_id = Some(a_text(name, value)?),
            "group_id" => f.group_id = Some(a_group_id(name, value)?),
            "id_prefix" => f.id_range = Some(an_id_prefix(name, value)?),
            "created_from" => f.created_from = Some(a_time(name, value)?),
            "created_before" => f.created_before = Some(a_time(name, value)?),
            "limit" => query.limit = a_limit(value)?,
            _ => query.after = Some(decode_cursor(value)?),
        }
    }
    if let (Some(from), Some(before)) = (query.filter.created_from, query.filter.created_before)
        && from >= before
    {
        return Err(ApiError::invalid_parameter(
            "`created_from` must be earlier than `created_before`",
        ));
    }
    Ok(query)
}

/// Parses the query pairs of a group list request. Without `status`, only open groups are
/// listed (what an operator needs first); `status=all` lists every group.
pub fn parse_group_query(pairs: &[(String, String)]) -> Result<GroupQuery, ApiError> {
    let mut query = GroupQuery {
        filter: GroupFilter {
            status: Some(GroupStatus::Open),
            ..Default::default()
        },
        after: None,
        limit: DEFAULT_LIMIT,
    };
    for (name, value) in each_once(pairs, &GROUP_PARAMETERS, "the group list")? {
        let f = &mut query.filter;
        match name {
            "status" if value == "all" => f.status = None,
            "status" => {
                let mut allowed: Vec<&str> = GroupStatus::ALL.iter().map(|s| s.as_str()).collect();
                allowed.push("all");
                f.status = Some(one_of(name, value, GroupStatus::parse, &allowed)?);
            }
            "error_kind" => f.error_kind = Some(one_of(name, value, ErrorKind::parse, &kinds())?),
            "queue" => f.queue = Some(a_queue(name, value)?),
            "consumer" => f.consumer = Some(a_consumer(name, value)?),
            "limit" => query.limit = a_limit(value)?,
            _ => query.after = Some(decode_group_cursor(value)?),
        }
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use chrono::DateTime;

    fn q(pairs: &[(&str, &str)]) -> Result<ListQuery, ApiError> {
        let owned: Vec<_> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_list_query(&owned)
    }

    #[test]
    fn cursors_round_trip_and_reject_tampering() {
        let position = Position {
            created_at: DateTime::from_timestamp_micros(1_796_000_000_123_456).unwrap(),
            id: uuid::Uuid::new_v4(),
        };
        let cursor = encode_cursor(position);
        assert_eq!(decode_cursor(&cursor).unwrap(), position);
        for bad in ["", "abc", "djF8MXwy", &cursor[1..], &format!("{cursor}x")] {
            assert_eq!(decode_cursor(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn a_cursor_time_postgres_cannot_hold_is_refused() {
        let id = uuid::Uuid::new_v4();
        let raw = |micros: &str| URL_SAFE_NO_PAD.encode(format!("v1|{micros}|{id}"));
        let at_min = decode_cursor(&raw(&PG_MIN_MICROS.to_string())).unwrap();
        assert_eq!(at_min.created_at.timestamp_micros(), PG_MIN_MICROS);
        for micros in [
            (PG_MIN_MICROS - 1).to_string(),
            i64::MIN.to_string(),
            i64::MAX.to_string(),
            "+1".into(),
            "-".into(),
            "1e3".into(),
        ] {
            assert_eq!(
                decode_cursor(&raw(&micros)).unwrap_err().status,
                400,
                "{micros}"
            );
        }
        let group = |micros: i64, id: &str| URL_SAFE_NO_PAD.encode(format!("g1|{micros}|{id}"));
        assert!(decode_group_cursor(&group(PG_MIN_MICROS - 1, "7")).is_err());
        assert!(decode_group_cursor(&group(0, "0")).is_err());
        assert!(decode_group_cursor(&group(0, "7")).is_ok());
        assert!(decode_cursor(&"A".repeat(MAX_CURSOR_CHARS + 1)).is_err());
    }

    #[test]
    fn filters_parse_and_bad_values_name_the_parameter() {
        let ok = q(&[
            ("status", "pending_review"),
            ("error_kind", "crashed"),
            ("limit", "10"),
        ])
        .unwrap();
        assert_eq!(ok.filter.status, Some(ReviewStatus::PendingReview));
        assert_eq!(ok.filter.error_kind, Some(ErrorKind::Crashed));
        assert_eq!(ok.limit, 10);
        assert_eq!(q(&[]).unwrap().limit, DEFAULT_LIMIT);
        for (pairs, needle) in [
            (vec![("status", "open")], "`status`"),
            (vec![("error_kind", "boom")], "`error_kind`"),
            (vec![("limit", "0")], "`limit`"),
            (vec![("limit", "201")], "`limit`"),
            (vec![("limit", "ten")], "`limit`"),
            (
                vec![("stauts", "replayed")],
                "unknown query parameter \"stauts\"",
            ),
            (vec![("queue", " ")], "`queue`"),
            (vec![("created_from", "yesterday")], "`created_from`"),
            (vec![("limit", "5"), ("limit", "6")], "more than once"),
            (
                vec![
                    ("created_from", "2026-11-30T00:00:00Z"),
                    ("created_before", "2026-11-29T00:00:00Z"),
                ],
                "earlier",
            ),
        ] {
            let err = q(&pairs).unwrap_err();
            assert_eq!(err.status, 400);
            assert!(err.message.contains(needle), "{pairs:?}: {}", err.message);
        }
    }
}
