// Over 300 lines, and going: hand-written X-Ray segments, replaced by OpenTelemetry (issue 37).
//! Optional AWS X-Ray tracing: a subsegment for each job and one for each database statement,
//! sent to the X-Ray daemon Lambda runs beside an actively traced function. Off by default; the
//! template's `Tracing` parameter turns it on for a stack (`Tracing: Active` on every function,
//! `TRACING=Active` in its environment, and the X-Ray write actions in every role).
//!
//! Invariant: tracing observes and never decides. Segments go out over UDP (as every X-Ray SDK
//! sends them), so nothing waits on the daemon and a segment that cannot be sent is dropped; an
//! invocation whose trace is not sampled sends nothing. The ids and times in a segment are X-Ray's
//! (random, wall clock), never inputs to a job.
//!
//! Where the segments come from, without a line in any consumer:
//!
//! - the runtime's `Lambda runtime invoke` span carries the invocation's trace header
//!   (`Root=…;Parent=…;Sampled=1`): the function's own segment is the parent of everything below;
//! - each record's `job` span ([`super::record_span`]) becomes a subsegment named after the
//!   consumer, annotated with `job_id`, `message_id`, `correlation_id`, `tenant_id` and
//!   `attempt` (so `annotation.job_id = "…"` finds a job's trace);
//! - each statement sqlx runs (its `sqlx::query` event, the harness's fence and commit and the
//!   consumer's own queries alike) becomes a `remote` subsegment with its SQL (never its bound
//!   values) under the job it ran for.

use crate::config::{ConfigError, Env};
use serde_json::{Map, Value, json};
use std::fmt::Debug;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// `TRACING`: `Active` to send X-Ray segments, `Disabled` (or unset) for none.
pub const TRACING: &str = "TRACING";
/// `AWS_XRAY_DAEMON_ADDRESS`: where Lambda's X-Ray daemon listens (`host:port`, or
/// `tcp:host:port udp:host:port`); `127.0.0.1:2000` where it is unset, as in the X-Ray SDKs.
pub const AWS_XRAY_DAEMON_ADDRESS: &str = "AWS_XRAY_DAEMON_ADDRESS";

/// The longest SQL text a statement's subsegment carries (a UDP datagram holds 64 KiB).
const MAX_SQL_CHARS: usize = 2_000;

/// Whether a function sends X-Ray segments, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracing {
    /// No segments (the default).
    Disabled,
    /// Segments for sampled invocations, to the daemon at this address.
    Active(SocketAddr),
}

impl Tracing {
    /// Reads [`TRACING`] and [`AWS_XRAY_DAEMON_ADDRESS`]; a value that is neither `Active` nor
    /// `Disabled`, or an address that does not resolve, is an error naming its variable.
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
        let address = env
            .get(AWS_XRAY_DAEMON_ADDRESS)
            .unwrap_or_else(|| "127.0.0.1:2000".to_owned());
        daemon_address(&address)
            .map(Self::Active)
            .ok_or_else(|| ConfigError {
                variable: AWS_XRAY_DAEMON_ADDRESS,
                problem: format!("{address:?} is not host:port (or udp:host:port)"),
            })
    }

    /// The layer that sends the segments, if tracing is active.
    pub fn layer(self) -> Option<XrayLayer> {
        match self {
            Self::Disabled => None,
            Self::Active(daemon) => {
                let bind: SocketAddr = if daemon.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    ([0u16; 8], 0).into()
                };
                let socket = UdpSocket::bind(bind).ok()?;
                socket.set_nonblocking(true).ok()?;
                Some(XrayLayer { socket, daemon })
            }
        }
    }
}

/// The UDP address in `AWS_XRAY_DAEMON_ADDRESS`'s two forms.
fn daemon_address(value: &str) -> Option<SocketAddr> {
    let udp = value
        .split_whitespace()
        .find_map(|part| part.strip_prefix("udp:"))
        .unwrap_or(value.trim());
    udp.to_socket_addrs().ok()?.next()
}

/// A sampled invocation's trace: its root id and the function segment every subsegment hangs
/// from. `None` for a header that is not sampled or not well formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    /// `1-<8 hex>-<24 hex>`.
    pub root: String,
    /// The function's segment id, 16 hex digits.
    pub parent: String,
}

impl TraceHeader {
    /// Parses `Root=…;Parent=…;Sampled=1` (other keys are ignored; order does not matter).
    pub fn parse_sampled(header: &str) -> Option<Self> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", v)) => root = Some(v),
                Some(("Parent", v)) => parent = Some(v),
                Some(("Sampled", v)) => sampled = v == "1",
                _ => {}
            }
        }
        let (root, parent) = (root?, parent?);
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        let well_formed = matches!(root.split('-').collect::<Vec<_>>()[..],
            ["1", time, id] if hex(time, 8) && hex(id, 24))
            && hex(parent, 16);
        (sampled && well_formed).then(|| Self {
            root: root.to_owned(),
            parent: parent.to_owned(),
        })
    }
}

/// The `tracing` layer that turns spans and sqlx's statement events into X-Ray subsegments.
pub struct XrayLayer {
    socket: UdpSocket,
    daemon: SocketAddr,
}

/// A job span's subsegment, open until the span closes.
struct Open {
    id: String,
    trace: TraceHeader,
    start: f64,
    annotations: Map<String, Value>,
}

/// The spans whose fields become a job's annotations.
const ANNOTATIONS: [&str; 6] = [
    "consumer",
    "message_id",
    "job_id",
    "correlation_id",
    "tenant_id",
    "attempt",
];

impl<S> tracing_subscriber::Layer<S> for XrayLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let meta = attrs.metadata();
        if meta.name() == "Lambda runtime invoke" {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let Some(trace) = fields
                .0
                .get("xrayTraceId")
                .and_then(Value::as_str)
                .and_then(TraceHeader::parse_sampled)
            {
                span.extensions_mut().insert(trace);
            }
        } else if meta.target() == super::RECORD_SPAN_TARGET && meta.name() == "job" {
            let Some(trace) = span
                .scope()
                .skip(1)
                .find_map(|s| s.extensions().get::<TraceHeader>().cloned())
            else {
                return;
            };
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            fields.0.retain(|k, _| ANNOTATIONS.contains(&k.as_str()));
            span.extensions_mut().insert(Open {
                id: segment_id(),
                trace,
                start: now(),
                annotations: fields.0,
            });
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(open) = extensions.get_mut::<Open>() {
            let mut fields = Fields::default();
            values.record(&mut fields);
            fields.0.retain(|k, _| ANNOTATIONS.contains(&k.as_str()));
            open.annotations.extend(fields.0);
        }
    }

    // Long, and going: the hand-written X-Ray segments are replaced by OpenTelemetry (issue 37).
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        // The job the statement ran for, else the invocation itself.
        let Some((trace, parent)) = ctx.event_scope(event).and_then(|mut scope| {
            scope.find_map(|s| {
                let extensions = s.extensions();
                if let Some(open) = extensions.get::<Open>() {
                    Some((open.trace.clone(), open.id.clone()))
                } else {
                    let trace = extensions.get::<TraceHeader>()?;
                    Some((trace.clone(), trace.parent.clone()))
                }
            })
        }) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let end = now();
        let elapsed = fields.0.get("elapsed_secs").and_then(Value::as_f64);
        let sql = [fields.0.get("db.statement"), fields.0.get("summary")]
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(sanitized)
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        self.send(json!({
            "type": "subsegment",
            "id": segment_id(),
            "trace_id": trace.root,
            "parent_id": parent,
            "name": "PostgreSQL",
            "namespace": "remote",
            "start_time": end - elapsed.unwrap_or(0.0).max(0.0),
            "end_time": end,
            "sql": {
                "database_type": "PostgreSQL",
                "sanitized_query": sql,
            },
            "metadata": {"default": {
                "rows_affected": fields.0.get("rows_affected"),
                "rows_returned": fields.0.get("rows_returned"),
            }},
        }));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        let name = open
            .annotations
            .get("consumer")
            .and_then(Value::as_str)
            .unwrap_or("job")
            .to_owned();
        self.send(json!({
            "type": "subsegment",
            "id": open.id,
            "trace_id": open.trace.root,
            "parent_id": open.trace.parent,
            "name": name,
            "start_time": open.start,
            "end_time": now(),
            "annotations": open.annotations,
        }));
    }
}

impl XrayLayer {
    /// One segment document, as the daemon reads it: a header line, then the segment.
    fn send(&self, segment: Value) {
        let datagram = format!("{{\"format\":\"json\",\"version\":1}}\n{segment}");
        // Dropped if it cannot go now: tracing never holds a job back.
        let _ = self.socket.send_to(datagram.as_bytes(), self.daemon);
    }
}

/// `sql` with every quoted literal (`'…'`, `E'…'`) as `?` and its whitespace collapsed, at most
/// [`MAX_SQL_CHARS`] long. The harness sends a few statements with their values written in
/// (`core.open_job(…)`, a letter's payload): no value a producer sent reaches a trace.
fn sanitized(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len().min(MAX_SQL_CHARS));
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            let escapes = out.ends_with(['E', 'e']);
            if escapes {
                out.pop();
            }
            while let Some(c) = chars.next() {
                match c {
                    '\\' if escapes => {
                        chars.next();
                    }
                    '\'' if chars.peek() == Some(&'\'') => {
                        chars.next();
                    }
                    '\'' => break,
                    _ => {}
                }
            }
            out.push('?');
        } else if c.is_whitespace() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        if out.chars().count() >= MAX_SQL_CHARS {
            break;
        }
    }
    out.trim_end().to_owned()
}

/// A new segment id: 16 hex digits, random.
fn segment_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Seconds since the epoch, as X-Ray's `start_time` and `end_time` are.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A span's or event's fields, as JSON values.
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().into(), json!(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sampled_well_formed_header_is_traced() {
        let sampled = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        assert_eq!(
            TraceHeader::parse_sampled(sampled),
            Some(TraceHeader {
                root: "1-5759e988-bd862e3fe1be46a994272793".into(),
                parent: "53995c3f42cd8ad8".into(),
            })
        );
        for header in [
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
            "Root=1-00000000-000000000000000000000000",
            "Root=1-5759e988-\"};Parent=53995c3f42cd8ad8;Sampled=1",
            "",
        ] {
            assert_eq!(TraceHeader::parse_sampled(header), None, "{header}");
        }
    }

    #[test]
    fn a_statements_literals_never_reach_its_segment() {
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
        assert!(sanitized(&"x ".repeat(5_000)).chars().count() <= MAX_SQL_CHARS);
    }

    #[test]
    fn tracing_is_off_unless_active_and_a_bad_value_names_its_variable() {
        let tracing = |pairs: &[(&str, &str)]| Tracing::from_env(&Env::from_pairs(pairs));
        assert_eq!(tracing(&[]), Ok(Tracing::Disabled));
        assert_eq!(tracing(&[(TRACING, "Disabled")]), Ok(Tracing::Disabled));
        assert_eq!(
            tracing(&[(TRACING, "Active")]),
            Ok(Tracing::Active("127.0.0.1:2000".parse().unwrap()))
        );
        assert_eq!(
            tracing(&[
                (TRACING, "active"),
                (
                    AWS_XRAY_DAEMON_ADDRESS,
                    "tcp:169.254.79.129:2000 udp:169.254.79.130:2000"
                )
            ]),
            Ok(Tracing::Active("169.254.79.130:2000".parse().unwrap()))
        );
        assert_eq!(tracing(&[(TRACING, "on")]).unwrap_err().variable, TRACING);
        assert_eq!(
            tracing(&[(TRACING, "Active"), (AWS_XRAY_DAEMON_ADDRESS, "daemon")])
                .unwrap_err()
                .variable,
            AWS_XRAY_DAEMON_ADDRESS
        );
    }
}
