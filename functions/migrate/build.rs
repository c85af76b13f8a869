//! Finds the workspace's consumers, so that adding one touches nothing here: every member of
//! the root `Cargo.toml`'s `[workspace] members` whose manifest has a
//! `[package.metadata.job-consumer]` table is one, in the order the members are listed (the
//! reference consumer first). For each it generates, into `$OUT_DIR/consumers.rs`, an entry of
//! `CONSUMERS` and its migrator, `sqlx::migrate!` over the consumer's own migrations directory
//! (so this crate depends on no consumer crate).
//!
//! The table (see `docs/consumers.md`):
//!
//! ```toml
//! [package.metadata.job-consumer]
//! name = "redeem-reward"     # the fence's consumer name (CONSUMER_NAME); never renamed
//! schema = "rewards"         # its tables' schema, and its migrations' tracking table's
//! # optional:
//! label = "redeem-reward"    # its name in the migration report (default: name)
//! migrations = "migrations"  # its migrations, relative to its manifest (default: migrations)
//! binary = "redeem-reward"   # its Lambda binary (default: the package name)
//! local-queue-suffix = "-redeem"           # the local stack's queue: <base><suffix> (default: -<name>)
//! local-env = { RETRY_MAX_ATTEMPTS = "3" } # what the local stack adds to its environment
//! dev-payload = { account_id = "dev", reward_sku = "MUG", cost_points = 5 }  # a valid payload,
//!                                          # what `bash scripts/dev.sh send` sends ("{job_id}"
//!                                          # in a string becomes each job's id)
//! dev-failing-payload = { account_id = "dev", reward_sku = "MUG", cost_points = -5 }  # one
//!                                          # the handler fails on (`send … failing`)
//! ```
//!
//! Invariant: a malformed table, two consumers with one name or one schema, a consumer taking
//! schema `core`, or a migrations directory that does not exist stops the build with the
//! manifest's path and the key.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

struct Found {
    package: String,
    name: String,
    label: String,
    schema: String,
    binary: String,
    local_queue_suffix: String,
    local_env: Vec<(String, String)>,
    /// `dev-payload` and `dev-failing-payload`, as JSON.
    dev_payload: Option<String>,
    dev_failing_payload: Option<String>,
    /// Relative to this crate's manifest directory, as `sqlx::migrate!` takes it.
    migrations: String,
}

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = here.join("../..");
    let root_manifest = root.join("Cargo.toml");
    println!("cargo:rerun-if-changed={}", root_manifest.display());
    let workspace = read_table(&root_manifest);
    let members = workspace
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .unwrap_or_else(|| fail(&root_manifest, "[workspace] members: missing"));
    let mut found = Vec::new();
    for member in members {
        let member = member
            .as_str()
            .unwrap_or_else(|| fail(&root_manifest, "[workspace] members: not a string"));
        for relative in expand(&root, member) {
            let manifest = root.join(&relative).join("Cargo.toml");
            println!("cargo:rerun-if-changed={}", manifest.display());
            if let Some(consumer) = consumer(&manifest, &relative) {
                println!(
                    "cargo:rerun-if-changed={}",
                    here.join(&consumer.migrations).display()
                );
                found.push(consumer);
            }
        }
    }
    check_unique(&found, &root_manifest);
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("consumers.rs");
    std::fs::write(&out, generate(&found)).expect("write consumers.rs");
}

/// The directories `member` names, relative to the root: itself, or each directory with a
/// manifest that a trailing `/*` matches.
fn expand(root: &Path, member: &str) -> Vec<String> {
    let member = member.trim_end_matches('/');
    let Some(parent) = member.strip_suffix("/*") else {
        return vec![member.to_owned()];
    };
    println!("cargo:rerun-if-changed={}", root.join(parent).display());
    let mut dirs: Vec<String> = std::fs::read_dir(root.join(parent))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().join("Cargo.toml").is_file())
                .map(|e| format!("{parent}/{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn read_table(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| fail(path, &format!("cannot be read: {e}")));
    text.parse()
        .unwrap_or_else(|e| fail(path, &format!("is not TOML: {e}")))
}

/// The consumer `manifest` (of the member at `relative`) declares, if any.
fn consumer(manifest: &Path, relative: &str) -> Option<Found> {
    let table = read_table(manifest);
    let package = table.get("package")?;
    let meta = package.get("metadata")?.get("job-consumer")?;
    let key = |k: &str| format!("[package.metadata.job-consumer] {k}");
    let text = |k: &str, default: Option<&str>| -> String {
        match meta.get(k) {
            Some(v) => v
                .as_str()
                .unwrap_or_else(|| fail(manifest, &format!("{}: not a string", key(k))))
                .to_owned(),
            None => default
                .unwrap_or_else(|| fail(manifest, &format!("{}: missing", key(k))))
                .to_owned(),
        }
    };
    let package_name = package
        .get("name")
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| fail(manifest, "[package] name: missing"))
        .to_owned();
    let name = text("name", None);
    let schema = text("schema", None);
    if schema == "core" || !is_identifier(&schema) {
        fail(
            manifest,
            &format!(
                "{}: {schema:?} is not a schema of its own (a-z, 0-9, _; not core)",
                key("schema")
            ),
        );
    }
    let migrations = text("migrations", Some("migrations"));
    let dir = manifest.parent().expect("a manifest's directory");
    if !dir.join(&migrations).is_dir() {
        fail(
            manifest,
            &format!(
                "{}: {} is not a directory",
                key("migrations"),
                dir.join(&migrations).display()
            ),
        );
    }
    let local_env = match meta.get("local-env") {
        None => Vec::new(),
        Some(v) => v
            .as_table()
            .unwrap_or_else(|| fail(manifest, &format!("{}: not a table", key("local-env"))))
            .iter()
            .map(|(k, v)| {
                let v = v.as_str().unwrap_or_else(|| {
                    fail(manifest, &format!("{}.{k}: not a string", key("local-env")))
                });
                (k.clone(), v.to_owned())
            })
            .collect(),
    };
    let payload = |k: &str| {
        meta.get(k).map(|v| {
            if !v.is_table() {
                fail(
                    manifest,
                    &format!("{}: not a table (the payload, as TOML)", key(k)),
                );
            }
            serde_json::to_string(v).expect("a TOML table is JSON")
        })
    };
    Some(Found {
        dev_payload: payload("dev-payload"),
        dev_failing_payload: payload("dev-failing-payload"),
        label: text("label", Some(&name)),
        binary: text("binary", Some(&package_name)),
        local_queue_suffix: text("local-queue-suffix", Some(&format!("-{name}"))),
        package: package_name,
        schema,
        local_env,
        migrations: format!("../../{relative}/{migrations}"),
        name,
    })
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

fn check_unique(found: &[Found], root_manifest: &Path) {
    let mut names = BTreeSet::new();
    let mut schemas = BTreeSet::new();
    for c in found {
        if !names.insert(&c.name) {
            fail(
                root_manifest,
                &format!("two consumers are named {:?}", c.name),
            );
        }
        if !schemas.insert(&c.schema) {
            fail(
                root_manifest,
                &format!("two consumers own schema {:?}", c.schema),
            );
        }
    }
}

fn generate(found: &[Found]) -> String {
    let mut out = String::from("// Generated by build.rs from the workspace's manifests.\n\n");
    out.push_str("/// The workspace's consumers, in the order its members are listed.\n");
    out.push_str("pub const CONSUMERS: &[ConsumerCrate] = &[\n");
    for c in found {
        let env: String = c
            .local_env
            .iter()
            .map(|(k, v)| format!("({k:?}, {v:?}), "))
            .collect();
        let _ = writeln!(
            out,
            "    ConsumerCrate {{ package: {:?}, name: {:?}, label: {:?}, schema: {:?}, binary: {:?}, \
             local_queue_suffix: {:?}, local_env: &[{env}], dev_payload: {:?}, \
             dev_failing_payload: {:?} }},",
            c.package,
            c.name,
            c.label,
            c.schema,
            c.binary,
            c.local_queue_suffix,
            c.dev_payload,
            c.dev_failing_payload
        );
    }
    out.push_str("];\n\n");
    let _ = writeln!(
        out,
        "/// Each consumer's migrations, as [`CONSUMERS`] lists them.\n\
         static MIGRATORS: [std::sync::LazyLock<sqlx::migrate::Migrator>; {}] = [",
        found.len()
    );
    for c in found {
        let _ = writeln!(
            out,
            "    std::sync::LazyLock::new(|| shared::own_migrations(sqlx::migrate!({:?}), {:?})),",
            c.migrations, c.schema
        );
    }
    out.push_str("];\n");
    out
}

fn fail(path: &Path, what: &str) -> ! {
    panic!("{}: {what}", path.display())
}
