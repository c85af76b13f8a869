//! The workspace's consumers, found by `build.rs` from each member's
//! `[package.metadata.job-consumer]` table: whose migrations a deploy applies after the core
//! schema's, and what the local stack and the demo run. Adding a consumer crate (and its
//! workspace member line) adds it here; nothing in this crate names one.
//!
//! Invariant: [`CONSUMERS`] is in the order the root `Cargo.toml` lists its members, so the
//! migrations of the consumers already deployed keep their order when one is added.

/// A consumer crate of the workspace, as its manifest declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerCrate {
    /// The Cargo package (`cargo build -p <package>`).
    pub package: &'static str,
    /// The fence's consumer name (`CONSUMER_NAME`).
    pub name: &'static str,
    /// Its name in the migration report.
    pub label: &'static str,
    /// The schema of its tables and of its migrations' tracking table.
    pub schema: &'static str,
    /// Its Lambda binary (the template's `Binary`).
    pub binary: &'static str,
    /// The local stack's job queue for it is the base name followed by this.
    pub local_queue_suffix: &'static str,
    /// What the local stack adds to its environment (its own retry policy, …).
    pub local_env: &'static [(&'static str, &'static str)],
    /// A valid payload, as JSON (`dev-payload`): what the dev loop sends.
    pub dev_payload: Option<&'static str>,
    /// A payload its handler fails on, as JSON (`dev-failing-payload`).
    pub dev_failing_payload: Option<&'static str>,
}

include!(concat!(env!("OUT_DIR"), "/consumers.rs"));

impl ConsumerCrate {
    /// Its migrations (schema [`ConsumerCrate::schema`], tracked in its own table).
    pub fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        let at = CONSUMERS
            .iter()
            .position(|c| c == self)
            .expect("a consumer of CONSUMERS");
        &MIGRATORS[at]
    }
}

/// The consumer fencing under `name`, if the workspace has it.
pub fn by_name(name: &str) -> Option<&'static ConsumerCrate> {
    CONSUMERS.iter().find(|c| c.name == name)
}
