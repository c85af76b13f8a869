//! Optional traces on OpenTelemetry: `tracing` spans exported by `tracing-opentelemetry` over
//! OTLP/HTTP (protobuf) to the collector beside the function (ADOT's Lambda layer, which sends
//! them on to X-Ray; see `docs/deploy.md`). Off by default; the template's `Tracing` parameter
//! turns it on for a stack (`TRACING=Active`, the collector layer, its endpoint).
//!
//! Invariant: tracing observes and never decides. Spans are exported after each invocation by
//! the runtime's own [`OpenTelemetryLayer`] (see [`serve`]), on the batch processor's thread; an
//! export that fails is dropped, never retried into the next job. A span is exported only once
//! it has ended, so a process killed mid-job exports nothing of that job. The ids and times in a
//! span are OpenTelemetry's (random, wall clock), never inputs to a job.
//!
//! What is exported, without a line in any consumer:
//!
//! - the runtime's invocation span (`faas.*`), a child of the trace Lambda gives the invocation
//!   (its X-Ray header) where there is one and it is sampled;
//! - each record's `job` span ([`super::record_span`]), kind consumer, with OpenTelemetry's
//!   messaging attributes, our ids, its outcome and attempt, and a link to the trace its message
//!   carries ([`MessageTrace`]): the producer's request, or for a replay the original job's;
//! - a batch's commit group span, whose jobs committed together ([`group_member`]);
//! - each statement sqlx runs (its `sqlx::query` event) as a client span of the job or group it
//!   ran for, with its SQL (never its bound values, its literals hidden).

use crate::config::{ConfigError, Env};
use lambda_runtime::layers::{OpenTelemetryFaasTrigger, OpenTelemetryLayer, TracingLayer};
use lambda_runtime::tower::{Layer as TowerLayer, Service};
use lambda_runtime::{Diagnostic, LambdaEvent, LambdaInvocation, Runtime};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context as OtelContext, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use serde_json::{Map, Value};
use std::fmt::Debug;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// `TRACING`: `Active` to export spans, `Disabled` (or unset) for none.
pub const TRACING: &str = "TRACING";
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: where spans go, the whole URL (OTLP's own variable).
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL; spans go to its `/v1/traces`.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Where ADOT's collector layer (and any OTLP collector) listens for OTLP/HTTP by default.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// The message attribute a W3C trace context travels in (`traceparent`, as OpenTelemetry's
/// SQS instrumentations write it); a replay carries its letter's original one here.
pub const TRACEPARENT_ATTRIBUTE: &str = "traceparent";
/// The SQS system attribute X-Ray's trace header travels in.
pub const AWS_TRACE_HEADER: &str = "AWSTraceHeader";

/// The target of the runtime's invocation span (`lambda_runtime::layers::OpenTelemetryLayer`).
const INVOCATION_TARGET: &str = "lambda_runtime::layers::otel";
/// The longest SQL text a statement's span carries.
const MAX_SQL_CHARS: usize = 2_000;
/// The longest trace header read from a message: longer is not a trace header.
const MAX_HEADER_BYTES: usize = 256;
/// How long an export may take before it is dropped: an invocation waits for it.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a function exports spans, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracing {
    /// No spans (the default).
    Disabled,
    /// Spans to this OTLP/HTTP traces URL.
    Active(String),
}

impl Tracing {
    /// Reads [`TRACING`] and the endpoint (OTLP's variables, as the exporter would, else
    /// [`DEFAULT_ENDPOINT`]); a value that is neither `Active` nor `Disabled`, or an endpoint
    /// that is not an http(s) URL, is an error naming its variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        match env.get(TRACING) {
            None => return Ok(Self::Disabled),
            Some(v) if v.trim().eq_ignore_ascii_case("disabled") => return Ok(Self::Disabled),
            Some(v) if v.trim().eq_ignore_ascii_case("active") => {}
            Some(v) => {
                return Err(ConfigError {
                    variable: TRACING,
                    problem: format!("{v:?} is not a tracing mode: Active or Disabled"),
                });
            }
        }
        let (variable, url) = match (
            env.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
            env.get(OTEL_EXPORTER_OTLP_ENDPOINT),
        ) {
            (Some(url), _) => (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, url.trim().to_owned()),
            (None, base) => (
                OTEL_EXPORTER_OTLP_ENDPOINT,
                format!(
                    "{}/v1/traces",
                    base.as_deref()
                        .unwrap_or(DEFAULT_ENDPOINT)
                        .trim()
                        .trim_end_matches('/')
                ),
            ),
        };
        match reqwest::Url::parse(&url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {
                Ok(Self::Active(url))
            }
            _ => Err(ConfigError {
                variable,
                problem: format!("{url:?} is not an http(s) URL of an OTLP collector"),
            }),
        }
    }
}

/// The provider whose spans [`flush`] exports; set once, by [`tracer`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The tracer exporting to `endpoint`, installed for [`flush`]; `None` (and a line saying why)
/// if the exporter cannot be built, so a function never fails to start over its tracing.
pub fn tracer(endpoint: &str) -> Option<SdkTracer> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        // One attempt: a retry would get a timeout of its own, and the invocation waits for it.
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
        .build();
    let exporter = match exporter {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("tracing is off: the OTLP exporter could not be built: {e}");
            return None;
        }
    };
    // Exported when an invocation ends (or when a batch is full): never on a timer in the
    // middle of a job, and never a span that has not ended.
    let config = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_secs(3_600))
        .with_max_queue_size(16_384)
        .with_max_export_batch_size(2_048)
        .build();
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "jobs".into());
    let mut attributes = vec![
        KeyValue::new("cloud.provider", "aws"),
        KeyValue::new("cloud.platform", "aws_lambda"),
        KeyValue::new("faas.name", function.clone()),
    ];
    if let Ok(region) = std::env::var("AWS_REGION") {
        attributes.push(KeyValue::new("cloud.region", region));
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(exporter)
                .with_batch_config(config)
                .build(),
        )
        // Lambda's sampling decision (its trace header) where there is one; else every trace.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_resource(
            Resource::builder()
                .with_service_name(function)
                .with_attributes(attributes)
                .build(),
        )
        .build();
    let tracer = provider.tracer("jobs-harness");
    PROVIDER.set(provider).ok()?;
    Some(tracer)
}

/// Exports every span that has ended and waits for the collector's answer (or the export's
/// timeout). A no-op where tracing is off.
pub fn flush() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.force_flush()
    {
        tracing::debug!(error = %e, "spans not exported");
    }
}

/// Whether a span is one we export: an invocation, a record's `job` span or a commit group.
fn exported_span(meta: &Metadata<'_>) -> bool {
    meta.is_span()
        && (meta.target() == super::RECORD_SPAN_TARGET || meta.target() == INVOCATION_TARGET)
}

/// The layers that export spans with `tracer`: `tracing-opentelemetry`'s over the spans we
/// export (no events: a log line is not a span event), and [`StatementSpans`].
pub fn layers<S>(tracer: SdkTracer) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer.clone())
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_filter(filter_fn(exported_span));
    // Not `is_event`: sqlx asks `enabled!` first, a callsite of its own kind (a hint).
    let statements = StatementSpans {
        tracer,
        dispatch: OnceLock::new(),
    }
    .with_filter(filter_fn(|meta| {
        exported_span(meta) || (!meta.is_span() && meta.target() == "sqlx::query")
    }));
    spans.and_then(statements)
}

/// Runs `handler` as the Lambda runtime does ([`lambda_runtime::run`]), and where tracing is on
/// under the runtime's [`OpenTelemetryLayer`], which opens the invocation's span and calls
/// [`flush`] when the invocation ends, after its response and before the runtime asks for the
/// next one (the test `spans_are_exported_before_the_next_invocation` holds it to that).
pub async fn serve<A, F, R>(
    trigger: OpenTelemetryFaasTrigger,
    handler: F,
) -> Result<(), lambda_runtime::Error>
where
    F: Service<LambdaEvent<A>, Response = R>,
    F::Future: Future<Output = Result<R, F::Error>>,
    F::Error: Into<Diagnostic> + Debug,
    A: for<'de> serde::Deserialize<'de>,
    R: serde::Serialize,
{
    let runtime = Runtime::new(handler).layer(TracingLayer::new());
    if PROVIDER.get().is_none() {
        return runtime.run().await;
    }
    runtime
        .layer(OpenTelemetryLayer::new(flush).with_trigger(trigger))
        .layer(LambdaParent)
        .run()
        .await
}

/// Makes the trace Lambda gives an invocation (`Lambda-Runtime-Trace-Id`, X-Ray's header) the
/// parent of its invocation span, as the OpenTelemetry context current while the span opens.
#[derive(Clone, Copy)]
struct LambdaParent;

impl<S> TowerLayer<S> for LambdaParent {
    type Service = LambdaParentService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LambdaParentService(inner)
    }
}

/// [`LambdaParent`]'s service.
struct LambdaParentService<S>(S);

impl<S: Service<LambdaInvocation>> Service<LambdaInvocation> for LambdaParentService<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: LambdaInvocation) -> S::Future {
        let parent = req
            .context
            .xray_trace_id
            .as_deref()
            .and_then(TraceParent::from_xray);
        let _current = parent.map(|p| {
            OtelContext::new()
                .with_remote_span_context(p.span_context())
                .attach()
        });
        self.0.call(req)
    }
}

/// A trace context a message carried: the producer's span, as W3C's `traceparent` or X-Ray's
/// header spell it. Read from what a producer sent, so bounded and checked: anything else is no
/// trace context, never an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span in it.
    pub span_id: [u8; 8],
    /// Whether its producer sampled it.
    pub sampled: bool,
}

impl TraceParent {
    /// A W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
    pub fn from_w3c(value: &str) -> Option<Self> {
        // As W3C reads it: lowercase hex, nothing around it.
        if value.len() > MAX_HEADER_BYTES || value.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut parts = value.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four parts; a later version may add some, never change these.
        if version.len() != 2
            || version.eq_ignore_ascii_case("ff")
            || (version == "00" && parts.next().is_some())
        {
            return None;
        }
        hex::<1>(version)?;
        let flags = hex::<1>(flags)?;
        Self::new(hex(trace)?, hex(span)?, flags[0] & 1 == 1)
    }

    /// X-Ray's header (`Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=1`, in any order).
    pub fn from_xray(value: &str) -> Option<Self> {
        if value.len() > MAX_HEADER_BYTES {
            return None;
        }
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for part in value.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", v)) => root = Some(v),
                Some(("Parent", v)) => parent = Some(v),
                Some(("Sampled", v)) => sampled = v == "1",
                _ => {}
            }
        }
        let trace = match root?.split('-').collect::<Vec<_>>()[..] {
            ["1", time, id] if time.len() == 8 && id.len() == 24 => {
                hex::<16>(&format!("{time}{id}"))?
            }
            _ => return None,
        };
        Self::new(trace, hex(parent?)?, sampled)
    }

    fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            sampled,
        })
    }

    /// As W3C spells it: what a letter keeps, and a replay sends in [`TRACEPARENT_ATTRIBUTE`].
    pub fn to_w3c(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            u8::from(self.sampled)
        )
    }

    fn span_context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            if self.sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            },
            true,
            TraceState::default(),
        )
    }
}

/// `N` bytes from exactly `2 N` hex digits.
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The trace contexts a message carried: X-Ray's (SQS's `AWSTraceHeader` system attribute, set
/// when a traced producer sent it) and W3C's (a `traceparent` message attribute). A job's span
/// links to each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageTrace {
    /// From `AWSTraceHeader`.
    pub aws: Option<TraceParent>,
    /// From the `traceparent` message attribute.
    pub w3c: Option<TraceParent>,
}

impl MessageTrace {
    /// The one a letter keeps, so its replay goes on linking the original job's trace: the
    /// W3C one (a replay's is the original's), else X-Ray's.
    pub fn original(&self) -> Option<TraceParent> {
        self.w3c.or(self.aws)
    }

    fn links(&self) -> Vec<Link> {
        let mut links: Vec<Link> = Vec::new();
        for (parent, source) in [(self.w3c, "traceparent"), (self.aws, AWS_TRACE_HEADER)] {
            let Some(parent) = parent else { continue };
            if links
                .iter()
                .any(|l| l.span_context.span_id() == SpanId::from_bytes(parent.span_id))
            {
                continue;
            }
            links.push(Link::new(
                parent.span_context(),
                vec![KeyValue::new("link.source", source)],
                0,
            ));
        }
        links
    }
}

/// What a job's span says of its message, on top of the ids its [`super::record_span`] carries.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The queue's name.
    pub queue: &'a str,
    /// The SQS message id.
    pub message_id: &'a str,
    /// The trace contexts it carried.
    pub trace: &'a MessageTrace,
}

impl Delivery<'_> {
    fn attributes(&self) -> [KeyValue; 6] {
        [
            KeyValue::new("messaging.system", "aws_sqs"),
            KeyValue::new("messaging.operation", "process"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", self.queue.to_owned()),
            KeyValue::new("messaging.message.id", self.message_id.to_owned()),
        ]
    }
}

/// Gives a record's `job` span its messaging attributes, kind and name, and its links. Nothing
/// where tracing is off.
pub fn describe_job(span: &tracing::Span, delivery: Delivery<'_>) {
    if PROVIDER.get().is_none() {
        return;
    }
    for attribute in delivery.attributes() {
        span.set_attribute(attribute.key, attribute.value);
    }
    span.record("otel.kind", "consumer");
    for link in delivery.trace.links() {
        span.add_link_with_attributes(link.span_context, link.attributes);
    }
}

/// Says on a record's `job` span how it ended: its outcome (also a field its lines show) and,
/// for a failure that is not retried, an error status.
pub fn conclude_job(span: &tracing::Span, outcome: &'static str, failed: bool) {
    span.record("outcome", outcome);
    if failed && PROVIDER.get().is_some() {
        span.set_status(Status::error(outcome));
    }
}

/// The span of a job that committed in a commit group (batch mode): it did nothing alone, so it
/// is not a `tracing` span; it runs from `started` to now under `group` (the group's span, whose
/// statements are the job's), with what a `job` span says. Nothing where tracing is off.
pub fn group_member(
    group: &tracing::Span,
    started: SystemTime,
    delivery: Delivery<'_>,
    ids: &[(&'static str, String)],
) {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    let tracer = provider.tracer("jobs-harness");
    let parent = group.context();
    let mut attributes: Vec<KeyValue> = delivery.attributes().into();
    attributes.extend(ids.iter().map(|(k, v)| KeyValue::new(*k, v.clone())));
    attributes.push(KeyValue::new("outcome", "processed"));
    let mut span = tracer
        .span_builder("job")
        .with_kind(SpanKind::Consumer)
        .with_start_time(started)
        .with_attributes(attributes)
        .with_links(delivery.trace.links())
        .start_with_context(&tracer, &parent);
    opentelemetry::trace::Span::end(&mut span);
}

/// Each `sqlx::query` event as a client span of the exported span it ran in, from its start
/// (now less its elapsed time) to now.
struct StatementSpans {
    tracer: SdkTracer,
    /// The subscriber it is part of, kept when it is registered: inside an event's dispatch the
    /// current default is no subscriber at all under a scoped one.
    dispatch: OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl<S> Layer<S> for StatementSpans
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let Some(parent) = ctx
            .event_scope(event)
            .and_then(|mut scope| scope.find(|s| exported_span(s.metadata())).map(|s| s.id()))
        else {
            return;
        };
        let dispatch = self
            .dispatch
            .get()
            .and_then(tracing::dispatcher::WeakDispatch::upgrade)
            .unwrap_or_else(|| tracing::dispatcher::get_default(Clone::clone));
        let Some(parent) = tracing_opentelemetry::get_otel_context(&parent, &dispatch) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let end = SystemTime::now();
        let elapsed = fields
            .0
            .get("elapsed_secs")
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or_default();
        let sql = [fields.0.get("db.statement"), fields.0.get("summary")]
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(sanitized)
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        let operation = sql
            .split_whitespace()
            .next()
            .unwrap_or("statement")
            .to_ascii_uppercase();
        let mut attributes = vec![
            KeyValue::new("db.system.name", "postgresql"),
            KeyValue::new("db.system", "postgresql"),
            KeyValue::new("db.operation.name", operation.clone()),
            KeyValue::new("db.query.text", sql),
        ];
        for key in ["rows_affected", "rows_returned"] {
            if let Some(n) = fields.0.get(key).and_then(Value::as_i64) {
                attributes.push(KeyValue::new(format!("db.response.{key}"), n));
            }
        }
        let mut span = self
            .tracer
            .span_builder(operation)
            .with_kind(SpanKind::Client)
            .with_start_time(end.checked_sub(elapsed).unwrap_or(end))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut span, end);
    }
}

/// An event's fields as JSON values.
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// `sql` with every string literal (quoted, `E'…'`, dollar-quoted) as `?`, its comments gone and
/// its whitespace collapsed, cut to [`MAX_SQL_CHARS`]: a statement's shape, never the values
/// written into it. An unterminated literal or comment hides the rest.
fn sanitized(sql: &str) -> String {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len().min(MAX_SQL_CHARS));
    let mut i = 0;
    while i < chars.len() && out.chars().count() < MAX_SQL_CHARS {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        i = match c {
            '-' if next == Some('-') => {
                space(&mut out);
                (i..chars.len())
                    .find(|&j| chars[j] == '\n')
                    .unwrap_or(chars.len())
            }
            '/' if next == Some('*') => {
                space(&mut out);
                block_comment_end(&chars, i)
            }
            '\'' => {
                // E'…' takes backslash escapes; an identifier ending in e (`type'…'`) does not.
                let escapes = out.ends_with(['E', 'e'])
                    && !out[..out.len() - 1].ends_with(|p: char| p.is_alphanumeric() || p == '_');
                if escapes {
                    out.pop();
                }
                out.push('?');
                quoted_end(&chars, i, escapes)
            }
            '"' => {
                // A quoted identifier, kept whole: an apostrophe in it is no literal.
                let end = (i + 1..chars.len())
                    .find(|&j| chars[j] == '"')
                    .map_or(chars.len(), |j| j + 1);
                out.extend(&chars[i..end]);
                end
            }
            '$' if !out.ends_with(|p: char| p.is_alphanumeric() || p == '_' || p == '$') => {
                match dollar_quote_end(&chars, i) {
                    Some(end) => {
                        out.push('?');
                        end
                    }
                    None => {
                        out.push(c);
                        i + 1
                    }
                }
            }
            c if c.is_whitespace() => {
                space(&mut out);
                i + 1
            }
            _ => {
                out.push(c);
                i + 1
            }
        };
    }
    out.trim_end().to_owned()
}

/// One space, unless `out` is empty or already ends with one.
fn space(out: &mut String) {
    if !out.ends_with(' ') && !out.is_empty() {
        out.push(' ');
    }
}

/// Where the (nested) block comment opening at `at` ends.
fn block_comment_end(chars: &[char], at: usize) -> usize {
    let (mut i, mut depth) = (at, 0);
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => depth += 1,
            ('*', Some('/')) => depth -= 1,
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
        if depth == 0 {
            break;
        }
    }
    i.min(chars.len())
}

/// Where the quoted literal opening at `at` ends (`''` inside it is a quote; with `escapes`,
/// a backslash escapes the next character).
fn quoted_end(chars: &[char], at: usize, escapes: bool) -> usize {
    let mut i = at + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if escapes => i += 2,
            '\'' if chars.get(i + 1) == Some(&'\'') => i += 2,
            '\'' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// Where the dollar-quoted literal opening at `at` (`$$` or `$tag$`) ends, if one opens there
/// (`$1` is a parameter, not a quote).
fn dollar_quote_end(chars: &[char], at: usize) -> Option<usize> {
    let close = (at + 1..chars.len())
        .take_while(|&j| chars[j] == '$' || chars[j].is_alphanumeric() || chars[j] == '_')
        .find(|&j| chars[j] == '$')?;
    if chars.get(at + 1).is_some_and(|c| c.is_ascii_digit()) {
        return None;
    }
    let tag = &chars[at..=close];
    let body = close + 1;
    Some(
        (body..chars.len())
            .find(|&j| chars[j..].starts_with(tag))
            .map_or(chars.len(), |j| j + tag.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_keeps_its_shape_and_never_a_literal() {
        assert_eq!(
            sanitized(
                "SELECT core.open_job('d03e9806-2991-4a04-b9ac-50c964bc041b'::uuid,\n  E'award''s \\\\ \\' x'::text, 5); BEGIN"
            ),
            "SELECT core.open_job(?::uuid, ?::text, 5); BEGIN"
        );
        assert_eq!(
            sanitized("INSERT INTO t (a) VALUES ($1)"),
            "INSERT INTO t (a) VALUES ($1)"
        );
        assert_eq!(sanitized("SELECT 'unterminated"), "SELECT ?");
        assert_eq!(
            sanitized(
                "SELECT 1 -- the operator's note\n, 'secret-1' /* it's /* nested */ */ FROM t"
            ),
            "SELECT 1 , ? FROM t"
        );
        assert_eq!(
            sanitized(
                "SELECT $$secret-2$$, $tag$secret-3 $$ inner$tag$, $1, a$b FROM \"it's\" WHERE x = 'y'"
            ),
            "SELECT ?, ?, $1, a$b FROM \"it's\" WHERE x = ?"
        );
        assert_eq!(sanitized("SELECT $$unterminated"), "SELECT ?");
        assert!(sanitized(&"x ".repeat(5_000)).chars().count() <= MAX_SQL_CHARS);
    }

    #[test]
    fn tracing_is_off_unless_active_and_a_bad_value_names_its_variable() {
        let tracing = |pairs: &[(&str, &str)]| Tracing::from_env(&Env::from_pairs(pairs));
        assert_eq!(tracing(&[]), Ok(Tracing::Disabled));
        assert_eq!(tracing(&[(TRACING, "Disabled")]), Ok(Tracing::Disabled));
        assert_eq!(
            tracing(&[(TRACING, "Active")]),
            Ok(Tracing::Active("http://localhost:4318/v1/traces".into()))
        );
        assert_eq!(
            tracing(&[
                (TRACING, "active"),
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://127.0.0.1:9/")
            ]),
            Ok(Tracing::Active("http://127.0.0.1:9/v1/traces".into()))
        );
        assert_eq!(
            tracing(&[
                (TRACING, "Active"),
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://ignored:1"),
                (
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                    "https://collector:4318/custom"
                )
            ]),
            Ok(Tracing::Active("https://collector:4318/custom".into()))
        );
        assert_eq!(tracing(&[(TRACING, "on")]).unwrap_err().variable, TRACING);
        assert_eq!(
            tracing(&[
                (TRACING, "Active"),
                (OTEL_EXPORTER_OTLP_ENDPOINT, "collector")
            ])
            .unwrap_err()
            .variable,
            OTEL_EXPORTER_OTLP_ENDPOINT
        );
        assert_eq!(
            tracing(&[
                (TRACING, "Active"),
                (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "udp://x:1")
            ])
            .unwrap_err()
            .variable,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
        );
    }

    #[test]
    fn a_message_trace_is_read_in_either_spelling_and_anything_else_is_none() {
        let w3c = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let parsed = TraceParent::from_w3c(w3c).unwrap();
        assert!(parsed.sampled);
        assert_eq!(parsed.to_w3c(), w3c);
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let parsed = TraceParent::from_xray(xray).unwrap();
        assert_eq!(
            parsed.to_w3c(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        assert!(
            !TraceParent::from_xray(
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0"
            )
            .unwrap()
            .sampled
        );
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0AF7651916CD43DD8448EB211C80319Z-b7ad6b7169203331-01",
            &"0".repeat(10_000),
        ] {
            assert_eq!(TraceParent::from_w3c(bad), None, "{bad:?}");
        }
        for bad in [
            "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793",
        ] {
            assert_eq!(TraceParent::from_xray(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_job_links_each_trace_it_carried_once() {
        let a = TraceParent::from_w3c("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let b = TraceParent::from_xray(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        );
        let both = MessageTrace { aws: b, w3c: a };
        assert_eq!(both.links().len(), 2);
        assert_eq!(
            both.original(),
            a,
            "a letter keeps the W3C one, a replay's original"
        );
        let same = MessageTrace { aws: a, w3c: a };
        assert_eq!(same.links().len(), 1);
        assert_eq!(MessageTrace::default().links().len(), 0);
    }
}
