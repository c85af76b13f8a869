//! What a bulk command does to each letter.

/// What a bulk command does to each letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Replay (republish with the same job id).
    Replay,
    /// Discard with a reason.
    Discard,
}

impl Action {
    /// The verb, as the API spells the operation's action and its scope.
    pub fn verb(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Discard => "discard",
        }
    }
}
