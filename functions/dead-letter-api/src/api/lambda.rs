//! API Gateway (HTTP API, payload format 2.0) to [`Api`] and back.
//!
//! The event is read here, field by field from its JSON, rather than through `lambda_http`'s
//! request conversion: that one panics (API Gateway answers 500) on a raw query string or path
//! that an `http::Uri` cannot hold (a quote, a space, more than 64 KiB, a host header it cannot
//! parse), and decodes the query lossily (bytes that are not UTF-8 become U+FFFD). Here the raw
//! query string is percent-decoded strictly, and whatever an event holds becomes a request or
//! a 4xx naming what is wrong, never a failed invocation.
//!
//! The caller comes only from `requestContext.authorizer.jwt`, which the gateway fills after
//! verifying the token; headers are never trusted for identity.

use super::list_query::shown;
use super::{Api, ApiError, ApiRequest, ApiResponse, Caller};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_http::Error;
use lambda_http::lambda_runtime::{self, LambdaEvent, service_fn};
use serde_json::{Value, json};

/// The transport-independent view of an API Gateway event, and what, if anything, makes it
/// unreadable (a query string that is not UTF-8 once decoded, a body that is not the base64 it
/// claims): [`Api::handle_unless`] routes and authorizes the request, then refuses it with that.
pub fn api_request(event: &Value) -> (ApiRequest, Option<ApiError>) {
    let text = |pointer: &str| event.pointer(pointer).and_then(Value::as_str);
    let (query, bad_query) = query_of(event);
    let (body, bad_body) = body_of(event);
    let request = ApiRequest {
        method: text("/requestContext/http/method")
            .unwrap_or_default()
            .to_owned(),
        path: text("/rawPath")
            .or_else(|| text("/requestContext/http/path"))
            .unwrap_or_default()
            .to_owned(),
        query,
        body,
        caller: event.pointer("/requestContext/authorizer/jwt").map(caller),
    };
    (request, bad_query.or(bad_body))
}

/// The query pairs: from the raw query string (strictly decoded), else the gateway's map.
fn query_of(event: &Value) -> (Vec<(String, String)>, Option<ApiError>) {
    match (
        event.get("rawQueryString"),
        event.get("queryStringParameters"),
    ) {
        (Some(Value::String(raw)), _) => match parse_query_string(raw) {
            Ok(pairs) => (pairs, None),
            Err(e) => (Vec::new(), Some(e)),
        },
        (_, Some(Value::Object(pairs))) => {
            let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (
                pairs.iter().map(|(k, v)| (k.clone(), text(v))).collect(),
                None,
            )
        }
        _ => (Vec::new(), None),
    }
}

/// The body's bytes, base64-decoded if the event says it is base64.
fn body_of(event: &Value) -> (Vec<u8>, Option<ApiError>) {
    let body = event
        .get("body")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if event.get("isBase64Encoded") != Some(&Value::Bool(true)) {
        return (body.as_bytes().to_vec(), None);
    }
    match STANDARD.decode(body) {
        Ok(bytes) => (bytes, None),
        Err(_) => {
            let why = "the body is marked isBase64Encoded but is not base64";
            (Vec::new(), Some(ApiError::invalid_json(why)))
        }
    }
}

/// The caller the JWT authorizer verified: its claims (strings, as API Gateway passes them)
/// and its `scopes` list, if any.
fn caller(jwt: &Value) -> Caller {
    let claims: Vec<(&str, String)> = jwt
        .get("claims")
        .and_then(Value::as_object)
        .map(|claims| {
            claims
                .iter()
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.as_str(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    let scopes: Option<Vec<String>> = jwt.get("scopes").and_then(Value::as_array).map(|s| {
        s.iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    });
    Caller::from_claims(
        claims.iter().map(|(k, v)| (*k, v.as_str())),
        scopes.as_deref(),
    )
}

/// A raw query string's pairs, in order, as `application/x-www-form-urlencoded` reads them
/// (`+` is a space, `%XX` a byte, a `%` not followed by two hex digits itself), except that a
/// name or value that is not UTF-8 once decoded is refused, naming it, instead of being changed.
pub fn parse_query_string(raw: &str) -> Result<Vec<(String, String)>, ApiError> {
    let mut pairs = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = String::from_utf8(percent_decode(name)).map_err(|_| {
            ApiError::invalid_parameter(
                "a query parameter name is not UTF-8 once percent-decoded; encode names and \
                 values as UTF-8",
            )
        })?;
        let value = String::from_utf8(percent_decode(value)).map_err(|_| {
            let named = if !name.is_empty()
                && name.len() <= 40
                && name.chars().all(|c| c.is_ascii_graphic())
            {
                format!("`{name}`")
            } else {
                format!("the query parameter {}", shown(&name))
            };
            ApiError::invalid_parameter(format!(
                "{named} is not UTF-8 once percent-decoded; encode values as UTF-8"
            ))
        })?;
        pairs.push((name, value));
    }
    Ok(pairs)
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The API Gateway response for `response`.
pub fn lambda_response(response: ApiResponse) -> Value {
    json!({
        "statusCode": response.status,
        "headers": {"content-type": "application/json", "cache-control": "no-store"},
        "body": response.body.to_string(),
        "isBase64Encoded": false,
    })
}

/// Serves `api` on `database` until the runtime stops. Each request first checks the database
/// (its credentials read again if it rejects them); a database that is not ready is a 503.
pub async fn serve(api: Api, database: shared::db::Database) -> Result<(), Error> {
    let (api, database) = (&api, &database);
    shared::telemetry::otel::serve(
        lambda_runtime::layers::OpenTelemetryFaasTrigger::Http,
        service_fn(move |event: LambdaEvent<Value>| async move {
            let response = match database.ready().await {
                Ok(()) => {
                    let (request, problem) = api_request(&event.payload);
                    api.handle_unless(&request, problem).await
                }
                Err(e) => {
                    tracing::error!(error = %e, "the database is not ready");
                    ApiError::unavailable(
                        "database_unavailable",
                        "the database is unavailable; nothing was changed, retry later",
                    )
                    .into()
                }
            };
            Ok::<_, Error>(lambda_response(response))
        }),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_query_string_is_decoded_strictly() {
        let pairs = parse_query_string("a=1&b=x+y%20z&&c&d=%41%zz%4&e=%C3%A9&a=2").unwrap();
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("a", "1"),
                ("b", "x y z"),
                ("c", ""),
                ("d", "A%zz%4"),
                ("e", "é"),
                ("a", "2")
            ]
        );
        for (raw, needle) in [
            ("queue=%FF", "`queue`"),
            ("correlation_id=%C3%28", "`correlation_id`"),
            ("%FF=1", "name"),
            ("%00%FF=%FF", "query parameter"),
        ] {
            let err = parse_query_string(raw).unwrap_err();
            assert_eq!(err.status, 400, "{raw}");
            assert!(err.message.contains(needle), "{raw}: {}", err.message);
        }
    }

    #[test]
    fn any_event_is_a_request_or_a_problem_never_a_panic() {
        for event in [
            json!({}),
            json!(null),
            json!({"rawQueryString": 7, "body": [], "requestContext": "x"}),
            json!({"rawQueryString": "a=%FF", "isBase64Encoded": true, "body": "@@"}),
            json!({"queryStringParameters": {"limit": 5}, "requestContext": {"authorizer": {"jwt": {"claims": {"sub": 1}, "scopes": "x"}}}}),
        ] {
            let _ = api_request(&event);
        }
        let (request, problem) = api_request(&json!({
            "rawPath": "/v1/core/dead-letters", "rawQueryString": "limit=5",
            "isBase64Encoded": true, "body": "eyJyZWFzb24iOiAieCJ9",
            "requestContext": {"http": {"method": "POST"}, "authorizer": {"jwt": {
                "claims": {"sub": "ops-1", "scope": "core.dead_letters.read"}, "scopes": null}}}
        }));
        assert!(problem.is_none());
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("POST", "/v1/core/dead-letters")
        );
        assert_eq!(request.query, [("limit".to_owned(), "5".to_owned())]);
        assert_eq!(request.body, br#"{"reason": "x"}"#);
        let caller = request.caller.unwrap();
        assert_eq!(caller.subject.as_deref(), Some("ops-1"));
        assert_eq!(caller.scopes, ["core.dead_letters.read"]);
    }
}
