//! One value of a query string or a path, checked: bounded by what a letter can hold, and
//! refused with the parameter's name and at most [`SHOWN_CHARS`] of what was given.

use super::error::ApiError;
use chrono::{DateTime, Utc};
use shared::dead_letter::{ErrorKind, ReviewStatus};
use shared::ids::{ConsumerName, GroupId};

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

pub(super) fn a_uuid(name: &str, value: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::try_parse(value).map_err(|_| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be a UUID such as 0b7e5f6e-2c4d-4f7a-9d1e-3a5b7c9d1e2f, got {}",
            shown(value)
        ))
    })
}

/// A letter id's first hex digits (dashes allowed), as `git` takes a commit's.
pub(super) fn an_id_prefix(name: &str, value: &str) -> Result<(uuid::Uuid, uuid::Uuid), ApiError> {
    shared::dead_letter::id_prefix_range(value).ok_or_else(|| {
        ApiError::invalid_parameter(format!(
            "`{name}` must be the first 1 to 32 hex digits of a letter id (dashes allowed), such \
             as 481e82ee, got {}",
            shown(value)
        ))
    })
}

pub(super) fn statuses() -> Vec<&'static str> {
    ReviewStatus::ALL.iter().map(|s| s.as_str()).collect()
}

pub(super) fn kinds() -> Vec<&'static str> {
    ErrorKind::ALL.iter().map(|k| k.as_str()).collect()
}

pub(super) fn one_of<T>(
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
pub(super) fn a_queue(name: &str, value: &str) -> Result<String, ApiError> {
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
pub(super) fn a_consumer(name: &str, value: &str) -> Result<String, ApiError> {
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
pub(super) fn a_text(name: &str, value: &str) -> Result<String, ApiError> {
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
pub(super) fn storable(t: DateTime<Utc>) -> bool {
    t.timestamp_micros() >= PG_MIN_MICROS
}

pub(super) fn a_time(name: &str, value: &str) -> Result<DateTime<Utc>, ApiError> {
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

pub(super) fn a_limit(value: &str) -> Result<u32, ApiError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid_parameter(format!(
            "`limit` must be a whole number from 1 to {MAX_LIMIT}, got {}",
            shown(value)
        ))),
    }
}
