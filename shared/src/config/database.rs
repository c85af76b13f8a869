//! The database connection settings every function shares: where the credentials come from
//! (a URL locally, a Secrets Manager secret deployed), the pool's size and its wait; and the
//! [`Database`] they describe.

use super::*;
use crate::db::Database;
use crate::secrets::{ManagedSecret, Secret};

/// Where a function's database credentials come from.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseSource {
    /// [`DATABASE_URL`]: a `postgres://` URL, as given (locally and in tests).
    Url(String),
    /// [`DATABASE_SECRET_ARN`]: a Secrets Manager secret holding a `postgres://` URL or the JSON
    /// RDS writes (`username`, `password`, `host`, `port`, `dbname`), read at run time.
    Secret(String),
}

impl fmt::Debug for DatabaseSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(url) => write!(f, "Url({})", redacted(url)),
            Self::Secret(arn) => write!(f, "Secret({arn})"),
        }
    }
}

/// The database connection settings. Its `Debug` hides the URL's password.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// Where the credentials come from.
    pub source: DatabaseSource,
    /// Pool size.
    pub pool_size: u32,
    /// How long to wait for a connection.
    pub acquire_timeout: Duration,
}

/// `url` with the password of its user info replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    match rest.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl DatabaseConfig {
    /// Reads [`DATABASE_URL`] or [`DATABASE_SECRET_ARN`] (exactly one), [`DATABASE_POOL_SIZE`]
    /// (default 5) and [`DATABASE_ACQUIRE_TIMEOUT_MS`] (default 5000).
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let source = match (env.get(DATABASE_URL), env.get(DATABASE_SECRET_ARN)) {
            (Some(_), Some(_)) => {
                return Err(ConfigError {
                    variable: DATABASE_SECRET_ARN,
                    problem: format!(
                        "is set together with {DATABASE_URL}: set one (the secret when deployed)"
                    ),
                });
            }
            (Some(url), None) => {
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    return Err(ConfigError {
                        variable: DATABASE_URL,
                        problem: "must be a postgres:// or postgresql:// URL".into(),
                    });
                }
                DatabaseSource::Url(url)
            }
            (None, Some(arn)) => DatabaseSource::Secret(arn),
            (None, None) => {
                return Err(ConfigError {
                    variable: DATABASE_URL,
                    problem: format!(
                        "is not set (nor {DATABASE_SECRET_ARN}, the Secrets Manager secret deployed \
                         functions read the credentials from)"
                    ),
                });
            }
        };
        let pool_size = env.parsed(DATABASE_POOL_SIZE, 5u32)?;
        if !(1..=100).contains(&pool_size) {
            return Err(ConfigError {
                variable: DATABASE_POOL_SIZE,
                problem: format!("must be 1 to 100, got {pool_size}"),
            });
        }
        let acquire_timeout =
            Duration::from_millis(env.parsed(DATABASE_ACQUIRE_TIMEOUT_MS, 5_000u64)?);
        Ok(Self {
            source,
            pool_size,
            acquire_timeout,
        })
    }

    /// Settings for the URL `url` (tests, benchmarks, tools).
    pub fn for_url(url: &str, pool_size: u32) -> Self {
        Self {
            source: DatabaseSource::Url(url.to_owned()),
            pool_size,
            acquire_timeout: Duration::from_secs(5),
        }
    }

    /// The pool's options: a function starts even while the database is down, and each record
    /// then fails transiently instead of the whole function failing its init.
    ///
    /// Connections are not pinged before each use (sqlx's default would add a round trip to
    /// every job, a third more than the transaction itself needs): a connection that died is
    /// discarded on its first error, and that record fails transiently and is retried.
    pub(crate) fn pool_options(&self) -> sqlx::postgres::PgPoolOptions {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(self.pool_size)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
    }

    /// A lazily connecting pool on [`DatabaseSource::Url`]; a secret's pool is
    /// [`Database`]'s.
    pub fn lazy_pool(&self) -> Result<sqlx::PgPool, ConfigError> {
        let DatabaseSource::Url(url) = &self.source else {
            return Err(ConfigError {
                variable: DATABASE_SECRET_ARN,
                problem: "a pool on a secret is built with shared::db::Database".into(),
            });
        };
        self.pool_options()
            .connect_lazy(url)
            .map_err(|e| ConfigError {
                variable: DATABASE_URL,
                problem: format!("is not a valid connection URL: {e}"),
            })
    }
}

impl Database {
    /// The database `config` describes. With a secret, nothing is read yet: [`Database::ready`]
    /// reads it, so a function starts even while Secrets Manager or the database is down.
    pub fn new(
        config: &DatabaseConfig,
        secrets: &aws_sdk_secretsmanager::Client,
    ) -> Result<Self, ConfigError> {
        match &config.source {
            DatabaseSource::Url(_) => Ok(Self::on(config.lazy_pool()?, None)),
            DatabaseSource::Secret(arn) => {
                if arn.trim().is_empty() {
                    return Err(ConfigError {
                        variable: DATABASE_SECRET_ARN,
                        problem: "is blank".into(),
                    });
                }
                let secret = Secret::Managed(std::sync::Arc::new(ManagedSecret::new(
                    secrets.clone(),
                    arn.clone(),
                )));
                // A placeholder until the secret is read: nothing connects before `ready`.
                let placeholder = config
                    .pool_options()
                    .connect_lazy_with(sqlx::postgres::PgConnectOptions::new());
                Ok(Self::on(placeholder, Some(secret)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let config = DatabaseConfig::for_url("postgres://app:s3cr%40t@db.internal:5432/points", 5);
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(
            shown.contains("postgres://app:***@db.internal:5432/points"),
            "{shown}"
        );
        assert_eq!(redacted("postgres://app@h/d"), "postgres://app@h/d");
    }

    #[test]
    fn the_credentials_come_from_a_url_or_a_secret_never_both() {
        let url = [(DATABASE_URL, "postgres://h/d")];
        assert_eq!(
            DatabaseConfig::from_env(&Env::from_pairs(&url))
                .unwrap()
                .source,
            DatabaseSource::Url("postgres://h/d".into())
        );
        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:db-AbCdEf";
        let secret = [(DATABASE_SECRET_ARN, arn)];
        assert_eq!(
            DatabaseConfig::from_env(&Env::from_pairs(&secret))
                .unwrap()
                .source,
            DatabaseSource::Secret(arn.into())
        );
        let both = [url[0], secret[0]];
        let err = DatabaseConfig::from_env(&Env::from_pairs(&both)).unwrap_err();
        assert_eq!(err.variable, DATABASE_SECRET_ARN);
        let err = DatabaseConfig::from_env(&Env::from_pairs(&[])).unwrap_err();
        assert_eq!(err.variable, DATABASE_URL);
        assert!(err.problem.contains(DATABASE_SECRET_ARN), "{err}");
    }
}
