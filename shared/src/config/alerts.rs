//! BetterStack alerting settings: optional only when explicitly disabled.

use super::*;

/// BetterStack alerting settings.
#[derive(Clone)]
pub struct AlertConfig {
    /// The API base URL.
    pub base_url: String,
    /// The API token; never logged.
    token: String,
    /// The requester e-mail, if any.
    pub requester_email: Option<String>,
    /// Time budget of one delivery round.
    pub budget: Duration,
}

impl fmt::Debug for AlertConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlertConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl AlertConfig {
    /// Alerting settings, or `None` when [`ALERTING_DISABLED`] is `true`. Without that, a
    /// missing [`BETTERSTACK_API_TOKEN`] is an error: silence must be chosen, never defaulted.
    pub fn from_env(env: &Env<'_>) -> Result<Option<Self>, ConfigError> {
        if env.parsed(ALERTING_DISABLED, false)? {
            return Ok(None);
        }
        let token = env.get(BETTERSTACK_API_TOKEN).ok_or_else(|| ConfigError {
            variable: BETTERSTACK_API_TOKEN,
            problem: format!(
                "is not set; set {ALERTING_DISABLED}=true to run without alerts (locally only)"
            ),
        })?;
        let base_url = env.parsed(
            BETTERSTACK_BASE_URL,
            "https://uptime.betterstack.com".to_owned(),
        )?;
        if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
            return Err(ConfigError {
                variable: BETTERSTACK_BASE_URL,
                problem: "must be an http(s) URL".into(),
            });
        }
        let budget = Duration::from_millis(env.parsed(ALERT_TIMEOUT_MS, 2_000u64)?);
        Ok(Some(Self {
            base_url,
            token,
            requester_email: env.get(BETTERSTACK_REQUESTER_EMAIL),
            budget,
        }))
    }

    /// The BetterStack client these settings describe.
    pub fn client(&self) -> Result<crate::alerting::BetterStack, ConfigError> {
        crate::alerting::BetterStack::new(
            &self.base_url,
            self.token.clone(),
            self.requester_email.clone(),
        )
        .map_err(|e| ConfigError {
            variable: BETTERSTACK_BASE_URL,
            problem: format!("cannot build an HTTP client: {e}"),
        })
    }

    /// The alerter these settings describe, over `pool`.
    pub fn alerter(
        &self,
        pool: sqlx::PgPool,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Result<crate::alerting::Alerter, ConfigError> {
        Ok(crate::alerting::Alerter::new(
            pool,
            self.client()?,
            clock,
            self.budget,
        ))
    }
}
