//! An answer that was not a success, told in the operator's words (the flags, not the API's
//! parameters).

use super::types::Answer;
use serde_json::Value;

/// An answer that was not a success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API answered with an error: `{"error": {"code", "message"}}` or the gateway's own.
    #[error("{status} {code}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The API's code (`not_pending`, `forbidden`, …).
        code: String,
        /// Its sentence.
        message: String,
    },
    /// No usable answer after the retries.
    #[error("{0}")]
    Unreachable(String),
}

impl ApiError {
    /// The API's error code, if it answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Refused { code, .. } => Some(code),
            Self::Unreachable(_) => None,
        }
    }
}

/// An error answer: the API's `{"error": {"code", "message"}}`, or API Gateway's own
/// `{"message": "Unauthorized"}`.
pub(super) fn refused(status: u16, body: &Value, text: &str) -> ApiError {
    let code = body["error"]["code"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| match status {
            401 => "unauthenticated".into(),
            403 => "forbidden".into(),
            _ => "error".into(),
        });
    let message = body["error"]["message"]
        .as_str()
        .or_else(|| body["message"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| text.chars().take(200).collect());
    ApiError::Refused {
        status,
        code,
        message: as_flags(&message),
    }
}

/// The API's parameters and the `dlq` flags that set them.
const FLAGS: [(&str, &str); 13] = [
    ("group_id", "--group"),
    ("queue", "--queue"),
    ("consumer", "--consumer"),
    ("error_kind", "--kind"),
    ("job_id", "--job-id"),
    ("correlation_id", "--correlation-id"),
    ("tenant_id", "--tenant-id"),
    ("message_id", "--message-id"),
    ("created_from", "--from"),
    ("created_before", "--before"),
    ("status", "--status"),
    ("limit", "--limit"),
    ("id_prefix", "the letter id"),
];

/// An API message naming its parameters (`` `error_kind` ``) as the operator typed them: the flag
/// (`--kind`).
pub fn as_flags(message: &str) -> String {
    FLAGS
        .iter()
        .fold(message.to_owned(), |m, (parameter, flag)| {
            m.replace(&format!("`{parameter}`"), flag)
        })
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(answer: Answer) -> Result<T, ApiError> {
    serde_json::from_value(answer.body).map_err(|e| {
        ApiError::Unreachable(format!(
            "the API's answer is not what this tool expects: {e}"
        ))
    })
}

#[cfg(test)]
mod flag_tests {
    #[test]
    fn the_apis_parameters_are_named_as_the_flags_that_set_them() {
        assert_eq!(
            super::as_flags(
                "`error_kind` must be one of poison, permanent; `created_from` must be earlier than `created_before`"
            ),
            "--kind must be one of poison, permanent; --from must be earlier than --before"
        );
        assert_eq!(super::as_flags("no parameter here"), "no parameter here");
    }
}
