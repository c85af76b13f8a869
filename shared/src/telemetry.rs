//! Logging for the Lambda binaries: JSON lines on stderr (stdout carries the EMF metrics). The
//! level is `RUST_LOG` if set, else `AWS_LAMBDA_LOG_LEVEL` (what SAM's `LoggingConfig` sets),
//! else `info`. Each line inside a job carries the job's span: `job_id`, `correlation_id`,
//! `tenant_id`, `message_id` and `attempt`, the handler's own lines included.

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(lambda_log_level(
            std::env::var("AWS_LAMBDA_LOG_LEVEL").ok().as_deref(),
        ))
    });
    // `try_init`: a second call (a test harness that already installed one) is not an error.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(true)
        .with_span_list(false)
        .try_init();
}

/// The `tracing` level for Lambda's `AWS_LAMBDA_LOG_LEVEL` (`TRACE` … `FATAL`); `info` when
/// unset or unknown.
pub fn lambda_log_level(value: Option<&str>) -> &'static str {
    match value.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("TRACE") => "trace",
        Some("DEBUG") => "debug",
        Some("WARN") => "warn",
        Some("ERROR") | Some("FATAL") => "error",
        _ => "info",
    }
}

#[cfg(test)]
mod tests {
    use super::lambda_log_level;

    #[test]
    fn lambda_log_levels_map_to_tracing_levels() {
        assert_eq!(lambda_log_level(Some("DEBUG")), "debug");
        assert_eq!(lambda_log_level(Some("warn")), "warn");
        assert_eq!(lambda_log_level(Some("FATAL")), "error");
        assert_eq!(lambda_log_level(None), "info");
        assert_eq!(lambda_log_level(Some("loud")), "info");
    }
}
