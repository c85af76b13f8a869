//! Logging for the Lambda binaries, on stderr (stdout carries the EMF metrics), configured the way
//! Lambda's advanced logging controls configure a function:
//!
//! - **Level:** `AWS_LAMBDA_LOG_LEVEL` (what the function's `LoggingConfig.ApplicationLogLevel`
//!   sets) wins where it is set; else `RUST_LOG` (any `tracing` filter); else `info`. This is the
//!   order the Rust runtime's own logger reads them in. The template sets `RUST_LOG` from its
//!   `LogLevel` and never `ApplicationLogLevel`: Lambda's own filter counts a line without a
//!   `level` (the EMF metric lines) as INFO, so at WARN it would drop every metric.
//! - **Format:** `AWS_LAMBDA_LOG_FORMAT` (`LoggingConfig.LogFormat`): `JSON`, one object a line,
//!   or `Text`. Unset, JSON: what every function deploys with and what the local tools read.
//! - A value that is neither stops the function at start, naming the variable.
//!
//! **Every line about a record carries its ids, at every level.** Each message is processed
//! inside a [`record_span`] named `job` with the consumer, `message_id`, `job_id`,
//! `correlation_id`, `tenant_id` and `attempt`; the handler's own lines are inside it too. The span
//! is declared at `ERROR`, so it is enabled whenever any line is: at `AWS_LAMBDA_LOG_LEVEL=WARN`
//! the `dead-lettered` line still names its job (an `INFO` span would be filtered out with its
//! fields), whatever the filter names (the span's target, `shared::telemetry`, is always let
//! through at `error`). In JSON, `span` is the job's span and `spans` every span the line is in,
//! outermost first: at `INFO` and below, the runtime's `Lambda runtime invoke` span (an INFO
//! span of its own) gives each line the invocation's `requestId` and `xrayTraceId`.
//!
//! **Traces** (OpenTelemetry, off by default) are [`otel`]'s: a span for each invocation, each
//! job and each database statement, from the same spans.

pub mod otel;

use crate::config::{ConfigError, Env};
use crate::envelope::PartialIds;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The target of every [`record_span`]: always enabled (see the module).
pub const RECORD_SPAN_TARGET: &str = module_path!();

/// The `job` span at `target`, its ids to be recorded.
macro_rules! job_span {
    ($target:expr, $consumer:expr, $message_id:expr) => {
        tracing::error_span!(
        target: $target,
        "job",
        consumer = $consumer,
        message_id = $message_id,
        job_id = tracing::field::Empty,
        correlation_id = tracing::field::Empty,
        tenant_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
        // OpenTelemetry's span kind, recorded only where spans are exported (`consumer`).
        otel.kind = tracing::field::Empty,
    )
    };
}

/// `AWS_LAMBDA_LOG_LEVEL`: the function's log level, set by Lambda from `LoggingConfig`.
pub const AWS_LAMBDA_LOG_LEVEL: &str = "AWS_LAMBDA_LOG_LEVEL";
/// `AWS_LAMBDA_LOG_FORMAT`: `JSON` or `Text`, set by Lambda from `LoggingConfig`.
pub const AWS_LAMBDA_LOG_FORMAT: &str = "AWS_LAMBDA_LOG_FORMAT";
/// `RUST_LOG`: a `tracing` filter, used only where `AWS_LAMBDA_LOG_LEVEL` is not set.
pub const RUST_LOG: &str = "RUST_LOG";

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object a line (the span's fields under `span`).
    Json,
    /// Plain text, the span's fields in `job{…}` before the message.
    Text,
}

/// The logging a function runs with, read from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The `tracing` filter.
    pub filter: String,
    /// The line format.
    pub format: LogFormat,
    /// Which variable the filter came from (`None`: the default, `info`).
    pub level_from: Option<&'static str>,
}

impl LogSettings {
    /// Reads the three variables; an unknown level or format, or a `RUST_LOG` that is not a
    /// filter, is an error naming the variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let format = match env.get(AWS_LAMBDA_LOG_FORMAT) {
            None => LogFormat::Json,
            Some(v) if v.trim().eq_ignore_ascii_case("json") => LogFormat::Json,
            Some(v) if v.trim().eq_ignore_ascii_case("text") => LogFormat::Text,
            Some(v) => {
                return Err(ConfigError {
                    variable: AWS_LAMBDA_LOG_FORMAT,
                    problem: format!("{v:?} is not a log format: JSON or Text"),
                });
            }
        };
        let (filter, level_from) = if let Some(level) = env.get(AWS_LAMBDA_LOG_LEVEL) {
            let filter = lambda_log_level(&level).ok_or_else(|| ConfigError {
                variable: AWS_LAMBDA_LOG_LEVEL,
                problem: format!(
                    "{level:?} is not a log level: TRACE, DEBUG, INFO, WARN, ERROR or FATAL"
                ),
            })?;
            (filter.to_owned(), Some(AWS_LAMBDA_LOG_LEVEL))
        } else if let Some(directives) = env.get(RUST_LOG) {
            tracing_subscriber::EnvFilter::builder()
                .parse(&directives)
                .map_err(|e| ConfigError {
                    variable: RUST_LOG,
                    problem: format!("{directives:?} is not a tracing filter: {e}"),
                })?;
            (directives, Some(RUST_LOG))
        } else {
            ("info".to_owned(), None)
        };
        Ok(Self {
            filter,
            format,
            level_from,
        })
    }
}

/// Installs the global subscriber from the process environment (the logs, and the spans'
/// export where [`otel::TRACING`] is `Active`), or stops the process naming the variable at
/// fault. Call once, first thing in `main`.
pub fn init() {
    let env = Env::process();
    let settings = crate::config::or_exit(LogSettings::from_env(&env));
    let tracing = crate::config::or_exit(otel::Tracing::from_env(&env));
    install(&settings, &tracing);
    if settings.level_from == Some(AWS_LAMBDA_LOG_LEVEL) && env.get(RUST_LOG).is_some() {
        tracing::debug!("RUST_LOG is ignored: the function's AWS_LAMBDA_LOG_LEVEL is set");
    }
}

/// Installs `settings` (and `tracing`) as the global subscriber; a second call (a test harness
/// that already installed one) is not an error. Each layer has its own filter: the log level
/// never turns a span off, and the statements traced (`sqlx::query` at `DEBUG`) are not
/// logged unless the level asks for them.
pub fn install(settings: &LogSettings, tracing: &otel::Tracing) {
    // The record span's own target, always enabled: a filter naming only other targets
    // (`redeem_reward=debug`) would otherwise turn it off, and its lines would lose their ids.
    let filter = EnvFilter::new(format!("{},{RECORD_SPAN_TARGET}=error", settings.filter));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let lines = match settings.format {
        LogFormat::Json => lines
            .json()
            .with_current_span(true)
            // The runtime's invoke span (`requestId`, `xrayTraceId`) and the job's, outermost
            // first: every line names its invocation and its X-Ray trace.
            .with_span_list(true)
            .boxed(),
        LogFormat::Text => lines.boxed(),
    };
    let spans = match tracing {
        otel::Tracing::Disabled => None,
        otel::Tracing::Active(endpoint) => otel::tracer(endpoint).map(otel::layers),
    };
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(spans)
        .try_init();
}

/// The `tracing` level for Lambda's `AWS_LAMBDA_LOG_LEVEL` (`TRACE` … `FATAL`, any case).
pub fn lambda_log_level(value: &str) -> Option<&'static str> {
    Some(match value.trim().to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" => "warn",
        "ERROR" | "FATAL" => "error",
        _ => return None,
    })
}

/// The span a record's lines are written in: the consumer, the message and every id its body
/// carries (`attempt` and `outcome` are recorded once known). Enabled at every level (see the
/// module).
pub fn record_span(consumer: &str, message_id: &str, ids: &PartialIds) -> tracing::Span {
    let span = job_span!(RECORD_SPAN_TARGET, consumer, message_id);
    record_ids(&span, ids);
    span
}

/// A [`record_span`] for a line about a record outside its life (after its outcome, in the
/// transport): its lines carry the same ids, and it is never exported as a trace's job span (a
/// delivery is one job span, the one its outcome was recorded on).
pub fn record_lines_span(consumer: &str, message_id: &str, ids: &PartialIds) -> tracing::Span {
    let span = job_span!(RECORD_LINES_TARGET, consumer, message_id);
    record_ids(&span, ids);
    span
}

/// The target of every [`record_lines_span`]: under [`RECORD_SPAN_TARGET`], so always enabled
/// the same way, and not it, so not exported.
pub const RECORD_LINES_TARGET: &str = "shared::telemetry::lines";

/// Fills a [`record_span`] with the ids a body turned out to carry, once it is parsed.
pub fn record_ids(span: &tracing::Span, ids: &PartialIds) {
    if let Some(job_id) = ids.job_id {
        span.record("job_id", tracing::field::display(job_id));
    }
    if let Some(tenant_id) = ids.tenant_id {
        span.record("tenant_id", tracing::field::display(tenant_id));
    }
    if let Some(correlation_id) = &ids.correlation_id {
        // Bounded as the letter keeps it: every line of the job carries it.
        let bounded = crate::ids::bounded_correlation_id(correlation_id);
        span.record("correlation_id", &*bounded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<LogSettings, ConfigError> {
        LogSettings::from_env(&Env::from_pairs(pairs))
    }

    #[test]
    fn lambda_log_levels_map_to_tracing_levels() {
        assert_eq!(lambda_log_level("DEBUG"), Some("debug"));
        assert_eq!(lambda_log_level("warn"), Some("warn"));
        assert_eq!(lambda_log_level("FATAL"), Some("error"));
        assert_eq!(lambda_log_level("loud"), None);
    }

    #[test]
    fn the_functions_configured_level_wins_over_rust_log() {
        let s = settings(&[(AWS_LAMBDA_LOG_LEVEL, "WARN"), (RUST_LOG, "debug")]).unwrap();
        assert_eq!(
            (s.filter.as_str(), s.level_from),
            ("warn", Some(AWS_LAMBDA_LOG_LEVEL))
        );
        let s = settings(&[(RUST_LOG, "shared=debug,info")]).unwrap();
        assert_eq!(
            (s.filter.as_str(), s.level_from),
            ("shared=debug,info", Some(RUST_LOG))
        );
        let s = settings(&[]).unwrap();
        assert_eq!((s.filter.as_str(), s.format), ("info", LogFormat::Json));
        // The template's LogLevel values, as RUST_LOG.
        for level in ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"] {
            let s = settings(&[(RUST_LOG, level)]).unwrap();
            let filter = tracing_subscriber::EnvFilter::new(&s.filter);
            assert_eq!(
                filter.max_level_hint().map(|l| l.to_string()),
                Some(level.to_lowercase()),
                "{level}"
            );
        }
    }

    #[test]
    fn the_log_format_is_lambdas_and_json_when_unset() {
        let format = |v| settings(&[(AWS_LAMBDA_LOG_FORMAT, v)]).map(|s| s.format);
        assert_eq!(format("Text"), Ok(LogFormat::Text));
        assert_eq!(format("JSON"), Ok(LogFormat::Json));
        assert_eq!(format("json"), Ok(LogFormat::Json));
    }

    #[test]
    fn an_unknown_level_format_or_filter_names_its_variable() {
        let variable = |pairs: &[(&str, &str)]| settings(pairs).unwrap_err().variable;
        assert_eq!(
            variable(&[(AWS_LAMBDA_LOG_FORMAT, "yaml")]),
            AWS_LAMBDA_LOG_FORMAT
        );
        assert_eq!(
            variable(&[(AWS_LAMBDA_LOG_LEVEL, "loud")]),
            AWS_LAMBDA_LOG_LEVEL
        );
        assert_eq!(variable(&[(RUST_LOG, "shared=[")]), RUST_LOG);
    }
}
