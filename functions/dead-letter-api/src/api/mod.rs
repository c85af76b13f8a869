//! The operators' HTTP API over `core.dead_letters` and its failure groups: list and get
//! letters, replay and discard them, list and get groups. It lives in
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
mod edit;
mod error;
mod handlers;
pub mod lambda;
pub mod list_query;
mod pending;
mod reason;
mod replay;

pub use auth::{Caller, Scope};
pub use error::ApiError;
pub use handlers::MAX_BODY_BYTES;
pub use reason::MAX_REASON_CHARS;

use serde_json::Value;
use shared::clock::Clock;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// What an endpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /v1/core/dead-letters`.
    List,
    /// `GET /v1/core/dead-letters/{id}`.
    Get,
    /// `POST /v1/core/dead-letters/{id}/replay`.
    Replay,
    /// `POST /v1/core/dead-letters/{id}/discard`.
    Discard,
    /// `POST /v1/core/dead-letters/{id}/edit`: replay an edited body under the same job.
    Edit,
    /// `POST /v1/core/dead-letters/{id}/withdraw`: take back a queued replay no queue accepted;
    /// its job goes back to review as a new pending letter.
    Withdraw,
    /// `GET /v1/core/dead-letter-groups`.
    ListGroups,
    /// `GET /v1/core/dead-letter-groups/{id}`.
    GetGroup,
    /// `GET /v1/core/processed-jobs/{id}?consumer=…`: the job's fence, if it committed.
    GetProcessedJob,
}

/// One route: method, path template, required scope and the function (binary) that serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, `{id}` for the letter's or group's id (as in `template.yaml` and the
    /// OpenAPI document).
    pub path: &'static str,
    /// What it does.
    pub operation: Operation,
    /// The scope it needs.
    pub scope: Scope,
    /// The Lambda binary that serves it.
    pub function: &'static str,
}

/// Every route of the API. `template.yaml` and `openapi.yaml` are tested against it.
pub const ROUTES: [Route; 9] = [
    Route {
        method: "GET",
        path: "/v1/core/dead-letters",
        operation: Operation::List,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    Route {
        method: "GET",
        path: "/v1/core/dead-letters/{id}",
        operation: Operation::Get,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    Route {
        method: "POST",
        path: "/v1/core/dead-letters/{id}/replay",
        operation: Operation::Replay,
        scope: Scope::Replay,
        function: "dead-letters-replay",
    },
    // On the replay function: an edited replay sends as a replay does, so it needs exactly the
    // replay role's grants; its own scope is what sets it apart (checked by the gateway and
    // again by the handler).
    Route {
        method: "POST",
        path: "/v1/core/dead-letters/{id}/edit",
        operation: Operation::Edit,
        scope: Scope::Edit,
        function: "dead-letters-replay",
    },
    // On the replay function: it undoes a replay, so whoever may replay may withdraw one.
    Route {
        method: "POST",
        path: "/v1/core/dead-letters/{id}/withdraw",
        operation: Operation::Withdraw,
        scope: Scope::Replay,
        function: "dead-letters-replay",
    },
    Route {
        method: "POST",
        path: "/v1/core/dead-letters/{id}/discard",
        operation: Operation::Discard,
        scope: Scope::Discard,
        function: "dead-letters-discard",
    },
    Route {
        method: "GET",
        path: "/v1/core/dead-letter-groups",
        operation: Operation::ListGroups,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    Route {
        method: "GET",
        path: "/v1/core/dead-letter-groups/{id}",
        operation: Operation::GetGroup,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    Route {
        method: "GET",
        path: "/v1/core/processed-jobs/{id}",
        operation: Operation::GetProcessedJob,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
];

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

/// The route of `method path`, by [`ROUTES`]; `None` for no route.
pub fn route_for(method: &str, path: &str) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.method.eq_ignore_ascii_case(method) && match_path(r.path, path).is_some())
}

/// The function (binary) that serves `method path`, by [`ROUTES`]; `None` for no route.
pub fn function_for(method: &str, path: &str) -> Option<&'static str> {
    route_for(method, path).map(|r| r.function)
}

/// Matches `path` against a template with at most one `{id}` segment; returns the id if any.
fn match_path<'p>(template: &str, path: &'p str) -> Option<Option<&'p str>> {
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    let mut id = None;
    let mut segments = path.split('/');
    for expected in template.split('/') {
        let actual = segments.next()?;
        if expected == "{id}" {
            id = Some(actual);
        } else if expected != actual {
            return None;
        }
    }
    segments.next().is_none().then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_their_templates_only() {
        let t = "/v1/core/dead-letters/{id}/replay";
        assert_eq!(
            match_path(t, "/v1/core/dead-letters/abc/replay"),
            Some(Some("abc"))
        );
        assert_eq!(
            match_path(t, "/v1/core/dead-letters/abc/replay/"),
            Some(Some("abc"))
        );
        assert_eq!(match_path(t, "/v1/core/dead-letters/abc"), None);
        assert_eq!(match_path(t, "/v1/core/dead-letters/abc/replay/x"), None);
        assert_eq!(
            match_path("/v1/core/dead-letters", "/v1/core/dead-letters"),
            Some(None)
        );
    }

    #[test]
    fn every_route_has_one_function_and_the_scope_its_operation_needs() {
        for route in ROUTES {
            let scope = match route.operation {
                Operation::List
                | Operation::Get
                | Operation::ListGroups
                | Operation::GetGroup
                | Operation::GetProcessedJob => Scope::Read,
                Operation::Replay | Operation::Withdraw => Scope::Replay,
                Operation::Discard => Scope::Discard,
                Operation::Edit => Scope::Edit,
            };
            assert_eq!(route.scope, scope, "{route:?}");
        }
    }
}
