//! The consumer guide is copy-paste complete (issue 23): `docs/consumers.md`'s file blocks
//! (```` ```<lang> file=<path> ````), written as they are into a scratch workspace beside this
//! one's own crates (the root manifest's dependencies, its lock file, its target directory),
//! make a crate that builds and whose tests pass: `cargo test -p <the guide's crate>`, so the
//! guide cannot drift from the library. Every other ```` ```rust ```` block says `ignore`: a
//! fragment of a file shown whole elsewhere.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root")
}

/// A fenced block of the guide.
#[derive(Debug)]
struct Block {
    /// The info string's first word (`rust`, `toml`, …).
    lang: String,
    /// `file=<path>`: the file it is, relative to the workspace root.
    file: Option<String>,
    /// `ignore`: a fragment, not compiled.
    ignore: bool,
    text: String,
    line: usize,
}

fn guide() -> String {
    std::fs::read_to_string(workspace_root().join("docs/consumers.md")).expect("docs/consumers.md")
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                let lang = words.next().unwrap_or_default().to_owned();
                let rest: Vec<&str> = words.collect();
                open = Some(Block {
                    lang,
                    file: rest
                        .iter()
                        .find_map(|w| w.strip_prefix("file="))
                        .map(str::to_owned),
                    ignore: rest.contains(&"ignore"),
                    text: String::new(),
                    line: n + 1,
                });
            }
            (Some(_), Some("")) => blocks.push(open.take().expect("open")),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(
        open.is_none(),
        "a block of the guide is not closed: {open:?}"
    );
    blocks
}

/// The guide's crate: the directory of its `Cargo.toml` block, and the package's name.
fn guide_crate(blocks: &[Block]) -> (String, String) {
    let manifest = blocks
        .iter()
        .find(|b| {
            b.file
                .as_deref()
                .is_some_and(|f| f.ends_with("/Cargo.toml"))
        })
        .expect("the guide shows its crate's Cargo.toml as a file block");
    let path = manifest.file.as_deref().unwrap();
    let table: toml::Table = manifest
        .text
        .parse()
        .expect("the guide's Cargo.toml is TOML");
    let name = table["package"]["name"].as_str().expect("[package] name");
    (
        path.trim_end_matches("/Cargo.toml").to_owned(),
        name.to_owned(),
    )
}

#[test]
fn every_rust_block_of_the_guide_is_a_file_it_builds_or_marked_as_a_fragment() {
    let blocks = blocks(&guide());
    let loose: Vec<usize> = blocks
        .iter()
        .filter(|b| b.lang == "rust" && b.file.is_none() && !b.ignore)
        .map(|b| b.line)
        .collect();
    assert!(
        loose.is_empty(),
        "```rust blocks at lines {loose:?} of docs/consumers.md are neither a file \
         (file=<path>) nor a fragment (ignore)"
    );
    let files: Vec<&str> = blocks.iter().filter_map(|b| b.file.as_deref()).collect();
    for wanted in [
        "Cargo.toml",
        "src/lib.rs",
        "src/main.rs",
        "tests/",
        "migrations/",
    ] {
        assert!(
            files.iter().any(|f| f.contains(wanted)),
            "the guide shows no {wanted} of its crate: {files:?}"
        );
    }
}

/// What the guide says to add outside the crate: the template block and nothing else (no
/// workspace member line: the members take every crate under functions/); and the metadata that
/// makes it found.
#[test]
fn the_guide_needs_no_member_line_and_gives_the_metadata_and_the_template_block() {
    let text = guide();
    let blocks = blocks(&text);
    let (dir, _) = guide_crate(&blocks);
    // No member line to add: the root's members take every crate under functions/.
    let root: toml::Table = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let parent = dir.rsplit_once('/').map_or("", |(parent, _)| parent);
    assert!(
        root["workspace"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str() == Some(&format!("{parent}/*"))),
        "the workspace's members take {dir} without a line of its own"
    );
    let manifest = blocks
        .iter()
        .find(|b| b.file.as_deref() == Some(&format!("{dir}/Cargo.toml")))
        .unwrap();
    let table: toml::Table = manifest.text.parse().unwrap();
    let meta = &table["package"]["metadata"]["job-consumer"];
    assert!(meta["name"].is_str() && meta["schema"].is_str(), "{meta:?}");
    let (_, package) = guide_crate(&blocks);
    let stanza = blocks
        .iter()
        .find(|b| b.lang == "yaml")
        .expect("the guide shows the template block");
    assert!(
        stanza.text.lines().count() < 25,
        "the block is short:\n{}",
        stanza.text
    );
    assert!(
        stanza.text.contains("<<: *consumer-parameters"),
        "the block takes the harness's settings"
    );
    // The block without the merge (its anchor is in template.yaml), as YAML.
    let own: String = stanza
        .text
        .lines()
        .filter(|l| !l.contains("<<: *consumer-parameters"))
        .map(|l| format!("{l}\n"))
        .collect();
    let own: serde_norway::Value = serde_norway::from_str(&own).unwrap();
    let (_, resource) = own.as_mapping().unwrap().iter().next().unwrap();
    assert_eq!(resource["Type"], "AWS::Serverless::Application");
    assert_eq!(
        resource["Properties"]["Location"],
        "templates/consumer.yaml"
    );
    let parameters = &resource["Properties"]["Parameters"];
    assert_eq!(parameters["ConsumerName"].as_str(), meta["name"].as_str());
    assert_eq!(parameters["Binary"].as_str(), Some(package.as_str()));
    // Every parameter it gives is one the nested template takes.
    let nested: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(workspace_root().join("templates/consumer.yaml")).unwrap(),
    )
    .unwrap();
    for (name, _) in parameters.as_mapping().unwrap() {
        assert!(
            nested["Parameters"].get(name).is_some(),
            "templates/consumer.yaml takes {name:?}"
        );
    }
}

/// The scratch workspace's root manifest: this workspace's, with the guide's crate as its only
/// member and every path dependency pointing back here.
fn scratch_manifest(root: &Path, member: &str) -> String {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut table: toml::Table = text.parse().unwrap();
    let workspace = table["workspace"].as_table_mut().unwrap();
    workspace.insert("members".into(), toml::Value::Array(vec![member.into()]));
    workspace.remove("default-members");
    workspace.remove("exclude");
    let deps = workspace["dependencies"].as_table_mut().unwrap();
    for (_, dep) in deps.iter_mut() {
        if let Some(path) = dep.as_table_mut().and_then(|d| d.get_mut("path")) {
            *path = root
                .join(path.as_str().unwrap())
                .display()
                .to_string()
                .into();
        }
    }
    toml::to_string(&table).unwrap()
}

/// The guide's crate, from its blocks alone, builds and passes its own tests (on the test kit,
/// against PostgreSQL: `DATABASE_URL`).
#[test]
fn the_guides_consumer_copied_as_written_builds_and_its_tests_pass() {
    let root = workspace_root();
    let blocks = blocks(&guide());
    let (dir, package) = guide_crate(&blocks);
    let scratch = std::env::temp_dir().join(format!(
        "consumers-guide-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("Cargo.toml"), scratch_manifest(&root, &dir)).unwrap();
    std::fs::copy(root.join("Cargo.lock"), scratch.join("Cargo.lock")).unwrap();
    for block in blocks.iter().filter(|b| b.file.is_some()) {
        let path = scratch.join(block.file.as_deref().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &block.text).unwrap();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let output = e2e::cargo()
        .args(["test", "--offline", "--quiet", "-p", &package])
        .current_dir(&scratch)
        .env("CARGO_TARGET_DIR", &target)
        // The scratch workspace is outside this checkout, so its `.cargo/config.toml` does not
        // apply: the library's checked queries read the committed query data, as they do here.
        .env("SQLX_OFFLINE", "true")
        .env("SQLX_OFFLINE_DIR", root.join(".sqlx"))
        .output()
        .expect("cargo test");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        output.status.success(),
        "the guide's crate, copied as written into {}, does not build or its tests fail:\n{}\n{}",
        scratch.display(),
        tail(&stdout),
        tail(&stderr)
    );
    assert!(
        stdout.contains("test result: ok. 3 passed"),
        "the guide's three tests ran:\n{}",
        tail(&stdout)
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
