//! A review's reason (discard, replay, withdraw, edit): read from its body, checked, and kept
//! as plain text a person can read.

use super::error::ApiError;
use super::list_query::shown;
use serde_json::Value;

/// The longest reason (discard or replay), in characters, after trimming.
pub const MAX_REASON_CHARS: usize = 1000;

/// The replay body: none, or `{"reason": "..."}` as for a discard (why it is replayed; a bulk
/// replay always says).
pub(super) fn parse_replay_reason(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    const SHAPE: &str =
        r#"the body must be empty or a JSON object such as {"reason": "ledger back after INC-42"}"#;
    checked_reason(body, SHAPE).map(Some)
}

/// The discard body: `{"reason": "..."}`, a non-blank reason of at most [`MAX_REASON_CHARS`].
pub(super) fn parse_reason(body: &[u8]) -> Result<String, ApiError> {
    const SHAPE: &str = r#"the body must be a JSON object such as {"reason": "duplicate of an award already corrected by hand"}"#;
    checked_reason(body, SHAPE)
}

/// A review body's fields, as they came: the `reason` (any JSON), whether it came twice, and the
/// first unknown field. Read as a JSON object only, so `["why"]` is not taken for a reason.
struct ReviewBody {
    reason: Option<Value>,
    repeated: bool,
    unknown: Option<String>,
}

impl<'de> serde::Deserialize<'de> for ReviewBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ReviewBody;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ReviewBody, A::Error> {
                let mut body = ReviewBody {
                    reason: None,
                    repeated: false,
                    unknown: None,
                };
                while let Some(key) = map.next_key::<String>()? {
                    if key == "reason" {
                        body.repeated |= body.reason.is_some();
                        body.reason = Some(map.next_value()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        body.unknown.get_or_insert(key);
                    }
                }
                Ok(body)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// `{"reason": "..."}` with a reason that is there, once, and [`reason_text`]; `shape` says what
/// the body should look like. Not JSON (or not UTF-8) is a 400; JSON of another shape a 422.
fn checked_reason(body: &[u8], shape: &str) -> Result<String, ApiError> {
    let fields: ReviewBody = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ApiError::invalid_body(shape)
        } else {
            ApiError::invalid_json(shape)
        }
    })?;
    if let Some(unknown) = &fields.unknown {
        return Err(ApiError::invalid_body(format!(
            "unknown field {}; {shape}",
            shown(unknown)
        )));
    }
    if fields.repeated {
        return Err(ApiError::invalid_body(
            "`reason` is given more than once; give it once",
        ));
    }
    match fields.reason {
        Some(Value::String(reason)) => reason_text(&reason).map_err(ApiError::invalid_body),
        Some(_) => Err(ApiError::invalid_body("`reason` must be a string")),
        None => Err(ApiError::invalid_body(
            "`reason` is required: say why, for the next person who reads the letter",
        )),
    }
}

/// The reason as kept: trimmed; plain text (no NUL, no control character but tab and line
/// breaks, so nothing in it can drive the terminal of whoever reads it with `dlq show`); with
/// something visible in it; at most [`MAX_REASON_CHARS`] characters. The error says which.
pub(super) fn reason_text(reason: &str) -> Result<String, String> {
    let reason = reason.trim();
    if reason.contains('\0') {
        return Err("`reason` contains a NUL character; write it as plain text".into());
    }
    if let Some(c) = reason
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(format!(
            "`reason` contains the control character U+{:04X}; write it as plain text (tabs and \
             line breaks are fine)",
            u32::from(c)
        ));
    }
    if !reason.chars().any(is_visible) {
        return Err(
            "`reason` is blank (only spaces or invisible characters): say why, for the next \
             person who reads the letter"
                .into(),
        );
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(format!(
            "`reason` is {chars} characters; at most {MAX_REASON_CHARS} are kept, link to a \
             ticket for more"
        ));
    }
    Ok(reason.to_owned())
}

/// Whether `c` shows on a screen: not white space, not a control character, and not one of the
/// characters that render as nothing: Unicode's default-ignorable code points (zero-width
/// spaces and joiners, bidirectional controls, variation selectors, tags, Hangul fillers, …),
/// the other format characters (Cf) and the blank braille pattern. The schema's
/// `dead_letters_reason_visible` check rejects a subset of these as well.
fn is_visible(c: char) -> bool {
    !(c.is_whitespace()
        || c.is_control()
        || matches!(c,
            '\u{00ad}' | '\u{034f}' | '\u{061c}' | '\u{0600}'..='\u{0605}' | '\u{06dd}'
            | '\u{070f}' | '\u{0890}'..='\u{0891}' | '\u{08e2}' | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}' | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202f}' | '\u{205f}'..='\u{206f}' | '\u{2800}' | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}' | '\u{110cd}' | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}' | '\u{e0000}'..='\u{e0fff}'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::handlers::{MAX_BODY_BYTES, bounded};

    #[test]
    fn reasons_are_required_non_blank_and_bounded() {
        assert_eq!(
            parse_reason(br#"{"reason": " fixed by hand "}"#).unwrap(),
            "fixed by hand"
        );
        let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(MAX_REASON_CHARS + 1));
        for (body, status) in [
            (&b""[..], 400),
            (b"reason=x", 400),
            (b"[1]", 422),
            (b"{}", 422),
            (br#"{"reason": "  "}"#, 422),
            ("{\"reason\": \"\u{200b}\u{200b}\"}".as_bytes(), 422),
            ("{\"reason\": \" \u{feff}\u{2060} \"}".as_bytes(), 422),
            (br#"{"reason": 7}"#, 422),
            (br#"{"reason": "a\u0000b"}"#, 422),
            (br#"{"reason": "x", "force": true}"#, 422),
            (br#"{"reason": "x", "reason": "y"}"#, 422),
            (br#"["x"]"#, 422),
            (br#"{"reason": "\u0001\u0002\u0003\u0007"}"#, 422),
            (br#"{"reason": "ok \u001b[2J"}"#, 422),
            (
                "{\"reason\": \"\u{2066}\u{e0041}\u{fe0f}\u{3164}\u{2800}\"}".as_bytes(),
                422,
            ),
            (br#"{"reason": "x"} trailing"#, 400),
            (b"\xff", 400),
            (long.as_bytes(), 422),
        ] {
            assert_eq!(parse_reason(body).unwrap_err().status, status, "{body:?}");
        }
        assert_eq!(
            parse_reason("{\"reason\": \"line one\\n\\tline two\"}".as_bytes()).unwrap(),
            "line one\n\tline two"
        );
        assert_eq!(
            bounded(&[b' '; MAX_BODY_BYTES + 1]).unwrap_err().status,
            413
        );
    }
}
