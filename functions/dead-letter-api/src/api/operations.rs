//! Bulk operations: start one (a replay or a discard of the pending letters a filter selects,
//! with a reason; a dry run answers the plan), read its progress, list them, cancel one. The
//! work itself is the scheduled function's ([`shared::operations`]).

use super::auth::{self, Scope};
use super::error::ApiError;
use super::list_query::{parse_list_query, shown};
use super::reason::{parse_reason, reason_text};
use super::{Api, ApiRequest, ApiResponse, Route, ok};
use serde_json::{Map, Value, json};
use shared::dead_letter::ListFilter;
use shared::operations::{self, Action, Cancelled, Request};
use uuid::Uuid;

/// The filter's parameters an operation refuses: it works pending letters, all of them.
const NOT_IN_A_SELECTION: [&str; 3] = ["status", "limit", "cursor"];
/// Operations a list shows.
const LISTED: i64 = 50;

/// What a start request says.
struct Start {
    reason: String,
    selection: ListFilter,
    dry_run: bool,
}

/// `{"reason": "...", "filter": {<the list's parameters>}, "dry_run": false}`: a reason as a
/// review's, and a filter of at least one of the list's parameters, spelled as in its query
/// string (status, limit and cursor excepted: an operation takes every pending letter selected).
fn parse_start(body: &[u8]) -> Result<Start, ApiError> {
    const SHAPE: &str = r#"the body must be a JSON object such as {"reason": "partner back after INC-42", "filter": {"group_id": "17"}, "dry_run": true}"#;
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(match serde_json::from_slice::<Value>(body) {
            Ok(_) => ApiError::invalid_body(SHAPE),
            Err(_) => ApiError::invalid_json(SHAPE),
        });
    };
    // A key given twice would be read as its last value, silently: refused, as a review's
    // reason given twice is.
    if let Err(key) = serde_json::from_slice::<Unique>(body) {
        return Err(ApiError::invalid_body(format!(
            "{}; give each field once",
            key.to_string().split(" at line").next().unwrap_or_default()
        )));
    }
    let dry_run = match fields.remove("dry_run") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(ApiError::invalid_body("`dry_run` must be true or false")),
    };
    let filter = match fields.remove("filter") {
        Some(Value::Object(filter)) => filter,
        Some(_) => {
            return Err(ApiError::invalid_body(format!(
                "`filter` must be an object; {SHAPE}"
            )));
        }
        None => {
            return Err(ApiError::invalid_body(format!(
                "`filter` is required: which letters (a group_id, a queue, …); {SHAPE}"
            )));
        }
    };
    let reason = match fields.remove("reason") {
        Some(Value::String(reason)) => reason_text(&reason).map_err(ApiError::invalid_body)?,
        Some(_) => return Err(ApiError::invalid_body("`reason` must be a string")),
        // A dry run records nothing: it needs no reason.
        None if dry_run => String::new(),
        None => {
            return Err(ApiError::invalid_body(
                "`reason` is required: say why, for the next person who reads the letters",
            ));
        }
    };
    if let Some(unknown) = fields.keys().next() {
        return Err(ApiError::invalid_body(format!(
            "unknown field {}; {SHAPE}",
            shown(unknown)
        )));
    }
    Ok(Start {
        reason,
        selection: selection(filter)?,
        dry_run,
    })
}

/// Any JSON whose objects, at every depth, name each key once.
struct Unique;

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "`{}` is given more than once",
                    shown(&key)
                )));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

/// The filter object as the list's query would take it: each value a string (or a number, for
/// a group id), checked by the list's own parser.
fn selection(filter: Map<String, Value>) -> Result<ListFilter, ApiError> {
    let mut pairs = Vec::with_capacity(filter.len());
    for (name, value) in filter {
        if NOT_IN_A_SELECTION.contains(&name.as_str()) {
            return Err(ApiError::invalid_body(format!(
                "`filter.{}` is not taken: an operation works every pending letter the filter \
                 selects",
                shown(&name)
            )));
        }
        let value = match value {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            _ => {
                return Err(ApiError::invalid_body(format!(
                    "`filter.{}` must be a string, as in the list's query string",
                    shown(&name)
                )));
            }
        };
        pairs.push((name, value));
    }
    let filter = parse_list_query(&pairs)
        .map_err(|e| ApiError::invalid_body(format!("filter: {}", e.message)))?
        .filter;
    if filter == ListFilter::default() {
        return Err(ApiError::invalid_body(
            "`filter` selects every letter: name at least one of the list's filters (a \
             group_id, a queue, created_before, …)",
        ));
    }
    Ok(filter)
}

/// Starts a bulk `action` (or answers its plan, for a dry run).
pub(super) async fn start(
    api: &Api,
    route: &Route,
    action: Action,
    actor: &str,
    request: &ApiRequest,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let start = parse_start(super::handlers::bounded(&request.body)?)?;
    let now = api.clock.now();
    if start.dry_run {
        let plan = operations::plan(&api.pool, &start.selection, now)
            .await
            .map_err(db)?;
        return ok(
            json!({"dry_run": true, "action": action, "selection": start.selection,
                         "plan": plan}),
        );
    }
    let request = Request {
        action,
        selection: &start.selection,
        reason: &start.reason,
        actor,
    };
    let operation = operations::start(&api.pool, &request, now)
        .await
        .map_err(db)?;
    Ok(ApiResponse {
        status: 202,
        body: json!({"operation": operation}),
    })
}

/// One operation, with its progress.
pub(super) async fn get(api: &Api, route: &Route, id: Uuid) -> Result<ApiResponse, ApiError> {
    let operation = operations::get(&api.pool, id)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?
        .ok_or_else(|| missing(id))?;
    ok(json!({"operation": operation}))
}

/// The latest operations, newest first.
pub(super) async fn list(
    api: &Api,
    route: &Route,
    request: &ApiRequest,
) -> Result<ApiResponse, ApiError> {
    if let Some((name, _)) = request.query.first() {
        return Err(ApiError::invalid_parameter(format!(
            "unknown parameter {}: this route takes none (it lists the latest {LISTED})",
            shown(name)
        )));
    }
    let items = operations::list(&api.pool, LISTED)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?;
    ok(json!({"items": items}))
}

/// Cancels a running operation: whoever may start its action may stop it (checked here; the
/// route itself needs only the read scope).
pub(super) async fn cancel(
    api: &Api,
    route: &Route,
    id: Uuid,
    request: &ApiRequest,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let reason = parse_reason(super::handlers::bounded(&request.body)?)?;
    let operation = operations::get(&api.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(|| missing(id))?;
    let scope = match operation.action {
        Action::Replay => Scope::Replay,
        Action::Discard => Scope::Discard,
    };
    let actor = auth::authorize(request.caller.as_ref(), scope)?.unwrap_or_default();
    match operations::cancel(&api.pool, id, actor, &reason, api.clock.now())
        .await
        .map_err(db)?
    {
        Cancelled::Now(operation) => ok(json!({"operation": operation})),
        Cancelled::Ended(operation) => Err(ApiError::conflict(
            "not_running",
            format!(
                "operation {id} is {} already: what it did stays done",
                operation.status
            ),
        )),
        Cancelled::Missing => Err(missing(id)),
    }
}

fn missing(id: Uuid) -> ApiError {
    ApiError::not_found(format!("there is no bulk operation {id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_body_needs_a_reason_and_a_narrowing_filter_of_the_lists_parameters() {
        let start = parse_start(
            br#"{"reason": " partner back ", "filter": {"group_id": 17, "queue": "jobs"}, "dry_run": true}"#,
        )
        .unwrap();
        assert_eq!(start.reason, "partner back");
        assert!(start.dry_run);
        assert_eq!(start.selection.queue.as_deref(), Some("jobs"));
        assert_eq!(start.selection.group_id.map(|g| g.0), Some(17));
        for (body, status) in [
            (&br#"{"filter": {"queue": "q"}}"#[..], 422),
            (br#"{"reason": "x"}"#, 422),
            (br#"{"reason": "x", "filter": {}}"#, 422),
            (br#"{"reason": "x", "filter": {"status": "replayed"}}"#, 422),
            (br#"{"reason": "x", "filter": {"limit": "5"}}"#, 422),
            (br#"{"reason": "x", "filter": {"queue": ["q"]}}"#, 422),
            (br#"{"reason": "x", "filter": {"nope": "1"}}"#, 422),
            (br#"{"reason": "x", "filter": {"group_id": "-1"}}"#, 422),
            (
                br#"{"reason": "x", "filter": {"queue": "q"}, "extra": 1}"#,
                422,
            ),
            (
                br#"{"reason": "x", "filter": {"queue": "q"}, "dry_run": "yes"}"#,
                422,
            ),
            (br#"{"reason": " ", "filter": {"queue": "q"}}"#, 422),
            (
                br#"{"reason": "x", "reason": "y", "filter": {"queue": "q"}}"#,
                422,
            ),
            (
                br#"{"reason": "x", "filter": {"queue": "a", "queue": "b"}}"#,
                422,
            ),
            (b"not json", 400),
            (b"[1]", 422),
        ] {
            let refused = parse_start(body)
                .err()
                .unwrap_or_else(|| panic!("{} was taken", String::from_utf8_lossy(body)));
            assert_eq!(refused.status, status, "{}", String::from_utf8_lossy(body));
        }
    }
}
