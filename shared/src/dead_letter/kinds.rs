//! The words a letter is filed under: why it was written, where its review stands, what its
//! replay did, whether its group is open. Each is stored (or spelled in the API) as its
//! `snake_case` name, derived once for the column, the JSON, `Display` and parsing alike.

use serde::{Deserialize, Serialize};
use strum::{Display, EnumString, IntoStaticStr, VariantArray};

/// Why a job ended up as a dead letter.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumString,
    Display,
    VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorKind {
    /// The message can never be parsed or is meaningless; no retry was made.
    Poison,
    /// The handler reported a failure that can never succeed.
    Permanent,
    /// Every attempt failed transiently.
    Exhausted,
    /// Attempts ended without an outcome (timeout, crash, out of memory).
    Crashed,
    /// A copy arrived too late to settle through the fence (older than the fence's TTL less
    /// its margin, by its own send time): whether the job committed cannot be known, so the
    /// letter is not replayable. Check the effect by hand, then discard it with a reason.
    Unsettled,
    /// A copy of a processed job whose payload differs from the committed one's (by the
    /// digest its fence keeps): another job under a reused id, a producer's bug. It never ran;
    /// the letter keeps it whole. No retry.
    Conflict,
}

/// Where a dead letter stands in its review.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumString,
    Display,
    VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ReviewStatus {
    /// Waiting for an operator.
    PendingReview,
    /// Republished to its queue.
    Replayed,
    /// Closed with a reason.
    Discarded,
}

/// What a replay did, as the letter records it (`replay_outcome`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, EnumString, Display, VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ReplayOutcome {
    /// Recorded; the message is to be sent (by the replay itself, else by the scheduled run).
    Queued,
    /// The queue accepted the message.
    Sent,
    /// The job's fence existed: its effect has committed, so nothing was sent.
    AlreadyProcessed,
    /// Queued, then withdrawn by an operator before any queue accepted it: its job went back to
    /// review as a new pending letter linked to this one.
    Withdrawn,
}

/// Whether a group still has letters pending review (as the API spells it).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr, EnumString, Display, VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum GroupStatus {
    /// Some of its letters are pending review.
    Open,
    /// Every letter has been reviewed.
    Resolved,
}

/// `ALL`, `as_str` and `parse` for a text enum, from its derived strings; and, with a noun, its
/// `text` column (a value the enum refuses is a decode error naming the noun).
macro_rules! text_enum {
    ($ty:ident $(, $noun:literal)?) => {
        impl $ty {
            /// Every value, in the declared (the schema's) order.
            pub const ALL: &'static [$ty] = <$ty as ::strum::VariantArray>::VARIANTS;

            /// The value as stored and spelled.
            pub fn as_str(self) -> &'static str {
                self.into()
            }

            /// The value spelled `s` (exactly), if it is one.
            pub fn parse(s: &str) -> Option<Self> {
                s.parse().ok()
            }
        }
        $(crate::ids::text_column!(
            $ty,
            |s: &str| $ty::parse(s).ok_or_else(|| format!(concat!("unknown ", $noun, " {:?}"), s)),
            |k: &$ty| k.as_str()
        );)?
    };
}

pub(crate) use text_enum;

text_enum!(ErrorKind, "error kind");
text_enum!(ReviewStatus, "review status");
text_enum!(ReplayOutcome, "replay outcome");
text_enum!(GroupStatus);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_match_the_schema_check() {
        let names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "poison",
                "permanent",
                "exhausted",
                "crashed",
                "unsettled",
                "conflict"
            ]
        );
        assert_eq!(ErrorKind::Unsettled.to_string(), "unsettled");
    }

    #[test]
    fn statuses_match_the_schema_check() {
        let names: Vec<_> = ReviewStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["pending_review", "replayed", "discarded"]);
        assert_eq!(
            ReviewStatus::parse("replayed"),
            Some(ReviewStatus::Replayed)
        );
        assert_eq!(ReviewStatus::parse("Replayed"), None);
        assert_eq!(ReviewStatus::PendingReview.to_string(), "pending_review");
    }

    #[test]
    fn outcomes_and_group_statuses_are_spelled_as_stored() {
        let outcomes: Vec<_> = ReplayOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            outcomes,
            ["queued", "sent", "already_processed", "withdrawn"]
        );
        let groups: Vec<_> = GroupStatus::ALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(groups, ["open", "resolved"]);
        assert_eq!(GroupStatus::parse("resolved"), Some(GroupStatus::Resolved));
        assert_eq!(GroupStatus::parse("all"), None);
    }
}
