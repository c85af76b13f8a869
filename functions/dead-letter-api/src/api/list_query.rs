//! The list endpoint's query string: filters, a bounded limit and an opaque cursor.
//!
//! Invariant: everything is validated before any SQL runs, and every refusal names the parameter
//! and what it accepts. An unknown parameter is refused too: a typo (`stauts=`) must not silently
//! list everything.

use super::error::ApiError;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use shared::dead_letter::ErrorKind;
use shared::groups::{GroupFilter, GroupPosition, GroupStatus};
use shared::ids::{GroupId, JobId, TenantId};
use shared::review::{ListFilter, Position, ReviewStatus};

/// The query parameters the list endpoint accepts (the OpenAPI document lists the same).
pub const LIST_PARAMETERS: [&str; 13] = [
    "status",
    "queue",
    "consumer",
    "error_kind",
    "job_id",
    "correlation_id",
    "tenant_id",
    "message_id",
    "group_id",
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

/// Page size when `limit` is not given.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest `limit`.
pub const MAX_LIMIT: u32 = 200;
/// The longest queue or consumer name accepted as a filter.
const MAX_NAME_CHARS: usize = 256;

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
        if seen.iter().any(|(n, _)| n == name) {
            return Err(ApiError::invalid_parameter(format!(
                "`{name}` is given more than once; give it once"
            )));
        }
        if !accepted.contains(&name.as_str()) {
            return Err(ApiError::invalid_parameter(format!(
                "unknown query parameter `{name}`; {what} accepts {}",
                accepted.join(", ")
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
            "queue" => f.queue = Some(a_name(name, value)?),
            "consumer" => f.consumer = Some(a_name(name, value)?),
            "job_id" => f.job_id = Some(JobId(a_uuid(name, value)?)),
            "correlation_id" => f.correlation_id = Some(a_name(name, value)?),
            "tenant_id" => f.tenant_id = Some(TenantId(a_uuid(name, value)?)),
            "message_id" => f.message_id = Some(a_name(name, value)?),
            "group_id" => f.group_id = Some(a_group_id(name, value)?),
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
            "queue" => f.queue = Some(a_name(name, value)?),
            "consumer" => f.consumer = Some(a_name(name, value)?),
            "limit" => query.limit = a_limit(value)?,
            _ => query.after = Some(decode_group_cursor(value)?),
        }
    }
    Ok(query)
}

/// A group id as a path or query parameter names it: a positive whole number.
pub fn a_group_id(name: &str, value: &str) -> Result<GroupId, ApiError> {
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Ok(GroupId(n)),
        _ => Err(ApiError::invalid_parameter(format!(
            "`{name}` must be a group id, a positive whole number such as 42, got {value:?}"
        ))),
    }
}

fn a_uuid(name: &str, value: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::try_parse(value).map_err(|_| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be a UUID such as 0b7e5f6e-2c4d-4f7a-9d1e-3a5b7c9d1e2f, got {value:?}"
        ))
    })
}

fn statuses() -> Vec<&'static str> {
    ReviewStatus::ALL.iter().map(|s| s.as_str()).collect()
}

fn kinds() -> Vec<&'static str> {
    ErrorKind::ALL.iter().map(|k| k.as_str()).collect()
}

fn one_of<T>(
    name: &str,
    value: &str,
    parse: fn(&str) -> Option<T>,
    allowed: &[&str],
) -> Result<T, ApiError> {
    parse(value).ok_or_else(|| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be one of {}, got {value:?}",
            allowed.join(", ")
        ))
    })
}

fn a_name(name: &str, value: &str) -> Result<String, ApiError> {
    if value.trim().is_empty()
        || value.chars().count() > MAX_NAME_CHARS
        || value.chars().any(char::is_control)
    {
        return Err(ApiError::invalid_parameter(format!(
            "`{name}` must be 1 to {MAX_NAME_CHARS} printable characters"
        )));
    }
    Ok(value.to_owned())
}

fn a_time(name: &str, value: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            ApiError::invalid_parameter(format!(
                "`{name}` must be an RFC 3339 time such as 2026-11-30T08:00:00Z, got {value:?}"
            ))
        })
}

fn a_limit(value: &str) -> Result<u32, ApiError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid_parameter(format!(
            "`limit` must be a whole number from 1 to {MAX_LIMIT}, got {value:?}"
        ))),
    }
}

const CURSOR_VERSION: &str = "v1";
const GROUP_CURSOR_VERSION: &str = "g1";

/// The opaque cursor for the group page after `position`.
pub fn encode_group_cursor(position: GroupPosition) -> String {
    let raw = format!(
        "{GROUP_CURSOR_VERSION}|{}|{}",
        position.last_letter_at.timestamp_micros(),
        position.id
    );
    URL_SAFE_NO_PAD.encode(raw)
}

/// The position a cursor from [`encode_group_cursor`] stands for.
pub fn decode_group_cursor(cursor: &str) -> Result<GroupPosition, ApiError> {
    let (micros, id) = cursor_parts(cursor, GROUP_CURSOR_VERSION)?;
    let id = id.parse().map(GroupId).map_err(|_| bad_cursor())?;
    Ok(GroupPosition {
        last_letter_at: micros,
        id,
    })
}

fn bad_cursor() -> ApiError {
    ApiError::invalid_parameter(
        "`cursor` is not one this API issued; pass `next_cursor` from a previous page unchanged",
    )
}

/// A cursor's time and id, if it is one of `version`.
fn cursor_parts(cursor: &str, version: &str) -> Result<(DateTime<Utc>, String), ApiError> {
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad_cursor())?;
    let raw = String::from_utf8(raw).map_err(|_| bad_cursor())?;
    let mut parts = raw.split('|');
    let (Some(v), Some(micros), Some(id), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad_cursor());
    };
    if v != version {
        return Err(bad_cursor());
    }
    let at = micros
        .parse()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .ok_or_else(bad_cursor)?;
    Ok((at, id.to_owned()))
}

/// The opaque cursor for the page after `position`.
pub fn encode_cursor(position: Position) -> String {
    let raw = format!(
        "{CURSOR_VERSION}|{}|{}",
        position.created_at.timestamp_micros(),
        position.id
    );
    URL_SAFE_NO_PAD.encode(raw)
}

/// The position a cursor from [`encode_cursor`] stands for.
pub fn decode_cursor(cursor: &str) -> Result<Position, ApiError> {
    let (created_at, id) = cursor_parts(cursor, CURSOR_VERSION)?;
    let id = id.parse().map_err(|_| bad_cursor())?;
    Ok(Position { created_at, id })
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "unknown query parameter `stauts`",
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
