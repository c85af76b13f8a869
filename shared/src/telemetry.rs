//! Logging for the Lambda binaries: JSON lines on stderr (stdout carries the EMF metrics),
//! filtered by `RUST_LOG` (default `info`).

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .init();
}
