//! The list endpoint's query string: filters, a bounded limit and an opaque cursor.
//!
//! Invariant: everything is validated before any SQL runs, and every refusal names the parameter
//! and what it accepts. An unknown parameter is refused too: a typo (`stauts=`) must not silently
//! list everything. Every value is bounded by what a letter can hold (a queue name as SQS allows
//! it, a consumer name as [`ConsumerName`] does, a correlation id as the letter writer cuts it,
//! a time PostgreSQL can store), so nothing an operator types reaches an index comparison or a
//! typed column out of range. A refusal quotes at most [`SHOWN_CHARS`] of the value.

use super::error::ApiError;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use shared::dead_letter::{
    ErrorKind, GroupFilter, GroupPosition, GroupStatus, ListFilter, Position, ReviewStatus,
};
use shared::ids::{ConsumerName, GroupId, JobId, TenantId};

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

/// Page size when `limit` is not given.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest `limit`.
pub const MAX_LIMIT: u32 = 200;
/// The longest queue name: SQS allows 80 characters of `A-Z a-z 0-9 - _` (`.fifo` included).
pub const MAX_QUEUE_CHARS: usize = 80;
/// The longest correlation id or message id filter, in bytes: a letter keeps at most this much
/// of a correlation id (cut at a character boundary), so a longer filter could never match.
pub const MAX_TEXT_BYTES: usize = 256;
/// The longest cursor: the API's own are under 100 characters.
pub const MAX_CURSOR_CHARS: usize = 256;
/// The characters of a refused value a message quotes.
pub const SHOWN_CHARS: usize = 40;
/// PostgreSQL's earliest `timestamptz` (4714-11-24 00:00:00 UTC BC) in Unix microseconds. Its
/// latest (294276 AD) is later than any time `chrono` holds, so only this end needs a check.
pub const PG_MIN_MICROS: i64 = -210_866_803_200_000_000;

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

/// A group id as a path or query parameter names it: a positive whole number.
pub fn a_group_id(name: &str, value: &str) -> Result<GroupId, ApiError> {
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Ok(GroupId(n)),
        _ => Err(ApiError::invalid_parameter(format!(
            "`{name}` must be a group id, a positive whole number such as 42, got {}",
            shown(value)
        ))),
    }
}

/// `value` quoted for a message: escaped, and cut to [`SHOWN_CHARS`] characters.
pub fn shown(value: &str) -> String {
    let count = value.chars().count();
    let head: String = value.chars().take(SHOWN_CHARS).collect();
    if count > SHOWN_CHARS {
        format!("{head:?}… ({count} characters)")
    } else {
        format!("{head:?}")
    }
}

fn a_uuid(name: &str, value: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::try_parse(value).map_err(|_| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be a UUID such as 0b7e5f6e-2c4d-4f7a-9d1e-3a5b7c9d1e2f, got {}",
            shown(value)
        ))
    })
}

/// A letter id's first hex digits (dashes allowed), as `git` takes a commit's.
fn an_id_prefix(name: &str, value: &str) -> Result<(uuid::Uuid, uuid::Uuid), ApiError> {
    shared::dead_letter::id_prefix_range(value).ok_or_else(|| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be the first 1 to 32 hex digits of a letter id (dashes allowed), such \
             as 481e82ee, got {}",
            shown(value)
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
            "`{name}` must be one of {}, got {}",
            allowed.join(", "),
            shown(value)
        ))
    })
}

/// A queue name as SQS allows it: 1 to 80 of `A-Z a-z 0-9 - _`, a FIFO queue's `.fifo` suffix.
fn a_queue(name: &str, value: &str) -> Result<String, ApiError> {
    let stem = value.strip_suffix(".fifo").unwrap_or(value);
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if stem.is_empty() || value.len() > MAX_QUEUE_CHARS || !stem.chars().all(valid) {
        return Err(ApiError::invalid_parameter(format!(
            "`{name}` must be a queue name, 1 to {MAX_QUEUE_CHARS} characters of A-Z, a-z, 0-9, \
             '-' and '_' (a FIFO queue's ending in .fifo), got {}",
            shown(value)
        )));
    }
    Ok(value.to_owned())
}

/// A consumer name as [`ConsumerName`] validates it (1 to 128 of `a-z 0-9 . _ -`).
fn a_consumer(name: &str, value: &str) -> Result<String, ApiError> {
    ConsumerName::new(value)
        .map(|c| c.as_str().to_owned())
        .map_err(|_| {
            ApiError::invalid_parameter(format!(
                "`{name}` must be a consumer name, 1 to 128 characters of a-z, 0-9, '.', '_' \
                 and '-', got {}",
                shown(value)
            ))
        })
}

/// An id as text (a correlation id, an SQS message id): not blank, no control characters, at
/// most [`MAX_TEXT_BYTES`] bytes of UTF-8.
fn a_text(name: &str, value: &str) -> Result<String, ApiError> {
    if value.trim().is_empty()
        || value.len() > MAX_TEXT_BYTES
        || value.chars().any(char::is_control)
    {
        return Err(ApiError::invalid_parameter(format!(
            "`{name}` must be 1 to {MAX_TEXT_BYTES} bytes of printable text (a letter keeps at \
             most {MAX_TEXT_BYTES} bytes of it), got {} of {} bytes",
            shown(value),
            value.len()
        )));
    }
    Ok(value.to_owned())
}

/// Whether PostgreSQL's `timestamptz` can hold `t`.
fn storable(t: DateTime<Utc>) -> bool {
    t.timestamp_micros() >= PG_MIN_MICROS
}

fn a_time(name: &str, value: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .filter(|t| storable(*t))
        .ok_or_else(|| {
            ApiError::invalid_parameter(format!(
                "`{name}` must be an RFC 3339 time such as 2026-11-30T08:00:00Z, got {}",
                shown(value)
            ))
        })
}

fn a_limit(value: &str) -> Result<u32, ApiError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid_parameter(format!(
            "`limit` must be a whole number from 1 to {MAX_LIMIT}, got {}",
            shown(value)
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
    let id = a_group_id("cursor", &id).map_err(|_| bad_cursor())?;
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

/// A cursor's time and id, if it is one of `version` and its time is one PostgreSQL can hold.
fn cursor_parts(cursor: &str, version: &str) -> Result<(DateTime<Utc>, String), ApiError> {
    if cursor.len() > MAX_CURSOR_CHARS {
        return Err(bad_cursor());
    }
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
    let digits = micros.strip_prefix('-').unwrap_or(micros);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_cursor());
    }
    let at = micros
        .parse()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .filter(|t| storable(*t))
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
    let id = uuid::Uuid::try_parse(&id).map_err(|_| bad_cursor())?;
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
