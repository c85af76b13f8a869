//! Secrets read at run time from AWS Secrets Manager, cached, and read again when the service
//! that uses them rejects them (a rotation needs no deploy and no restart).
//!
//! Invariant: a secret's value never reaches a log line, an error or `Debug`; it is read again at
//! most once per [`MIN_REFRESH`], so a bad secret cannot turn every request into a Secrets
//! Manager call, and the first rejection of a cached value always reads it again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The least time between two reads again of one secret (its first read does not count).
pub const MIN_REFRESH: Duration = Duration::from_secs(5);

/// Why a secret could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reading secret {arn}: {reason}")]
pub struct SecretError {
    /// The secret (its ARN or name; not secret).
    pub arn: String,
    /// What went wrong.
    pub reason: String,
}

/// A value that is either given (locally) or kept in Secrets Manager (deployed).
#[derive(Clone)]
pub enum Secret {
    /// Given as it is (an environment variable, locally and in tests).
    Plain(String),
    /// Read from Secrets Manager at run time.
    Managed(Arc<ManagedSecret>),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plain(_) => f.write_str("Secret::Plain(<redacted>)"),
            Self::Managed(m) => write!(f, "Secret::Managed({})", m.arn),
        }
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::Plain(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::Plain(value.to_owned())
    }
}

impl Secret {
    /// Whether it is read from Secrets Manager (so reading it again may give another value).
    pub fn is_managed(&self) -> bool {
        matches!(self, Self::Managed(_))
    }

    /// The value: the cached one, read first if it never was.
    pub async fn value(&self) -> Result<String, SecretError> {
        match self {
            Self::Plain(v) => Ok(v.clone()),
            Self::Managed(m) => m.value().await,
        }
    }

    /// The value read anew (the service rejected the cached one). For a plain value, the same.
    pub async fn refreshed(&self) -> Result<String, SecretError> {
        match self {
            Self::Plain(v) => Ok(v.clone()),
            Self::Managed(m) => m.refresh().await,
        }
    }
}

/// One Secrets Manager secret and its cached value.
pub struct ManagedSecret {
    client: aws_sdk_secretsmanager::Client,
    arn: String,
    /// The value, and when it was last read again (`None`: read only once).
    cached: Mutex<Option<(String, Option<Instant>)>>,
}

impl fmt::Debug for ManagedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedSecret")
            .field("arn", &self.arn)
            .finish()
    }
}

impl ManagedSecret {
    /// The secret `arn` (or name), read through `client` when first needed.
    pub fn new(client: aws_sdk_secretsmanager::Client, arn: String) -> Self {
        Self {
            client,
            arn,
            cached: Mutex::new(None),
        }
    }

    /// The secret's ARN or name.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    async fn value(&self) -> Result<String, SecretError> {
        let mut cached = self.cached.lock().await;
        if let Some((value, _)) = cached.as_ref() {
            return Ok(value.clone());
        }
        let value = self.read().await?;
        *cached = Some((value.clone(), None));
        Ok(value)
    }

    async fn refresh(&self) -> Result<String, SecretError> {
        let mut cached = self.cached.lock().await;
        if let Some((value, Some(refreshed_at))) = cached.as_ref()
            && refreshed_at.elapsed() < MIN_REFRESH
        {
            return Ok(value.clone());
        }
        let value = self.read().await?;
        *cached = Some((value.clone(), Some(Instant::now())));
        tracing::info!(secret = %self.arn, "secret read again");
        Ok(value)
    }

    async fn read(&self) -> Result<String, SecretError> {
        let out = self
            .client
            .get_secret_value()
            .secret_id(&self.arn)
            .send()
            .await
            .map_err(|e| SecretError {
                arn: self.arn.clone(),
                reason: aws_sdk_secretsmanager::error::DisplayErrorContext(e).to_string(),
            })?;
        out.secret_string.ok_or_else(|| SecretError {
            arn: self.arn.clone(),
            reason: "it has no SecretString (a binary secret is not supported)".into(),
        })
    }
}
