//! Replaying or discarding many letters at once, safely.
//!
//! Invariants: the set is pinned before anything changes (letters pending review written before
//! one instant, `--before`), so letters written while the run goes (a replay that fails again
//! included) are never picked up; a letter is changed only through the API's one-letter routes,
//! one at a time at a bounded rate, so an interrupted run leaves every letter either done or
//! untouched, and running the same command again (same `--before`) finishes the rest without
//! touching what is done. A dry run only reads.

mod action;
mod apply;
mod plan;
mod run;
mod select;
mod summary;

pub use action::Action;
pub use run::run;
pub use select::{Selection, select};
pub use summary::{Ending, Summary};
