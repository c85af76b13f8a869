//! BetterStack alerting settings: optional only when explicitly disabled.

use super::*;

/// Where the BetterStack token comes from.
#[derive(Clone, PartialEq, Eq)]
enum TokenSource {
    /// [`BETTERSTACK_API_TOKEN`], as given (locally).
    Plain(String),
    /// [`BETTERSTACK_TOKEN_SECRET_ARN`], read at run time.
    Secret(String),
}

/// BetterStack alerting settings.
#[derive(Clone)]
pub struct AlertConfig {
    /// The API base URL.
    pub base_url: String,
    /// The API token or its secret; never logged.
    token: TokenSource,
    /// The requester e-mail, if any.
    pub requester_email: Option<String>,
    /// Time budget of one delivery round.
    pub budget: Duration,
    /// Whom each queue's incidents page.
    pub routes: crate::paging::Routes,
    /// How often at most an open incident is updated with its group's count.
    pub update_every: Duration,
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
    /// missing token ([`BETTERSTACK_TOKEN_SECRET_ARN`], or [`BETTERSTACK_API_TOKEN`] locally) is
    /// an error: silence must be chosen, never defaulted.
    pub fn from_env(env: &Env<'_>) -> Result<Option<Self>, ConfigError> {
        if env.parsed(ALERTING_DISABLED, false)? {
            return Ok(None);
        }
        let token = token_source(env)?;
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
        let update_every = env.seconds(ALERT_UPDATE_INTERVAL_SECONDS, Duration::from_secs(900))?;
        if update_every < Duration::from_secs(60) {
            return Err(ConfigError {
                variable: ALERT_UPDATE_INTERVAL_SECONDS,
                problem: format!(
                    "must be at least 60 seconds (an incident updated more often is noise), got {}",
                    update_every.as_secs()
                ),
            });
        }
        Ok(Some(Self {
            base_url,
            token,
            requester_email: env.get(BETTERSTACK_REQUESTER_EMAIL),
            budget,
            routes: routes(env)?,
            update_every,
        }))
    }

    /// The BetterStack client these settings describe; a token in Secrets Manager is read
    /// through `secrets` when first needed.
    pub fn client(
        &self,
        secrets: &aws_sdk_secretsmanager::Client,
    ) -> Result<crate::paging::BetterStack, ConfigError> {
        let token = match &self.token {
            TokenSource::Plain(token) => crate::secrets::Secret::Plain(token.clone()),
            TokenSource::Secret(arn) => crate::secrets::Secret::Managed(std::sync::Arc::new(
                crate::secrets::ManagedSecret::new(secrets.clone(), arn.clone()),
            )),
        };
        crate::paging::BetterStack::new(&self.base_url, token, self.requester_email.clone())
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
        secrets: &aws_sdk_secretsmanager::Client,
    ) -> Result<crate::paging::Alerter, ConfigError> {
        Ok(crate::paging::Alerter::new(
            pool,
            self.client(secrets)?,
            self.routes.clone(),
            clock,
            self.budget,
            self.update_every,
        ))
    }
}

/// Where the token comes from: exactly one of [`BETTERSTACK_API_TOKEN`] (locally) and
/// [`BETTERSTACK_TOKEN_SECRET_ARN`].
fn token_source(env: &Env<'_>) -> Result<TokenSource, ConfigError> {
    match (
        env.get(BETTERSTACK_API_TOKEN),
        env.get(BETTERSTACK_TOKEN_SECRET_ARN),
    ) {
        (Some(token), None) => Ok(TokenSource::Plain(token)),
        (None, Some(arn)) => Ok(TokenSource::Secret(arn)),
        (Some(_), Some(_)) => Err(ConfigError {
            variable: BETTERSTACK_TOKEN_SECRET_ARN,
            problem: format!(
                "is set together with {BETTERSTACK_API_TOKEN}: set one (the secret when deployed)"
            ),
        }),
        (None, None) => Err(ConfigError {
            variable: BETTERSTACK_API_TOKEN,
            problem: format!(
                "is not set (nor {BETTERSTACK_TOKEN_SECRET_ARN}); set {ALERTING_DISABLED}=true \
                 to run without alerts (locally only)"
            ),
        }),
    }
}

/// The routes: [`BETTERSTACK_POLICY_ID`] and [`BETTERSTACK_TEAM_NAME`] for every queue, a queue's
/// own in [`BETTERSTACK_QUEUE_ROUTES`] (`{"<queue>": {"policy_id": "…", "team_name": "…"}}`),
/// and escalations to [`BETTERSTACK_ESCALATION_POLICY_ID`] if set.
fn routes(env: &Env<'_>) -> Result<crate::paging::Routes, ConfigError> {
    use crate::paging::{Route, Routes};
    let default = Route {
        policy_id: env.get(BETTERSTACK_POLICY_ID),
        team_name: env.get(BETTERSTACK_TEAM_NAME),
    };
    let by_queue = match env.get(BETTERSTACK_QUEUE_ROUTES) {
        None => Default::default(),
        Some(raw) => serde_json::from_str(&raw).map_err(|e| ConfigError {
            variable: BETTERSTACK_QUEUE_ROUTES,
            problem: format!(
                "must be a JSON object of queue name to {{\"policy_id\": \"…\", \"team_name\": \"…\"}}: {e}"
            ),
        })?,
    };
    let escalation = env
        .get(BETTERSTACK_ESCALATION_POLICY_ID)
        .map(|policy_id| Route {
            policy_id: Some(policy_id),
            team_name: default.team_name.clone(),
        });
    Ok(Routes {
        default,
        by_queue,
        escalation,
    })
}
