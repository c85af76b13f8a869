//! The operators' HTTP API over `core.dead_letters` and its failure groups: list and get
//! letters, replay and discard them, list and get groups, and start, follow and cancel bulk
//! operations on the letters a filter selects. It lives in
//! this crate, not in `shared`, so a consumer links neither it nor `lambda_http`.
//!
//! Independent of the transport: [`Api::handle`] takes an [`ApiRequest`] and returns an
//! [`ApiResponse`]; [`lambda`] adapts API Gateway (HTTP API, payload v2) to it. Each Lambda
//! serves only its own [`ROUTES`], so each role holds only what its routes need: only the replay
//! function has an SQS client.
//!
//! Invariants: a request is routed, then authorized, then validated, and only then touches the
//! database, so a 4xx never changes anything. Errors are `{"error": {"code", "message"}}`.

pub mod auth;
mod cursor;
mod edit;
mod error;
mod handlers;
pub mod lambda;
pub mod list_query;
mod operations;
mod pending;
mod reason;
mod replay;
mod routes;
mod values;

pub use auth::{Caller, Scope};
pub use error::ApiError;
pub use handlers::MAX_BODY_BYTES;
pub use reason::MAX_REASON_CHARS;
use routes::match_path;
pub use routes::{Operation, ROUTES, Route, function_for, route_for};

use serde_json::Value;
use shared::clock::Clock;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// A request, as any transport delivers it.
#[derive(Debug, Clone, Default)]
pub struct ApiRequest {
    /// HTTP method.
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// Decoded query pairs, in order.
    pub query: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// The verified caller; `None` when no authorizer context came with the request.
    pub caller: Option<Caller>,
}

/// A JSON response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    /// HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
}

/// A 200 answer with `body`.
fn ok(body: Value) -> Result<ApiResponse, ApiError> {
    Ok(ApiResponse { status: 200, body })
}

impl From<ApiError> for ApiResponse {
    fn from(error: ApiError) -> Self {
        Self {
            status: error.status,
            body: error.body(),
        }
    }
}

/// The API as one function serves it.
pub struct Api {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    lock_wait: Duration,
    function: &'static str,
    replayer: Option<shared::replay::Replayer>,
}

impl Api {
    /// The read function: list and get.
    pub fn read(pool: PgPool, clock: Arc<dyn Clock>, lock_wait: Duration) -> Self {
        Self::serving("dead-letters-read", pool, clock, lock_wait, None)
    }

    /// The discard function.
    pub fn discard(pool: PgPool, clock: Arc<dyn Clock>, lock_wait: Duration) -> Self {
        Self::serving("dead-letters-discard", pool, clock, lock_wait, None)
    }

    /// The replay function, the only one that can send.
    pub fn replay(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        lock_wait: Duration,
        replayer: shared::replay::Replayer,
    ) -> Self {
        Self::serving(
            "dead-letters-replay",
            pool,
            clock,
            lock_wait,
            Some(replayer),
        )
    }

    fn serving(
        function: &'static str,
        pool: PgPool,
        clock: Arc<dyn Clock>,
        lock_wait: Duration,
        replayer: Option<shared::replay::Replayer>,
    ) -> Self {
        Self {
            pool,
            clock,
            lock_wait,
            function,
            replayer,
        }
    }

    /// The routes this function serves.
    pub fn routes(&self) -> impl Iterator<Item = &'static Route> + '_ {
        ROUTES.iter().filter(|r| r.function == self.function)
    }

    /// Routes, authorizes, validates and runs one request.
    pub async fn handle(&self, request: &ApiRequest) -> ApiResponse {
        self.handle_unless(request, None).await
    }

    /// [`Api::handle`] for a request its transport could not read whole (`problem`: a query
    /// string that is not UTF-8 once decoded, a body that is not the base64 it claims to be):
    /// routed and authorized as any other, then refused with `problem` before anything runs.
    pub async fn handle_unless(
        &self,
        request: &ApiRequest,
        problem: Option<ApiError>,
    ) -> ApiResponse {
        let outcome = async {
            let (route, id) = self.route(&request.method, &request.path)?;
            let actor = auth::authorize(request.caller.as_ref(), route.scope)?;
            if let Some(problem) = problem {
                return Err(problem);
            }
            // Boxed: the handlers' futures together are deep enough to overflow the compiler's
            // layout query depth in release builds (what SAM deploys).
            Box::pin(handlers::run(self, route, id, actor, request)).await
        }
        .await;
        outcome.unwrap_or_else(ApiResponse::from)
    }

    fn route<'p>(
        &self,
        method: &str,
        path: &'p str,
    ) -> Result<(&'static Route, Option<&'p str>), ApiError> {
        let mut path_matched = false;
        for route in self.routes() {
            if let Some(id) = match_path(route.path, path) {
                path_matched = true;
                if route.method.eq_ignore_ascii_case(method) {
                    return Ok((route, id));
                }
            }
        }
        let (method, path) = (list_query::shown(method), list_query::shown(path));
        Err(if path_matched {
            ApiError::method_not_allowed(format!("{method} is not allowed on {path}"))
        } else {
            ApiError::not_found(format!("no route {method} {path} here"))
        })
    }
}
