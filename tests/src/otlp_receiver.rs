//! A local OTLP/HTTP traces receiver, standing in for the collector beside a function (ADOT's
//! layer): `POST /v1/traces` with an `ExportTraceServiceRequest` in protobuf, decoded with
//! OpenTelemetry's own message types, each span kept with its resource's `service.name`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A span as received: its ids in hex, its attributes as strings.
#[derive(Debug, Clone)]
pub struct Received {
    /// The resource's `service.name`.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Its kind (OTLP's number: 1 internal, 3 client, 5 consumer).
    pub kind: i32,
    /// Trace id, 32 hex digits.
    pub trace_id: String,
    /// Span id, 16 hex digits.
    pub span_id: String,
    /// The parent's span id (empty: a root).
    pub parent_span_id: String,
    /// Start and end, Unix nanoseconds.
    pub start: u64,
    /// End.
    pub end: u64,
    /// Attributes, each value as a string.
    pub attributes: BTreeMap<String, String>,
    /// Links: (trace id, span id) in hex.
    pub links: Vec<(String, String)>,
    /// Status code (0 unset, 1 ok, 2 error).
    pub status: i32,
}

impl Received {
    /// An attribute's value.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The running receiver; stops when dropped.
pub struct OtlpReceiver {
    /// Its base URL, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<Mutex<u32>>,
    task: JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let requests: Arc<Mutex<u32>> = Arc::default();
        let (kept, counted) = (spans.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (kept, counted) = (kept.clone(), counted.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        answer(kept.clone(), counted.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            url,
            spans,
            requests,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// How many export requests came.
    pub fn requests(&self) -> u32 {
        *self.requests.lock().unwrap()
    }
}

async fn answer(
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<Mutex<u32>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let refused = |status: u16| {
        Ok(Response::builder()
            .status(status)
            .body(Full::new(Bytes::new()))
            .unwrap())
    };
    if path != "/v1/traces" || content_type != "application/x-protobuf" {
        return refused(404);
    }
    let Ok(Ok(request)) = body.map(ExportTraceServiceRequest::decode) else {
        return refused(400);
    };
    *requests.lock().unwrap() += 1;
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| text(a.value.as_ref()))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            received.extend(scope.spans.into_iter().map(|s| span(&service, s)));
        }
    }
    spans.lock().unwrap().extend(received);
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(
            ExportTraceServiceResponse::default().encode_to_vec(),
        )))
        .unwrap())
}

fn span(service: &str, s: Span) -> Received {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    Received {
        service: service.to_owned(),
        name: s.name,
        kind: s.kind,
        trace_id: hex(&s.trace_id),
        span_id: hex(&s.span_id),
        parent_span_id: hex(&s.parent_span_id),
        start: s.start_time_unix_nano,
        end: s.end_time_unix_nano,
        attributes: attributes(&s.attributes),
        links: s
            .links
            .iter()
            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
            .collect(),
        status: s.status.map(|st| st.code).unwrap_or_default(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
