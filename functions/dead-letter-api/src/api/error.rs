//! The API's errors: a status, a stable machine code and a sentence for a person.
//!
//! Invariant: nothing internal reaches the caller. Database and SQS faults become a generic 500 or
//! 503 whose details go to the log once, with the request's route; 4xx messages only ever
//! describe the caller's own input.

use serde_json::{Value, json};

/// An error response: `{"error": {"code", "message"}}` with `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
}

impl ApiError {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: a path or query parameter is malformed or unknown.
    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_parameter", message)
    }

    /// 400: the body is not the JSON it should be.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_json", message)
    }

    /// 422: the body is JSON but its content is not acceptable.
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(422, "invalid_body", message)
    }

    /// 413: the body is larger than any this API accepts.
    pub fn body_too_large(message: impl Into<String>) -> Self {
        Self::new(413, "body_too_large", message)
    }

    /// 401: no authorizer context, or a token without a subject.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(401, "unauthenticated", message)
    }

    /// 403: the token lacks the route's scope.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "forbidden", message)
    }

    /// 404: no such route or letter.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found", message)
    }

    /// 405: the path exists with other methods.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "method_not_allowed", message)
    }

    /// 409: the letter is not in a state that allows this.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }

    /// 503: a dependency (database, queue) is unreachable; retrying later is safe.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(503, code, message)
    }

    /// 500: a fault of ours. The caller sees only that; the cause is logged here, once.
    pub fn internal(route: &str, cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(route, error = %cause, "request failed");
        Self::new(
            500,
            "internal",
            "the request failed on our side; it is logged, and retrying is safe",
        )
    }

    /// The response body.
    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }

    /// A database error on `route`: unreachable → 503, anything else → 500. Logged either way.
    pub fn database(route: &str, error: &sqlx::Error) -> Self {
        match error {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::error!(route, error = %error, "database unavailable");
                Self::unavailable(
                    "database_unavailable",
                    "the database is unavailable; nothing was changed, retry later",
                )
            }
            other => Self::internal(route, other),
        }
    }
}
