//! The API's routes: each method and path template with its operation, the scope it requires
//! and the function (binary) that serves it.

use super::auth::Scope;

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
    /// `POST /v1/core/dead-letter-operations/replay`: replay the pending letters a filter
    /// selects, server-side (or answer the plan: a dry run).
    StartReplayOperation,
    /// `POST /v1/core/dead-letter-operations/discard`: discard them.
    StartDiscardOperation,
    /// `GET /v1/core/dead-letter-operations`: the latest operations.
    ListOperations,
    /// `GET /v1/core/dead-letter-operations/{id}`: an operation and its progress.
    GetOperation,
    /// `POST /v1/core/dead-letter-operations/{id}/cancel`: stop a running operation.
    CancelOperation,
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
pub const ROUTES: [Route; 14] = [
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
    // A bulk operation is started by whoever may do its action to one letter, on that action's
    // function; the scheduled function works it.
    Route {
        method: "POST",
        path: "/v1/core/dead-letter-operations/replay",
        operation: Operation::StartReplayOperation,
        scope: Scope::Replay,
        function: "dead-letters-replay",
    },
    Route {
        method: "POST",
        path: "/v1/core/dead-letter-operations/discard",
        operation: Operation::StartDiscardOperation,
        scope: Scope::Discard,
        function: "dead-letters-discard",
    },
    Route {
        method: "GET",
        path: "/v1/core/dead-letter-operations",
        operation: Operation::ListOperations,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    Route {
        method: "GET",
        path: "/v1/core/dead-letter-operations/{id}",
        operation: Operation::GetOperation,
        scope: Scope::Read,
        function: "dead-letters-read",
    },
    // Whoever may start the operation's action may stop it: the handler checks that scope (the
    // operation's action), so the route asks only for the read scope.
    Route {
        method: "POST",
        path: "/v1/core/dead-letter-operations/{id}/cancel",
        operation: Operation::CancelOperation,
        scope: Scope::Read,
        function: "dead-letters-discard",
    },
];

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
pub(super) fn match_path<'p>(template: &str, path: &'p str) -> Option<Option<&'p str>> {
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
                | Operation::GetProcessedJob
                | Operation::ListOperations
                | Operation::GetOperation
                | Operation::CancelOperation => Scope::Read,
                Operation::Replay | Operation::Withdraw | Operation::StartReplayOperation => {
                    Scope::Replay
                }
                Operation::Discard | Operation::StartDiscardOperation => Scope::Discard,
                Operation::Edit => Scope::Edit,
            };
            assert_eq!(route.scope, scope, "{route:?}");
        }
    }
}
