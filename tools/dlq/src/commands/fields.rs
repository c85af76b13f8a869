//! The API's values as the tables and fields show them: one line each, inert.

use crate::terminal::{Newlines, shown};
use serde_json::Value;

/// An RFC 3339 time to the second, with a space for the `T`.
pub(super) fn short_time(t: &str) -> String {
    t.get(..19).unwrap_or(t).replace('T', " ")
}

/// A value of the API's as one line of text, shown inert ([`crate::terminal::shown`]).
pub(super) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => shown(s, Newlines::Escape),
        other => shown(&other.to_string(), Newlines::Escape),
    }
}
