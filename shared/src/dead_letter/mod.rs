//! The dead-letter vocabulary: `core.dead_letters` (every failure, with its payload), its review,
//! and `core.dead_letter_groups` (the failures an operator triages), each with its SQL.
//!
//! - `kinds`: why a letter was written ([`ErrorKind`]), where its review stands
//!   ([`ReviewStatus`]), what its replay did ([`ReplayOutcome`]), whether its group is open
//!   ([`GroupStatus`]);
//! - `letter`: a letter as written ([`NewDeadLetter`]) and as read back ([`DeadLetter`]), and
//!   the reads of whole letters;
//! - `record`: writing one, settled through the fence ([`record_unless_processed`]);
//! - `review`: listing letters ([`list_letters`]), and the one transition the table allows
//!   ([`lock_letter`], [`LockedLetter::mark`]);
//! - `groups`: failure groups ([`Group`]) and the delivery of their incidents ([`claim_due`]).
//!
//! Invariants: a letter is a true record. [`record_unless_processed`] settles through the fence,
//! in the letter's own transaction, that the job's effect did not commit (a copy still inside
//! its transaction is waited for, not missed), so a committed job gets no letter. One letter per
//! (consumer, SQS message id): a redelivery of a message whose letter is already written (the
//! ack was lost) finds it instead of writing a second one. The table is append-only; the
//! database rejects anything but the review transition, and puts every letter in one group.

mod bulk;
mod groups;
mod intake;
mod kinds;
mod letter;
mod letter_list;
mod list;
mod record;
mod review;
mod settle;

pub use bulk::{
    Chunk, ChunkDone, ChunkLetter, count_by_kind, discard_chunk, lock_chunk, mark_replayed,
};
pub(crate) use groups::{COLUMNS, GroupRow};
pub use groups::{
    Group, GroupFilter, GroupPosition, Incident, group, group_of_letter, groups_of_failed_replays,
    list_groups,
};
pub use intake::{
    IntakeSeq, Receipt, Received, Round, SETTLE_DUE, SETTLE_ROUND, SETTLE_ROUNDS, Settling,
    consumers_with_received, oldest_received, receipt_of, receive_and_settle, receive_letters,
    receiving_statement, settle_behind, settle_received, settle_round, take_settle_lock,
};
pub(crate) use kinds::text_enum;
pub use kinds::{ErrorKind, GroupStatus, ReplayOutcome, ReviewStatus};
pub use letter::{
    DeadLetter, LetterHead, NewDeadLetter, letter, letter_for_message, letters_for_job, replays_of,
};
pub(crate) use letter::{MAX_ERROR_BYTES, storable_error};
pub use letter_list::{LetterSummary, ListFilter, Position, id_prefix_range, list_letters};
pub use record::{Recorded, record_dead_letter};
pub use review::{
    LockedLetter, Verdict, Withdrawal, fence_is_another_job, is_lock_timeout, letter_fence_exists,
    lock_letter, queued_replays, record_replay_sent, record_replays_sent, withdraw_replay,
};
pub(crate) use settle::{CONFLICT_ERROR, conflict_error, record_without_settling};
pub use settle::{Settled, record_all_unless_processed, record_unless_processed};

/// The most bytes an identifier keeps in a letter's indexed columns.
pub use crate::ids::MAX_ID_BYTES;

/// The message attribute a replay sets to the id of the dead letter it republishes; a letter
/// written for such a message links back to it (`replay_of`).
pub const REPLAY_OF_ATTRIBUTE: &str = "replay_of";
