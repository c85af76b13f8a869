//! Exit statuses, for scripts.

/// Done: every letter selected reviewed (or nothing to do, a dry run, a command that only reads,
/// an operation started with `--detach`).
pub const OK: u8 = 0;
/// A bulk operation ended with letters still pending review: some it could not take (not
/// replayable, not sendable), or it was cancelled before the end.
pub const SOME_FAILED: u8 = 1;
/// Bad usage, configuration or an API refusal before anything changed.
pub const USAGE: u8 = 2;
/// Declined at the confirmation prompt: nothing changed.
pub const DECLINED: u8 = 3;
/// Interrupted (Ctrl-C) while following a bulk operation: it goes on server-side.
pub const INTERRUPTED: u8 = 130;
