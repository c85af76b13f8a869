//! Newtypes for the identifiers that must never be mixed up: a job, a tenant, a dead letter,
//! and the consumer name that keys the fence.

use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

uuid_id!(
    /// The producer-assigned identity of one unit of work; every copy and replay of a job carries it.
    JobId
);
uuid_id!(
    /// The tenant a job belongs to.
    TenantId
);
uuid_id!(
    /// The primary key of a row in `core.dead_letters`.
    DeadLetterId
);

/// The stable name of a consumer: the second half of the fence's key.
///
/// Renaming a consumer makes every existing fence of it invisible, so the name is validated
/// once (1 to 128 characters of `a-z`, `0-9`, `.`, `_`, `-`) and then never changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Validates `name`; the error says what is wrong with it.
    pub fn new(name: impl Into<String>) -> Result<Self, String> {
        let name = name.into();
        let valid_char =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
        if name.is_empty() || name.len() > 128 {
            return Err(format!("must be 1 to 128 characters, got {}", name.len()));
        }
        if !name.chars().all(valid_char) {
            return Err(format!(
                "{name:?} may only contain a-z, 0-9, '.', '_' and '-'"
            ));
        }
        Ok(Self(name))
    }

    /// The name as stored in `core.processed_jobs.consumer` and `core.dead_letters.consumer`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::ConsumerName;

    #[test]
    fn consumer_names_are_validated() {
        assert!(ConsumerName::new("award-points.v1").is_ok());
        assert!(ConsumerName::new("").is_err());
        assert!(ConsumerName::new("Award Points").is_err());
        assert!(ConsumerName::new("x".repeat(129)).is_err());
    }
}
