//! The run's heartbeat: BetterStack pages when it stops arriving, or at once when a run says a
//! step failed.

use std::time::Duration;

/// A BetterStack heartbeat: a URL that expects a request every period, else it pages.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    http: reqwest::Client,
    url: String,
}

/// How long a heartbeat ping may take.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

impl Heartbeat {
    /// A heartbeat at `url`.
    pub fn new(url: String) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(HEARTBEAT_TIMEOUT)
                .build()
                .unwrap_or_default(),
            url: url.trim_end_matches('/').to_owned(),
        }
    }

    /// Pings it: `url` after a good run, `url/fail` when a step failed (BetterStack then pages
    /// at once instead of waiting for the period). The error is for the report.
    pub(crate) async fn ping(&self, failed: bool) -> Result<(), String> {
        let url = if failed {
            format!("{}/fail", self.url)
        } else {
            self.url.clone()
        };
        match self.http.get(&url).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("the heartbeat answered {}", r.status().as_u16())),
            Err(e) => Err(format!("the heartbeat is unreachable: {}", e.without_url())),
        }
    }
}
