//! The dead-letter API over HTTP: what the tool reads and does, with the token it was given.
//!
//! Invariant: the token goes only into the `Authorization` header; no error, log line or
//! `Debug` shows it. Throttling and unavailability (429, 502–504, no answer) are retried with
//! backoff; every other answer is returned as it came.

mod error;
mod http;
mod routes;
mod types;

pub use error::{ApiError, as_flags};
pub use http::Client;
pub use types::{Answer, FailedReplays, Group, Letter, Operation, OperationProgress, Page, Plan};
