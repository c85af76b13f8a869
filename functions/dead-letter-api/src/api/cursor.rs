//! The opaque cursors of the list endpoints: a version, a time and an id, base64url-encoded; a
//! cursor this API did not issue is refused.

use super::error::ApiError;
use super::values::{MAX_CURSOR_CHARS, a_group_id, storable};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use shared::dead_letter::{GroupPosition, Position};

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
