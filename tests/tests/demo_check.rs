//! The README's main job, as a new user runs it: the demo binary with `--check` exits 0 only
//! when every outcome of the workload is the expected one.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The demo runs every consumer but the reference one on its own binary, which `cargo test`
/// does not build (`scripts/demo.sh` runs `cargo build --bins`): built here the way
/// `deployed_consumer.rs` and SAM build them, at the workspace root, beside the demo.
fn build_the_consumers_own_binaries() {
    let mut build = e2e::cargo();
    build
        .args(["build", "--quiet"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for consumer in migrate::consumers::CONSUMERS {
        build.args(["--bin", consumer.binary]);
    }
    let output = build.output().expect("cargo build");
    assert!(
        output.status.success(),
        "building the consumers' binaries failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The database starts empty: the demo migrates it as a deploy does (core, then each consumer).
#[sqlx::test(migrations = false)]
async fn the_demo_workload_produces_the_expected_outcomes(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    build_the_consumers_own_binaries();
    let url = e2e::test_database_url(&connect);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--check")
        .env("DATABASE_URL", url)
        .env(
            "DEMO_QUEUE_NAME",
            format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        )
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo --check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("DeadLetteredCrashed"), "{stdout}");
    assert!(stdout.contains("redeem-reward/Processed"), "{stdout}");
}
