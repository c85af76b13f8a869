//! SQL literals, for the few statements the harness sends as one simple query with the `BEGIN`
//! or `COMMIT` they go with (a simple query carries no parameters): see `core.open_job`.
//!
//! Invariant: every value is written so that no setting changes its meaning: strings as
//! escape strings (`E'…'`, read the same whatever `standard_conforming_strings` says), bytes as
//! hex, and each literal cast to its type. NUL, which a query string cannot carry, becomes
//! U+FFFD (the ids reaching here are bounded and NUL-free already).

use chrono::{DateTime, SecondsFormat, Utc};
use std::fmt::Write;

/// `s` as a `text` literal.
pub(crate) fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 10);
    out.push_str("E'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            '\0' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out.push_str("'::text");
    out
}

/// `s` as a `text` literal, `NULL` for none.
pub(crate) fn opt_text(s: Option<&str>) -> String {
    s.map_or_else(|| "NULL::text".into(), text)
}

/// `u` as a `uuid` literal, `NULL` for none.
pub(crate) fn opt_uuid(u: Option<uuid::Uuid>) -> String {
    u.map_or_else(|| "NULL::uuid".into(), uuid)
}

/// `u` as a `uuid` literal.
pub(crate) fn uuid(u: uuid::Uuid) -> String {
    format!("'{u}'::uuid")
}

/// `ids` as a `uuid[]` literal.
pub(crate) fn uuids(ids: impl IntoIterator<Item = uuid::Uuid>) -> String {
    array(ids.into_iter().map(uuid), "uuid")
}

/// `t` as a `timestamptz` literal, to the microsecond.
pub(crate) fn timestamptz(t: DateTime<Utc>) -> String {
    format!(
        "'{}'::timestamptz",
        t.to_rfc3339_opts(SecondsFormat::Micros, true)
    )
}

/// `bytes` as a `bytea` literal (`NULL` for none).
pub(crate) fn bytea(bytes: Option<&[u8]>) -> String {
    let Some(bytes) = bytes else {
        return "NULL::bytea".into();
    };
    let mut out = String::with_capacity(2 * bytes.len() + 16);
    out.push_str("E'\\\\x");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push_str("'::bytea");
    out
}

/// `values` as a `bytea[]` literal.
pub(crate) fn byteas<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>) -> String {
    array(values.into_iter().map(bytea), "bytea")
}

/// Literals of `ty` as an array of `ty`.
fn array(literals: impl Iterator<Item = String>, ty: &str) -> String {
    let items: Vec<String> = literals.collect();
    format!("ARRAY[{}]::{ty}[]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_escapes_quotes_and_backslashes_and_drops_nul() {
        assert_eq!(text(r"it's a \ test"), r"E'it''s a \\ test'::text");
        assert_eq!(text("a\0b"), "E'a\u{FFFD}b'::text");
    }

    #[test]
    fn absent_values_are_typed_nulls() {
        assert_eq!(opt_text(None), "NULL::text");
        assert_eq!(opt_text(Some("a")), "E'a'::text");
        assert_eq!(opt_uuid(None), "NULL::uuid");
    }

    #[test]
    fn bytes_are_hex_in_an_escape_string() {
        assert_eq!(bytea(Some(&[0, 0xab])), r"E'\\x00ab'::bytea");
        assert_eq!(bytea(None), "NULL::bytea");
    }

    #[test]
    fn timestamps_keep_microseconds() {
        let t = DateTime::parse_from_rfc3339("2026-12-01T10:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(timestamptz(t), "'2026-12-01T10:00:00.123456Z'::timestamptz");
    }
}
