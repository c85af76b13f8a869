//! Newtypes for the identifiers that must never be mixed up: a job, a tenant, a dead letter, a
//! failure group, and the consumer name that keys the fence.

use serde::{Deserialize, Serialize};

/// Maps a domain type to a PostgreSQL `text` column: read through `parse` (a value the type
/// refuses is a decode error, never a silent string), written through `as_str`.
macro_rules! text_column {
    ($ty:ty, $parse:expr, $as_str:expr) => {
        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <String as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }
        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                #[allow(clippy::redundant_closure_call)]
                ($parse)(text).map_err(|e| format!("{}: {e}", stringify!($ty)).into())
            }
        }
        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                #[allow(clippy::redundant_closure_call)]
                let text: &str = ($as_str)(self);
                <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&text, buf)
            }
        }
    };
}
use std::fmt;
pub(crate) use text_column;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
        #[serde(transparent)]
        #[sqlx(transparent)]
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

/// The primary key of a row in `core.dead_letter_groups`: one failure while it lasts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type,
)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct GroupId(pub i64);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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

impl Serialize for ConsumerName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

text_column!(
    ConsumerName,
    |s: &str| ConsumerName::new(s),
    ConsumerName::as_str
);

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
