//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! migrations directory at build time, and on stable Rust cargo cannot see that it read it (a new
//! migration file otherwise leaves a stale migrator in every binary built since).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
