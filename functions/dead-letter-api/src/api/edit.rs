//! An edited replay's request: the corrected envelope, why, and whether only to check it.
//!
//! Invariant: what an edit may change is the job's content, never which job it is. The edited
//! body must be an envelope, under the letter's `job_id` and (where the letter knows it) its
//! `tenant_id`; the consumer is the letter's queue and is not in the request at all. So the fence
//! still decides the job's one effect. The body fits one SQS message, holds no NUL (PostgreSQL
//! text cannot store it), and differs from the body received (else it is a plain replay).

use super::error::ApiError;
use super::list_query::shown;
use super::reason::reason_text;
use serde_json::Value;
use shared::dead_letter::DeadLetter;
use shared::envelope::Envelope;

/// The largest edited envelope, in bytes: SQS's largest message (256 KiB).
pub const MAX_EDITED_BODY_BYTES: usize = 256 * 1024;
/// The largest edit request, in bytes: an envelope of [`MAX_EDITED_BODY_BYTES`], its reason and
/// room for the JSON around them.
pub const MAX_EDIT_REQUEST_BYTES: usize = MAX_EDITED_BODY_BYTES + 32 * 1024;

const SHAPE: &str = r#"the body must be a JSON object such as {"body": {"job_id": "…", "tenant_id": "…", "payload": {…}}, "reason": "producer 4.2 renamed points to pts", "dry_run": false}"#;

/// An edit, as requested.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    /// The corrected envelope, a JSON object.
    pub body: Value,
    /// Why: required, as for a discard.
    pub reason: String,
    /// Check the edit and show the plan, without replaying.
    pub dry_run: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    body: Option<Value>,
    reason: Option<Value>,
    #[serde(default)]
    dry_run: bool,
}

/// Reads an edit request. Not JSON is a 400; another shape (a missing or blank reason, a body
/// that is not an object, an unknown field such as `queue`) a 422; too large a 413.
pub fn parse_edit(request: &[u8]) -> Result<Edit, ApiError> {
    if request.len() > MAX_EDIT_REQUEST_BYTES {
        return Err(ApiError::body_too_large(format!(
            "the request is {} bytes; an edit is at most {MAX_EDIT_REQUEST_BYTES} bytes (an \
             envelope of at most {MAX_EDITED_BODY_BYTES} bytes, SQS's largest message)",
            request.len()
        )));
    }
    let fields: Request = serde_json::from_slice(request).map_err(|e| {
        if e.is_data() {
            ApiError::invalid_body(format!("{}; {SHAPE}", shown(&e.to_string())))
        } else {
            ApiError::invalid_json(SHAPE)
        }
    })?;
    let reason = match fields.reason {
        Some(Value::String(reason)) => reason_text(&reason).map_err(ApiError::invalid_body)?,
        Some(_) => return Err(ApiError::invalid_body("`reason` must be a string")),
        None => {
            return Err(ApiError::invalid_body(
                "`reason` is required: say what was wrong with the body and why the edit fixes it",
            ));
        }
    };
    let body = match fields.body {
        Some(body @ Value::Object(_)) => body,
        Some(_) => {
            return Err(ApiError::invalid_body(
                "`body` must be the edited envelope, a JSON object",
            ));
        }
        None => {
            return Err(ApiError::invalid_body(format!(
                "`body` is required; {SHAPE}"
            )));
        }
    };
    Ok(Edit {
        body,
        reason,
        dry_run: fields.dry_run,
    })
}

impl Edit {
    /// The edited envelope as it will be sent, once checked against `letter`: the same job and
    /// tenant, an envelope, one SQS message, and not the body received. A 422 says which.
    pub fn checked_against(&self, letter: &DeadLetter) -> Result<String, ApiError> {
        let field = |name: &str| self.body.get(name).and_then(Value::as_str);
        let same = |name: &str, kept: Option<String>| match (kept, field(name)) {
            (Some(kept), Some(edited))
                if uuid::Uuid::try_parse(edited).is_ok_and(|e| e.to_string() == kept) =>
            {
                Ok(())
            }
            (None, _) => Ok(()),
            (Some(kept), edited) => Err(ApiError::invalid_body(format!(
                "`{name}` cannot change in an edit: the letter's is {kept}, the edit's {}; an \
                 edited replay is the same job, so the fence still allows one effect",
                edited.map_or_else(|| "is missing".to_owned(), shown)
            ))),
        };
        same("job_id", letter.job_id.map(|j| j.to_string()))?;
        same("tenant_id", letter.tenant_id.map(|t| t.to_string()))?;
        let sent = serde_json::to_string(&self.body).map_err(|e| {
            ApiError::invalid_body(format!("the edited body cannot be written: {e}"))
        })?;
        if sent.len() > MAX_EDITED_BODY_BYTES {
            return Err(ApiError::body_too_large(format!(
                "the edited envelope is {} bytes; SQS takes at most {MAX_EDITED_BODY_BYTES}",
                sent.len()
            )));
        }
        Envelope::<Value>::parse_job(&sent, &[]).map_err(|poison| {
            ApiError::invalid_body(format!(
                "the edited body is not an envelope: {}",
                shown(&poison.reason)
            ))
        })?;
        let received = shared::replay::letter_body(letter);
        if serde_json::from_str::<Value>(&received).is_ok_and(|r| r == self.body) {
            return Err(ApiError::invalid_body(
                "the edited body is the body received: replay the letter instead of editing it",
            ));
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_needs_a_body_object_and_a_reason_and_nothing_else() {
        let edit = parse_edit(br#"{"body": {"job_id": "x"}, "reason": " fixed "}"#).unwrap();
        assert_eq!((edit.reason.as_str(), edit.dry_run), ("fixed", false));
        for (request, status) in [
            (&br#"{"body": {}}"#[..], 422),
            (br#"{"body": {}, "reason": "  "}"#, 422),
            (br#"{"body": "x", "reason": "r"}"#, 422),
            (br#"{"reason": "r"}"#, 422),
            (br#"{"body": {}, "reason": "r", "queue": "other"}"#, 422),
            (br#"{"body": {}, "reason": "r", "dry_run": "yes"}"#, 422),
            (b"not json", 400),
        ] {
            let status_of = parse_edit(request).unwrap_err().status;
            assert_eq!(status_of, status, "{}", String::from_utf8_lossy(request));
        }
        let huge = vec![b' '; MAX_EDIT_REQUEST_BYTES + 1];
        assert_eq!(parse_edit(&huge).unwrap_err().status, 413);
    }
}
