//! A local API Gateway (HTTP API, payload format 2.0) in front of the real dead-letter API
//! functions, so curl and `dlq` work against the local stack over HTTP.
//!
//! It does what the deployed gateway does and nothing more: it matches the route (404 for none),
//! checks the bearer token as its JWT authorizer would, with development tokens instead of JWTs
//! (401 without a known token, 403 without the route's scope, in API Gateway's own
//! `{"message": …}` shape), builds the API Gateway event with the token's claims, invokes the
//! function that serves the route, and returns its response.

use crate::lambda_host::body_bytes;
use crate::stack::ApiFunctions;
use bytes::Bytes;
use dead_letter_api::api::{ApiRequest, Caller, Scope};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A development token: who it signs in as and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevToken {
    /// The bearer token.
    pub token: String,
    /// Its `sub` claim (recorded as the reviewer).
    pub subject: String,
    /// Its scopes.
    pub scopes: Vec<Scope>,
}

impl DevToken {
    /// A fresh random token for `subject` with `scopes`.
    pub fn new(subject: &str, scopes: &[Scope]) -> Self {
        Self {
            token: format!("dev-{}", uuid::Uuid::new_v4().simple()),
            subject: subject.to_owned(),
            scopes: scopes.to_vec(),
        }
    }

    /// The local stack's two: an operator with every scope, and a reader.
    pub fn local_pair() -> (Self, Self) {
        (
            Self::new(
                "dev-operator",
                &[Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit],
            ),
            Self::new("dev-reader", &[Scope::Read]),
        )
    }
}

/// A running gateway; stops when dropped.
pub struct Gateway {
    /// Its base URL (`http://127.0.0.1:<port>`).
    pub url: String,
    task: JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    /// Serves `api` on `addr` (port 0: a free one) for holders of `tokens`.
    pub async fn start(
        api: Arc<ApiFunctions>,
        tokens: &[DevToken],
        addr: SocketAddr,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let tokens: Arc<HashMap<String, Caller>> = Arc::new(
            tokens
                .iter()
                .map(|t| {
                    let caller = Caller {
                        subject: Some(t.subject.clone()),
                        scopes: t.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
                    };
                    (t.token.clone(), caller)
                })
                .collect(),
        );
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (api, tokens) = (api.clone(), tokens.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        answer(api.clone(), tokens.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, task })
    }
}

async fn answer(
    api: Arc<ApiFunctions>,
    tokens: Arc<HashMap<String, Caller>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let bearer = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let Some(route) = dead_letter_api::api::route_for(&method, &path) else {
        return Ok(gateway_error(StatusCode::NOT_FOUND, "Not Found"));
    };
    let Some(caller) = bearer.and_then(|t| tokens.get(&t).cloned()) else {
        return Ok(gateway_error(StatusCode::UNAUTHORIZED, "Unauthorized"));
    };
    if !caller.scopes.iter().any(|s| s == route.scope.as_str()) {
        return Ok(gateway_error(StatusCode::FORBIDDEN, "Forbidden"));
    }
    let request = ApiRequest {
        method,
        path,
        query,
        body: body_bytes(req).await.to_vec(),
        caller: Some(caller),
    };
    let function = api.serving(&request);
    let event = crate::api_client::api_gateway_event(&request);
    let response = match function.invoke(&event).await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "the API function failed");
            return Ok(gateway_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error",
            ));
        }
    };
    let status = response["statusCode"].as_u64().unwrap_or(502) as u16;
    let body = response["body"].as_str().unwrap_or_default().to_owned();
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response"))
}

/// An answer of the gateway itself, in API Gateway's shape.
fn gateway_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::json!({ "message": message }).to_string(),
        )))
        .expect("a valid response")
}
