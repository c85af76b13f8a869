//! API Gateway (HTTP API, payload format 2.0) to [`Api`] and back, through `lambda_http`.
//!
//! The caller comes only from `requestContext.authorizer.jwt`, which the gateway fills after
//! verifying the token; headers are never trusted for identity.

use super::{Api, ApiRequest, ApiResponse, Caller};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Error, Request, RequestExt, Response, service_fn};

/// The transport-independent view of a Lambda HTTP request.
pub fn api_request(request: &Request) -> ApiRequest {
    let caller = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context
            .authorizer
            .as_ref()
            .and_then(|authorizer| authorizer.jwt.as_ref())
            .map(|jwt| {
                Caller::from_claims(
                    jwt.claims.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                    jwt.scopes.as_deref(),
                )
            }),
        _ => None,
    };
    let query = request
        .query_string_parameters_ref()
        .map(|q| {
            q.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    ApiRequest {
        method: request.method().as_str().to_owned(),
        path: request.uri().path().to_owned(),
        query,
        body: request.body().as_ref().to_vec(),
        caller,
    }
}

/// The Lambda HTTP response for `response`.
pub fn lambda_response(response: ApiResponse) -> Response<Body> {
    Response::builder()
        .status(response.status)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .body(Body::Text(response.body.to_string()))
        .expect("a status from ApiError or 200 and static headers are valid")
}

/// Serves `api` on `database` until the runtime stops. Each request first checks the database
/// (its credentials read again if it rejects them); a database that is not ready is a 503.
pub async fn serve(api: Api, database: shared::db::Database) -> Result<(), Error> {
    let (api, database) = (&api, &database);
    lambda_http::run(service_fn(move |request: Request| async move {
        let response = match database.ready().await {
            Ok(()) => api.handle(&api_request(&request)).await,
            Err(e) => {
                tracing::error!(error = %e, "the database is not ready");
                super::ApiError::unavailable(
                    "database_unavailable",
                    "the database is unavailable; nothing was changed, retry later",
                )
                .into()
            }
        };
        Ok::<_, Error>(lambda_response(response))
    }))
    .await
}
