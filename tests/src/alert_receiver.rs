//! A local HTTP server standing in for BetterStack's Uptime API: it records every request and
//! answers as BetterStack does (an incident created with its id, a comment added, an incident
//! resolved, an incident read with its state), or with the statuses it was told to answer first.
//! An incident can be resolved by hand, as a person does in BetterStack's UI.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    /// `POST /api/v3/incidents` and the like.
    pub method: String,
    /// The path.
    pub path: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The JSON body.
    pub body: Value,
    /// The status it was answered with.
    pub status: u16,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    refuse: VecDeque<u16>,
    latency: std::time::Duration,
    token: Option<String>,
    /// Incidents created, those resolved through the API, and those resolved by hand.
    created: std::collections::HashSet<String>,
    resolved: std::collections::HashSet<String>,
    by_hand: std::collections::HashSet<String>,
}

/// The running receiver; stops when dropped.
pub struct AlertReceiver {
    /// Its base URL, for `BETTERSTACK_BASE_URL`.
    pub url: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for AlertReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AlertReceiver {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { url, state, task }
    }

    /// Answers the next requests with these statuses (then `201` again).
    pub fn refuse_next(&self, statuses: &[u16]) {
        self.state.lock().unwrap().refuse.extend(statuses);
    }

    /// Answers every request after `latency`, as a remote API does.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.state.lock().unwrap().latency = latency;
    }

    /// Answers 401 to any request without `Authorization: Bearer <token>`, as BetterStack does
    /// once a token is revoked.
    pub fn require_token(&self, token: &str) {
        self.state.lock().unwrap().token = Some(format!("Bearer {token}"));
    }

    /// Stops refusing: every request from now on creates an incident.
    pub fn accept_all(&self) {
        self.state.lock().unwrap().refuse.clear();
    }

    /// Resolves incident `id` as a person does in BetterStack: a later read of it says so, and
    /// resolving it through the API answers 409.
    pub fn resolve_by_hand(&self, id: &str) {
        self.state.lock().unwrap().by_hand.insert(id.to_owned());
    }

    /// The reads of an incident (`GET /api/v3/incidents/{id}`, answered).
    pub fn reads(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| {
                r.method == "GET" && r.status < 300 && r.path.starts_with("/api/v3/incidents/")
            })
            .collect()
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// The requests that created an incident (answered `201`).
    pub fn incidents(&self) -> Vec<Received> {
        self.answered(|path| path == "/api/v3/incidents")
    }

    /// The comments added to incidents (`/api/v2/incidents/{id}/comments`, answered).
    pub fn comments(&self) -> Vec<Received> {
        self.answered(|path| path.ends_with("/comments"))
    }

    /// The incidents resolved (`/api/v3/incidents/{id}/resolve`, answered), by path.
    pub fn resolutions(&self) -> Vec<Received> {
        self.answered(|path| path.ends_with("/resolve"))
    }

    fn answered(&self, path: impl Fn(&str) -> bool) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.status < 300 && path(&r.path))
            .collect()
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = crate::lambda_host::body_bytes(req).await;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let latency = state.lock().unwrap().latency;
    tokio::time::sleep(latency).await;
    let mut state = state.lock().unwrap();
    let unauthorized = state
        .token
        .as_ref()
        .is_some_and(|t| authorization.as_ref() != Some(t));
    let refused = if unauthorized {
        Some(401)
    } else {
        state.refuse.pop_front()
    };
    let incident = path
        .strip_prefix("/api/v3/incidents/")
        .map(|rest| rest.trim_end_matches("/resolve").to_owned());
    let read = method == "GET" && incident.is_some();
    let refused = refused.or_else(|| match &incident {
        Some(id) if read && !state.created.contains(id) => Some(404),
        Some(id) if path.ends_with("/resolve") && state.by_hand.contains(id) => Some(409),
        _ => None,
    });
    let ok = if path.ends_with("/resolve") || read {
        200
    } else {
        201
    };
    let id = state.received.len() + 1;
    state.received.push(Received {
        method,
        path: path.clone(),
        authorization,
        body,
        status: refused.unwrap_or(ok),
    });
    let kind = if path.ends_with("/comments") {
        "incident_comment"
    } else {
        "incident"
    };
    let data = match (&incident, refused) {
        (Some(id), None) => {
            if path.ends_with("/resolve") {
                state.resolved.insert(id.clone());
            }
            let resolved = state.resolved.contains(id) || state.by_hand.contains(id);
            json!({"id": id, "type": "incident", "attributes": {
                "status": if resolved { "Resolved" } else { "Started" },
                "resolved_at": resolved.then_some("2026-11-30T12:00:00.000Z"),
                "resolved_by": resolved.then_some("someone@example.com"),
            }})
        }
        _ => {
            if refused.is_none() && path == "/api/v3/incidents" {
                state.created.insert(id.to_string());
            }
            json!({"id": id.to_string(), "type": kind})
        }
    };
    let response = match refused {
        Some(code) => Response::builder()
            .status(code)
            .body(Full::new(Bytes::from_static(b"{\"errors\":\"try later\"}"))),
        None => Response::builder()
            .status(ok)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json!({"data": data}).to_string()))),
    };
    Ok(response.expect("response"))
}
