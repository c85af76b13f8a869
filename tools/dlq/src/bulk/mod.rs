//! Replaying or discarding many letters at once: one bulk operation, worked server-side.
//!
//! Invariants: a bulk command changes letters only by starting one operation on the API
//! (`/v1/core/dead-letter-operations`), which the scheduled function works in chunks, each
//! chunk's reviews and the operation's progress committed together, with every guarantee of a
//! one-letter review (same job id, the fence, the audit); the tool only plans, starts, follows
//! and cancels. The operation takes the letters pending review written before it started, so
//! letters written while it runs (a replay that fails again included) are never picked up. A
//! dry run only reads. Following is only reading: Ctrl-C (or `--detach`) leaves the operation
//! running, and says how to follow or stop it.

mod action;
mod follow;
mod plan;
mod run;
mod summary;

pub use action::Action;
pub use follow::{Followed, Interrupt, Meter, POLL, follow};
pub use run::run;
pub use summary::{
    counts, exit_status, print_ended, print_interrupted, print_operation, selection_flags,
};
