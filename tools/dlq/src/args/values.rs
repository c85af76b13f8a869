//! The values an operator types, each read and checked (a usage error naming the flag, never a
//! panic), and the ones written back into a command line to rerun.

use chrono::{DateTime, Utc};

/// The most letters `dlq list` reads (page by page).
pub const MAX_LIST: usize = 10_000;
/// The most groups `dlq groups` shows: one page of the API (its `limit` maximum).
pub const MAX_GROUPS: usize = 200;
/// The longest reason the API keeps, in characters (after trimming).
pub const MAX_REASON_CHARS: usize = 1000;

fn count_in(s: &str, max: usize) -> Result<usize, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 && n <= max as u64 => Ok(n as usize),
        _ => Err(format!("{s:?} is not a whole number from 1 to {max}")),
    }
}

/// `dlq list --limit`: 1 to [`MAX_LIST`].
pub fn parse_list_limit(s: &str) -> Result<usize, String> {
    count_in(s, MAX_LIST)
}

/// `dlq groups --limit`: 1 to [`MAX_GROUPS`].
pub fn parse_group_limit(s: &str) -> Result<usize, String> {
    count_in(s, MAX_GROUPS)
}

/// A group id: a positive whole number (an `i64`, as the API's ids are).
pub fn parse_group_id(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a group id, a positive whole number such as 42 (see `dlq groups`)"
        )),
    }
}

/// A letter (or an operation) named on the command line: its whole id, or the first hex digits
/// of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterId {
    /// A whole id.
    Whole(uuid::Uuid),
    /// The first 4 to 31 hex digits (dashes allowed).
    Prefix(String),
}

/// An operation named on the command line: as a letter, its whole id or its first hex digits.
pub type OperationId = LetterId;

/// A letter id, or at least its first 4 hex digits.
pub fn parse_letter_id(s: &str) -> Result<LetterId, String> {
    parse_id(s, "a letter id")
}

/// A bulk operation's id, or at least its first 4 hex digits (found among the latest
/// operations, `dlq operations`).
pub fn parse_operation_id(s: &str) -> Result<OperationId, String> {
    parse_id(s, "an operation id")
}

fn parse_id(s: &str, what: &str) -> Result<LetterId, String> {
    let s = s.trim();
    if let Ok(id) = uuid::Uuid::try_parse(s) {
        return Ok(LetterId::Whole(id));
    }
    let digits = s.chars().filter(|c| *c != '-').count();
    if (4..32).contains(&digits) && s.chars().all(|c| c == '-' || c.is_ascii_hexdigit()) {
        return Ok(LetterId::Prefix(s.to_ascii_lowercase()));
    }
    Err(format!(
        "{s:?} is not {what}: give the whole id (481e82ee-0733-4a23-bad4-7a61e82b1778) or at \
         least its first 4 hex digits (481e82ee)"
    ))
}

/// `--from` / `--before`: an RFC 3339 time, such as 2026-11-30T08:00:00Z.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| format!("{s:?} is not an RFC 3339 time such as 2026-11-30T08:00:00Z"))
}

/// `--reason`: what the API keeps (trimmed): plain text with something visible in it (no NUL,
/// no control character but tab and line breaks), at most [`MAX_REASON_CHARS`] characters. The
/// API checks again, more finely (invisible format characters).
pub fn parse_reason(s: &str) -> Result<String, String> {
    let reason = s.trim();
    if let Some(c) = reason
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(format!(
            "the reason contains the control character U+{:04X}; write plain text",
            u32::from(c)
        ));
    }
    if !reason.chars().any(|c| !c.is_whitespace()) {
        return Err(
            "the reason is blank: say why, for the next person who reads the letter".into(),
        );
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(format!(
            "the reason is {chars} characters; the API keeps at most {MAX_REASON_CHARS} (link \
             to a ticket for more)"
        ));
    }
    Ok(reason.to_owned())
}

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+=@".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A time as the API takes it, to the microsecond (a pin must not round).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
