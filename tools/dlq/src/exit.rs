//! Exit statuses, for scripts.

/// Done: every letter done (or nothing to do).
pub const OK: u8 = 0;
/// Some letters failed (they are still pending review).
pub const SOME_FAILED: u8 = 1;
/// Bad usage, configuration or an API refusal before anything changed.
pub const USAGE: u8 = 2;
/// Declined at the confirmation prompt: nothing changed.
pub const DECLINED: u8 = 3;
/// Interrupted (Ctrl-C): what was done is done, the rest untouched.
pub const INTERRUPTED: u8 = 130;
