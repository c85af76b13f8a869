//! What deploys is what is tested (issue 22, item 4). The functions are built the way SAM's
//! `rust-cargolambda` builder and `scripts/build-lambdas.sh` build them: every `Binary` of
//! `template.yaml` in one `cargo build --bin …` at the workspace ROOT, where Cargo unifies
//! features over every default member, this test crate included. Nothing a test crate turns on
//! may reach a crate that deploys, and the consumer built so cannot be asked to fail or to crash
//! its own process: a message that asks is poison.
//!
//! The build uses the dev profile (the one the tests are built with, so it reuses their
//! artifacts): features are resolved the same way in every profile, and `--release` is what
//! `scripts/build-lambdas.sh` adds.

use consumer::count_awards;
use e2e::stack::{Stack, StackSpec};
use serde_json::{Value, json};
use shared::dead_letter::letters_for_job;
use shared::ids::{ConsumerName, JobId, TenantId};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root")
}

/// Every `BuildProperties: Binary:` of the template's `rust-cargolambda` functions, those of
/// each consumer's nested template (`templates/consumer.yaml`) included: there a consumer's
/// `Binary` is its stanza's parameter.
fn template_binaries() -> BTreeSet<String> {
    let read = |path: &str| -> Value {
        let text = std::fs::read_to_string(workspace_root().join(path)).unwrap();
        serde_norway::from_str(&text).expect("a template is YAML")
    };
    let template = read("template.yaml");
    let mut binaries = BTreeSet::new();
    let mut add = |t: &Value, stanza: Option<&Value>| {
        for f in t["Resources"].as_object().expect("Resources").values() {
            if f["Type"] != "AWS::Serverless::Function" {
                continue;
            }
            assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{f:#?}");
            let binary = &f["Metadata"]["BuildProperties"]["Binary"];
            let binary = match (binary["Ref"].as_str(), stanza) {
                (Some(parameter), Some(stanza)) => &stanza["Properties"]["Parameters"][parameter],
                _ => binary,
            };
            binaries.insert(
                binary
                    .as_str()
                    .expect("every function names its Binary")
                    .to_owned(),
            );
        }
    };
    add(&template, None);
    for r in template["Resources"].as_object().unwrap().values() {
        if r["Type"] == "AWS::Serverless::Application" {
            let location = r["Properties"]["Location"]
                .as_str()
                .expect("a local template");
            add(&read(location), Some(r));
        }
    }
    assert!(!binaries.is_empty(), "the template has functions");
    binaries
}

/// One workspace package compiled into the deployed binaries, with the features it was built with.
#[derive(Debug)]
struct Built {
    package: String,
    features: BTreeSet<String>,
    /// What the package's own `default` feature turns on (and `default` itself).
    default_features: BTreeSet<String>,
}

struct AsDeployed {
    executables: BTreeMap<String, PathBuf>,
    ours: Vec<Built>,
    took: Duration,
}

/// The workspace's packages by id: name and features table.
fn workspace_packages() -> BTreeMap<String, (String, BTreeMap<String, Vec<String>>)> {
    let output = e2e::cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    assert!(output.status.success(), "cargo metadata failed");
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let features = serde_json::from_value(p["features"].clone()).unwrap();
            (
                p["id"].as_str().unwrap().to_owned(),
                (p["name"].as_str().unwrap().to_owned(), features),
            )
        })
        .collect()
}

/// `default` and every feature of the same package it turns on, transitively.
fn default_closure(features: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let mut on = BTreeSet::from(["default".to_owned()]);
    let mut todo = vec!["default".to_owned()];
    while let Some(feature) = todo.pop() {
        for implied in features.get(&feature).into_iter().flatten() {
            if features.contains_key(implied) && on.insert(implied.clone()) {
                todo.push(implied.clone());
            }
        }
    }
    on
}

/// `cargo build --bin <each template Binary>` at the workspace root, once per test run.
static AS_DEPLOYED: LazyLock<AsDeployed> = LazyLock::new(|| {
    let binaries = template_binaries();
    let packages = workspace_packages();
    let started = Instant::now();
    let mut build = e2e::cargo();
    build
        .arg("build")
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_root());
    for binary in &binaries {
        build.args(["--bin", binary]);
    }
    let output = build.output().expect("cargo build");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "cargo build at the workspace root failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut executables = BTreeMap::new();
    let mut ours = BTreeMap::new();
    for message in String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
    {
        if let Some(exe) = message["executable"].as_str() {
            executables.insert(
                message["target"]["name"].as_str().unwrap().to_owned(),
                PathBuf::from(exe),
            );
        }
        let id = message["package_id"].as_str().unwrap();
        if let Some((name, table)) = packages.get(id) {
            let features: BTreeSet<String> =
                serde_json::from_value(message["features"].clone()).unwrap();
            ours.entry(id.to_owned()).or_insert(Built {
                package: name.clone(),
                features,
                default_features: default_closure(table),
            });
        }
    }
    for binary in &binaries {
        assert!(executables.contains_key(binary), "{binary} was not built");
    }
    eprintln!(
        "built {} binaries as deployed in {:.1} s",
        binaries.len(),
        took.as_secs_f64()
    );
    AsDeployed {
        executables,
        ours: ours.into_values().collect(),
        took,
    }
});

/// Every crate of ours in the deployed binaries is built with its default features only: no
/// feature a test crate (or any other member) asks for reaches what deploys. `cargo tree` at the
/// root (what `cargo lambda build` resolves) agrees.
#[test]
fn the_templates_binaries_built_at_the_workspace_root_carry_no_feature_of_ours_beyond_default() {
    let built = &*AS_DEPLOYED;
    assert!(
        built.ours.iter().any(|b| b.package == "shared")
            && built.ours.iter().any(|b| b.package == "consumer"),
        "the deployed binaries link shared and consumer: {:?}",
        built.ours
    );
    let leaks: Vec<String> = built
        .ours
        .iter()
        .filter(|b| !b.features.is_subset(&b.default_features))
        .map(|b| {
            format!(
                "{} with {:?}",
                b.package,
                b.features
                    .difference(&b.default_features)
                    .collect::<Vec<_>>()
            )
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "crates that deploy are built with features a workspace member turns on: {leaks:?}"
    );

    let packages = workspace_packages();
    let ours: BTreeMap<&str, BTreeSet<String>> = packages
        .values()
        .map(|(name, table)| (name.as_str(), default_closure(table)))
        .collect();
    let tree = e2e::cargo()
        .args(["tree", "-e", "normal,build,features", "--prefix", "none"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo tree");
    assert!(tree.status.success(), "cargo tree failed");
    let tree_leaks: BTreeSet<String> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter_map(|line| {
            let (package, rest) = line.split_once(" feature \"")?;
            let feature = rest.split('"').next()?;
            let package = package.split(' ').next()?;
            let defaults = ours.get(package)?;
            (!defaults.contains(feature)).then(|| format!("{package}/{feature}"))
        })
        .collect();
    assert!(
        tree_leaks.is_empty(),
        "cargo tree at the root turns on features of our crates: {tree_leaks:?}"
    );
    eprintln!(
        "the build as deployed took {:.1} s",
        built.took.as_secs_f64()
    );
}

/// The consumer binary built as deployed, on the local stack in batch mode (as its template
/// stanza runs it): a message asking it to crash, one asking for a permanent failure and a good
/// award in one batch. The good award is applied once, each fault request is a `poison` letter
/// on its first delivery, and the process never exits.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_consumer_built_as_deployed_treats_fault_requests_as_poison_and_survives(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let binary = AS_DEPLOYED.executables["consumer"].clone();
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let mut spec = StackSpec::time_scaled(
        e2e::test_binaries!(),
        &e2e::test_database_url(&connect),
        &format!("deployed-{}", &Uuid::new_v4().simple().to_string()[..12]),
    );
    spec.binaries.consumer = binary;
    spec.consumer_env
        .push(("COMMIT_MODE".into(), "batch".into()));
    let stack = Stack::start(spec).await;
    let consumer = ConsumerName::new("award-points").unwrap();
    let job = |payload: Value| {
        let job_id = JobId(Uuid::new_v4());
        let body = json!({"job_id": job_id, "tenant_id": TenantId(Uuid::new_v4()),
            "correlation_id": "attack", "payload": payload});
        (job_id, body.to_string())
    };
    let faults = [
        job(json!({"account_id": "a", "points": 5, "demo_fault": "crash_before_commit"})),
        job(json!({"account_id": "a", "points": 5, "demo_fault": "permanent"})),
    ];
    let good = job(json!({"account_id": "a", "points": 5}));
    for (_, body) in faults.iter().chain([&good]) {
        stack.send(body).await;
    }
    let polls = stack
        .run_until(Duration::from_secs(60), || async {
            let mut settled = count_awards(&pool, good.0).await.unwrap() == 1;
            for (job_id, _) in &faults {
                settled &= !letters_for_job(&pool, *job_id, &consumer)
                    .await
                    .unwrap()
                    .is_empty();
            }
            settled
        })
        .await;
    assert!(
        polls.iter().all(|(_, p)| p.invoke_error.is_none()),
        "the process never crashed: {polls:?}"
    );
    assert_eq!(
        stack.consumer.starts(),
        1,
        "one process served every delivery"
    );
    for (job_id, _) in &faults {
        let letters = letters_for_job(&pool, *job_id, &consumer).await.unwrap();
        assert_eq!(
            (
                letters.len(),
                letters[0].error_kind.as_str(),
                letters[0].attempts
            ),
            (1, "poison", 1),
            "{letters:#?}"
        );
        assert!(
            letters[0].last_error.contains("demo_fault"),
            "{}",
            letters[0].last_error
        );
        assert_eq!(count_awards(&pool, *job_id).await.unwrap(), 0);
    }
    assert_eq!(count_awards(&pool, good.0).await.unwrap(), 1);
}
