//! The database connection settings every function shares.

use super::*;

/// The database connection settings. Its `Debug` hides the URL's password.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// `postgres://` or `postgresql://` URL.
    pub url: String,
    /// Pool size.
    pub pool_size: u32,
    /// How long to wait for a connection.
    pub acquire_timeout: Duration,
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redacted(&self.url))
            .field("pool_size", &self.pool_size)
            .field("acquire_timeout", &self.acquire_timeout)
            .finish()
    }
}

/// `url` with the password of its user info replaced by `***`.
fn redacted(url: &str) -> String {
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
    /// Reads [`DATABASE_URL`], [`DATABASE_POOL_SIZE`] (default 5) and
    /// [`DATABASE_ACQUIRE_TIMEOUT_MS`] (default 5000).
    pub fn from_env(env: &Env<'_>) -> Result<Self, ConfigError> {
        let url = env.required(DATABASE_URL)?;
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError {
                variable: DATABASE_URL,
                problem: "must be a postgres:// or postgresql:// URL".into(),
            });
        }
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
            url,
            pool_size,
            acquire_timeout,
        })
    }

    /// A lazily connecting pool: a function starts even while the database is down, and each
    /// record then fails transiently instead of the whole function failing its init.
    ///
    /// Connections are not pinged before each use (sqlx's default would add a round trip to
    /// every job, a third more than the transaction itself needs): a connection that died is
    /// discarded on its first error, and that record fails transiently and is retried.
    pub fn lazy_pool(&self) -> Result<sqlx::PgPool, ConfigError> {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(self.pool_size)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy(&self.url)
            .map_err(|e| ConfigError {
                variable: DATABASE_URL,
                problem: format!("is not a valid connection URL: {e}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let config = DatabaseConfig {
            url: "postgres://app:s3cr%40t@db.internal:5432/points".into(),
            pool_size: 5,
            acquire_timeout: Duration::from_secs(5),
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(
            shown.contains("postgres://app:***@db.internal:5432/points"),
            "{shown}"
        );
        assert_eq!(redacted("postgres://app@h/d"), "postgres://app@h/d");
    }
}
