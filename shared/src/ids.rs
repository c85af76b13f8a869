//! Newtypes for the identifiers that must never be mixed up: a job, a tenant, a dead letter, a
//! failure group, and the consumer name that keys the fence; and how an identifier a producer
//! sent is bounded before an indexed column (a fence's, a ledger's, a letter's) keeps it.

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

/// The most bytes a producer-controlled identifier (`correlation_id`, the message id, the
/// queue) keeps in a letter's indexed columns; the body keeps every value whole. A btree index
/// row holds at most 2,704 bytes, so an identifier as it came could make a letter unwritable.
pub const MAX_ID_BYTES: usize = 256;

/// An identifier as a letter's indexed column keeps it: at most [`MAX_ID_BYTES`], never blank,
/// no NUL. A longer one keeps its start and a digest of the whole, so two long ids that share
/// their start stay two ids (one letter per message).
pub(crate) fn bounded_id<'s>(id: &'s str, if_blank: &'static str) -> std::borrow::Cow<'s, str> {
    if id.trim().is_empty() {
        return if_blank.into();
    }
    if id.len() <= MAX_ID_BYTES && !id.contains('\0') {
        return id.into();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~sha256:{hex}", storable(id, MAX_ID_BYTES - 48)).into()
}

/// The longest `MessageGroupId` SQS takes.
pub const MAX_MESSAGE_GROUP_BYTES: usize = 128;

/// A FIFO message group as a letter keeps it, for its replay to send: only one SQS would take
/// (1 to 128 characters, ASCII letters, digits and punctuation). Anything else is not kept
/// (the replay then groups by the job's id), so no group can make a letter unwritable.
pub fn message_group(group: &str) -> Option<&str> {
    let fits = !group.is_empty()
        && group.len() <= MAX_MESSAGE_GROUP_BYTES
        && group.bytes().all(|b| b.is_ascii_graphic());
    fits.then_some(group)
}

/// A correlation id as a letter (and every log line of its job) keeps it: its first
/// [`MAX_ID_BYTES`] at a character boundary, NUL replaced. The body keeps it whole.
pub(crate) fn bounded_correlation_id(id: &str) -> std::borrow::Cow<'_, str> {
    storable(id, MAX_ID_BYTES)
}

/// `s` with NUL replaced by U+FFFD (PostgreSQL text cannot store NUL, and a letter must be
/// writable whatever the error or the message said), then cut to `max` bytes at a character
/// boundary (in that order: a replaced NUL takes three bytes).
pub(crate) fn storable(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match without_nul(s) {
        std::borrow::Cow::Borrowed(clean) => truncate(clean, max).into(),
        std::borrow::Cow::Owned(clean) => truncate(&clean, max).to_owned().into(),
    }
}

/// `s` with NUL replaced by U+FFFD.
pub(crate) fn without_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}").into()
    } else {
        s.into()
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names_are_validated() {
        assert!(ConsumerName::new("award-points.v1").is_ok());
        assert!(ConsumerName::new("").is_err());
        assert!(ConsumerName::new("Award Points").is_err());
        assert!(ConsumerName::new("x".repeat(129)).is_err());
    }

    #[test]
    fn a_bounded_id_stays_within_its_bound_whatever_it_holds() {
        let nuls = "\0".repeat(300);
        assert_eq!(
            bounded_correlation_id(&nuls).len(),
            MAX_ID_BYTES - MAX_ID_BYTES % 3
        );
        assert!(bounded_id(&nuls, "m").len() <= MAX_ID_BYTES);
        assert_eq!(bounded_id("   ", "blank"), "blank");
        let long = "é".repeat(1_000);
        let longer = format!("{long}x");
        let (a, b) = (bounded_id(&long, "m"), bounded_id(&longer, "m"));
        assert!(
            a.len() <= MAX_ID_BYTES && a != b,
            "two long ids stay two ids"
        );
    }

    #[test]
    fn a_message_group_is_kept_only_as_sqs_would_take_it_back() {
        assert_eq!(message_group("member-42"), Some("member-42"));
        assert_eq!(message_group(&"g".repeat(128)).map(str::len), Some(128));
        for refused in ["", " ", "a b", "é", "\0", "\u{1b}[2J", &"g".repeat(129)] {
            assert_eq!(message_group(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("short", 100), "short");
    }
}
