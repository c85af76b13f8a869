//! Every doc names only what exists (issue 35). `README.md` and every `docs/*.md` are read, and
//! each name a doc gives in backticks is looked up in the repository:
//!
//! - a file name (`scripts/test.sh`, `paging/mod.rs`, `Cargo.toml`: path characters only, ending
//!   in `.rs`, `.sh`, `.sql`, `.yaml`, `.toml` or `.md`) or a directory (`shared/src/fence/`:
//!   path characters only, ending in `/`) must be a file (a directory) of the repository whose
//!   path ends with it (target/, .git/, .tools/ and node_modules/ are not the repository). A
//!   name starting with `./` or `../` is a relative link, resolved from the doc's own directory
//!   (one that leaves the repository, such as the team's spec beside the checkout, is not its).
//!   The consumer guide's `file=<path>` blocks are files the guide has its reader write: that
//!   doc may name them. File names in a plain fenced block (no info string: the file maps) are
//!   checked the same way, word by word;
//! - a Rust path starting with `shared::`, `dead_letter_api::`, `dlq::` or `e2e::` (brace groups
//!   expanded) must name, segment by segment, a `mod`, `fn`, `struct`, `enum` (or one of its
//!   variants), `trait`, `type`, `const`, `static`, `macro_rules!` or `pub use` name of that
//!   crate's sources (`shared/src`, `functions/dead-letter-api/src`, `tools/dlq/src`,
//!   `tests/src`);
//! - a test name (`[a-z0-9_]` only, at least four underscores) must be a `fn` of the
//!   repository's Rust sources, or a schema object a migration creates (the docs name indexes
//!   such as `dead_letters_pending_job_idx` the same way).
//!
//! `the_rules_catch_what_does_not_exist` runs the same rules over a made-up doc, so a rule that
//! stops catching anything fails too.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root")
}

/// Directories that are not the repository's own files.
const SKIPPED: [&str; 4] = ["target", ".git", ".tools", "node_modules"];

/// What a file name ends with to be checked as one.
const EXTENSIONS: [&str; 6] = [".rs", ".sh", ".sql", ".yaml", ".toml", ".md"];

/// The crates a doc's Rust paths start with, and where each one's sources are.
const CRATES: [(&str, &str); 4] = [
    ("shared", "shared/src/"),
    ("dead_letter_api", "functions/dead-letter-api/src/"),
    ("dlq", "tools/dlq/src/"),
    ("e2e", "tests/src/"),
];

/// The repository as the rules see it.
struct Repo {
    root: PathBuf,
    /// Every file's path from the root, `/`-separated.
    files: Vec<String>,
    /// Every directory's path from the root, `/`-separated, ending in `/`.
    dirs: Vec<String>,
    /// Per crate of [`CRATES`], the names its sources define or re-export.
    names: Vec<HashSet<String>>,
    /// Every `fn` name in the repository's Rust sources.
    fns: HashSet<String>,
    /// Every schema object a `.sql` file creates.
    schema: HashSet<String>,
}

impl Repo {
    fn read(root: &Path) -> Repo {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        walk(root, "", &mut files, &mut dirs);
        let mut names = vec![HashSet::new(); CRATES.len()];
        let mut fns = HashSet::new();
        let mut schema = HashSet::new();
        for file in &files {
            if file.ends_with(".rs") {
                let src = std::fs::read_to_string(root.join(file)).expect("a Rust source");
                let defined = rust_names(&src);
                fns.extend(defined.fns.iter().cloned());
                for (i, (_, dir)) in CRATES.iter().enumerate() {
                    if file.starts_with(dir) {
                        names[i].extend(defined.all.iter().cloned());
                    }
                }
            } else if file.ends_with(".sql") {
                let sql = std::fs::read_to_string(root.join(file)).expect("an SQL file");
                schema.extend(sql_names(&sql));
            }
        }
        Repo {
            root: root.to_owned(),
            files,
            dirs,
            names,
            fns,
            schema,
        }
    }
}

fn walk(root: &Path, rel: &str, files: &mut Vec<String>, dirs: &mut Vec<String>) {
    let entries = std::fs::read_dir(root.join(rel)).expect("a directory of the repository");
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{rel}{name}");
        let kind = entry.file_type().expect("a file type");
        if kind.is_dir() {
            if !SKIPPED.contains(&name.as_str()) {
                dirs.push(format!("{path}/"));
                walk(root, &format!("{path}/"), files, dirs);
            }
        } else {
            files.push(path);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What Rust and SQL sources define.

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Punct(char),
}

/// Rust source as identifiers and punctuation: comments, strings, characters, lifetimes and
/// numbers dropped, so a word in a comment or in a query's text defines nothing.
fn tokens(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if (c == 'r' || c == 'b' || c == 'c') && raw_or_byte_string(&chars, i).is_some() {
            i = raw_or_byte_string(&chars, i).expect("checked");
        } else if c == '\'' {
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                if chars[i] == '.' && !chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                    break;
                }
                i += 1;
            }
        } else if ident(c) {
            let start = if c == 'r' && next == Some('#') {
                i + 2
            } else {
                i
            };
            i = start;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// The index after a string's closing quote, from the index after its opening one.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// A raw, byte or C string literal starting at `i` (`r"…"`, `r#"…"#`, `b"…"`, `br#"…"#`,
/// `c"…"`): the index after it.
fn raw_or_byte_string(chars: &[char], i: usize) -> Option<usize> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) == Some(&'r') {
        j += 1;
        let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
        j += hashes;
        if chars.get(j) != Some(&'"') {
            return None;
        }
        j += 1;
        while j < chars.len() {
            if chars[j] == '"' && chars[j + 1..].iter().take(hashes).all(|&c| c == '#') {
                return Some(j + 1 + hashes);
            }
            j += 1;
        }
        Some(j)
    } else if j > i && chars.get(j) == Some(&'"') {
        Some(skip_string(chars, j + 1))
    } else {
        None
    }
}

/// The names a Rust source defines or re-exports.
#[derive(Default)]
struct Defined {
    /// Items, modules, enum variants, macros and `pub use` names.
    all: HashSet<String>,
    /// `fn` names alone.
    fns: HashSet<String>,
}

fn rust_names(src: &str) -> Defined {
    const ITEMS: [&str; 9] = [
        "mod", "fn", "struct", "enum", "trait", "type", "const", "static", "union",
    ];
    let tokens = tokens(src);
    let ident = |i: usize| match tokens.get(i) {
        Some(Token::Ident(s)) => Some(s.as_str()),
        _ => None,
    };
    let mut defined = Defined::default();
    for i in 0..tokens.len() {
        let Some(word) = ident(i) else { continue };
        if ITEMS.contains(&word) {
            if let Some(name) = ident(i + 1) {
                defined.all.insert(name.to_owned());
                if word == "fn" {
                    defined.fns.insert(name.to_owned());
                }
                if word == "enum" {
                    defined.all.extend(variants(&tokens[i + 2..]));
                }
            }
        } else if word == "macro_rules" && tokens.get(i + 1) == Some(&Token::Punct('!')) {
            defined.all.extend(ident(i + 2).map(str::to_owned));
        } else if word == "pub" {
            // `pub use …;` and `pub(…) use …;`: every name of the use tree.
            let mut j = i + 1;
            if tokens.get(j) == Some(&Token::Punct('(')) {
                while j < tokens.len() && tokens[j] != Token::Punct(')') {
                    j += 1;
                }
                j += 1;
            }
            if ident(j) == Some("use") {
                for token in tokens[j + 1..]
                    .iter()
                    .take_while(|t| **t != Token::Punct(';'))
                {
                    if let Token::Ident(name) = token {
                        defined.all.insert(name.clone());
                    }
                }
            }
        }
    }
    defined
}

/// An enum's variants, from the tokens after its name.
fn variants(tokens: &[Token]) -> Vec<String> {
    let Some(open) = tokens.iter().position(|t| *t == Token::Punct('{')) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut depth = 0;
    let mut expect = false;
    for token in &tokens[open..] {
        match token {
            Token::Punct('{' | '(' | '[') => {
                depth += 1;
                if depth == 1 {
                    expect = true;
                }
            }
            Token::Punct('}' | ')' | ']') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Token::Punct(',') if depth == 1 => expect = true,
            // An attribute before a variant: `#[…]`.
            Token::Punct('#') if depth == 1 => {}
            Token::Ident(name) if depth == 1 && expect => {
                found.push(name.clone());
                expect = false;
            }
            _ if depth == 1 => expect = false,
            _ => {}
        }
    }
    found
}

/// The names of the schema objects an SQL file creates (`CREATE [OR REPLACE] [UNIQUE] INDEX
/// [CONCURRENTLY] [IF NOT EXISTS] core.name …`, tables, functions, triggers, …) and its named
/// constraints.
fn sql_names(sql: &str) -> Vec<String> {
    const SKIP: [&str; 11] = [
        "or",
        "replace",
        "unique",
        "concurrently",
        "if",
        "not",
        "exists",
        "temp",
        "temporary",
        "unlogged",
        "constraint",
    ];
    let words: Vec<String> = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or_default())
        .flat_map(|l| {
            l.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .filter(|w| !w.is_empty())
                .map(|w| w.to_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut names = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let name = if word == "create" {
            // CREATE, what is skipped, the kind, what is skipped, the name.
            let skip = |mut j: usize| {
                while j < words.len() && SKIP.contains(&words[j].as_str()) {
                    j += 1;
                }
                j
            };
            words.get(skip(skip(i + 1) + 1))
        } else if word == "constraint" {
            words.get(i + 1)
        } else {
            None
        };
        if let Some(name) = name {
            names.push(name.rsplit('.').next().unwrap_or(name).to_owned());
        }
    }
    names
}

// ---------------------------------------------------------------------------------------------
// What the docs name.

/// A name a doc gives, where.
#[derive(Debug)]
struct Named {
    line: usize,
    text: String,
    /// Where a file map puts it (`None`: in backticks, anywhere).
    place: Option<Place>,
}

/// Where a file map's name is looked for.
#[derive(Debug, Clone)]
enum Place {
    /// An entry of the map: exactly this path from the root.
    Entry(String),
    /// A word of an entry's description: under the entry's directory (or, with a `/` in it,
    /// from the root).
    Under(String),
}

/// A doc's backticked spans outside fenced blocks, and the names of its file maps (plain fenced
/// blocks whose first word is a path); and the paths its `file=<path>` blocks write.
fn named(markdown: &str) -> (Vec<Named>, Vec<String>) {
    let mut names = Vec::new();
    let mut written = Vec::new();
    // The prose, fenced blocks blanked out (so line numbers hold).
    let mut prose = String::new();
    let mut block: Option<Vec<(usize, &str)>> = None;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = trimmed.strip_prefix("```");
        match (&mut block, fence) {
            (None, Some(info)) => {
                written.extend(
                    info.split_whitespace()
                        .filter_map(|w| w.strip_prefix("file="))
                        .map(str::to_owned),
                );
                block = Some(Vec::new());
                if !info.trim().is_empty() {
                    // Not a file map: its lines are not kept.
                    block = Some(vec![(0, "```")]);
                }
            }
            (Some(lines), Some(rest)) if rest.trim().is_empty() => {
                if lines.first().is_none_or(|(_, l)| *l != "```") {
                    names.extend(file_map(lines));
                }
                block = None;
            }
            (Some(lines), _) => lines.push((n + 1, line)),
            (None, None) => prose.push_str(line),
        }
        prose.push('\n');
    }
    names.extend(spans(&prose));
    (names, written)
}

/// A word of a file map, its punctuation trimmed.
fn map_word(word: &str) -> &str {
    word.trim_matches(|c: char| ",;:()[]{}'\"".contains(c))
        .trim_end_matches('.')
}

/// A file map's names: each entry (a line's first word when it is a path, or paths separated
/// by commas, then its description) under the directory entry it is indented under; each file or
/// directory named in a description under its entry's directory. A plain block whose first word
/// is not a path is no file map.
fn file_map(lines: &[(usize, &str)]) -> Vec<Named> {
    let is_path = |w: &str| is_file_name(w) || is_dir_name(w);
    let first = lines
        .first()
        .and_then(|(_, l)| l.split_whitespace().next())
        .unwrap_or_default();
    if !is_path(first) {
        return Vec::new();
    }
    let mut names = Vec::new();
    // The directory entries a line is indented under: (column, path from the root).
    let mut parents: Vec<(usize, String)> = Vec::new();
    let mut context = String::new();
    for &(line, text) in lines {
        let column = text.len() - text.trim_start().len();
        let body = text.trim_start();
        // The entry: a path, or paths each but the last followed by a comma.
        let mut parts = Vec::new();
        let mut rest = body;
        loop {
            let (word, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let (part, more) = word.strip_suffix(',').map_or((word, false), |p| (p, true));
            if !is_path(part) {
                break;
            }
            parts.push(part);
            rest = after.trim_start();
            if !more {
                break;
            }
        }
        let description = if !parts.is_empty() {
            let description = rest;
            while parents.last().is_some_and(|(c, _)| *c >= column) {
                parents.pop();
            }
            let parent = parents.last().map(|(_, p)| p.clone()).unwrap_or_default();
            for part in &parts {
                names.push(Named {
                    line,
                    text: (*part).to_owned(),
                    place: Some(Place::Entry(format!("{parent}{part}"))),
                });
            }
            context = match parts[..] {
                [dir] if dir.ends_with('/') => {
                    parents.push((column, format!("{parent}{dir}")));
                    format!("{parent}{dir}")
                }
                _ => parent,
            };
            description
        } else {
            body
        };
        for word in description.split_whitespace().map(map_word) {
            if is_path(word) {
                names.push(Named {
                    line,
                    text: word.to_owned(),
                    place: Some(Place::Under(context.clone())),
                });
            }
        }
    }
    names
}

/// Markdown code spans: a run of backticks up to the next run of as many, within a paragraph.
fn spans(prose: &str) -> Vec<Named> {
    let chars: Vec<char> = prose.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let start = i + run;
        let mut j = start;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n'
                && chars[j + 1..]
                    .iter()
                    .take_while(|&&c| c != '\n')
                    .all(|c| c.is_whitespace())
            {
                break; // a blank line ends the paragraph
            }
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|&&c| c == '`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                let text: String = chars[start..end].iter().collect();
                found.push(Named {
                    line,
                    text: text.replace('\n', " ").trim().to_owned(),
                    place: None,
                });
                line += text.matches('\n').count();
                i = end + run;
            }
            None => i = start,
        }
    }
    found
}

fn is_path_text(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
}

fn is_file_name(text: &str) -> bool {
    is_path_text(text)
        && EXTENSIONS
            .iter()
            .any(|ext| text.len() > ext.len() && text.ends_with(ext))
        && !text.ends_with("/.md")
}

fn is_dir_name(text: &str) -> bool {
    is_path_text(text) && text.len() > 1 && text.ends_with('/') && !text.contains("//")
}

fn is_test_name(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && text.matches('_').count() >= 4
        && !text.starts_with('_')
}

/// The Rust paths in a span that start with one of [`CRATES`], brace groups expanded: each as
/// its crate's index and its segments after the crate.
fn rust_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    for (index, (krate, _)) in CRATES.iter().enumerate() {
        let prefix = format!("{krate}::");
        let mut from = 0;
        while let Some(at) = text[from..].find(&prefix) {
            let at = from + at;
            from = at + prefix.len();
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || "_:.-/".contains(c)) {
                continue;
            }
            let mut rest = &text[from..];
            for path in use_tree(&mut rest) {
                found.push((index, path));
            }
        }
    }
    found
}

/// A use tree's paths (`a::b`, `a::{b, c::d}`), read off the front of `rest`.
fn use_tree(rest: &mut &str) -> Vec<Vec<String>> {
    let trimmed = rest.trim_start();
    if let Some(inner) = trimmed.strip_prefix('{') {
        *rest = inner;
        let mut paths = Vec::new();
        loop {
            paths.extend(use_tree(rest));
            let r = rest.trim_start();
            if let Some(r) = r.strip_prefix(',') {
                *rest = r;
            } else {
                *rest = r.strip_prefix('}').unwrap_or(r);
                return paths;
            }
        }
    }
    let len = trimmed
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '*'))
        .unwrap_or(trimmed.len());
    if len == 0 {
        *rest = trimmed;
        return Vec::new();
    }
    let segment = trimmed[..len].to_owned();
    *rest = &trimmed[len..];
    if let Some(r) = rest.strip_prefix("::") {
        *rest = r;
        let tails = use_tree(rest);
        if tails.is_empty() {
            return vec![vec![segment]];
        }
        return tails
            .into_iter()
            .map(|tail| std::iter::once(segment.clone()).chain(tail).collect())
            .collect();
    }
    vec![vec![segment]]
}

/// Whether `name` is a file or directory of the repository (or one the doc has its reader
/// write) at `place`.
fn exists(
    repo: &Repo,
    written: &[String],
    doc_dir: &Path,
    name: &str,
    place: Option<&Place>,
) -> bool {
    if name.starts_with("./") || name.starts_with("../") {
        // A link that leaves the repository (the team's spec beside the checkout) names nothing
        // of the repository's: not checked here.
        let mut depth = doc_dir.components().count() as i64;
        for part in name.split('/') {
            match part {
                ".." => depth -= 1,
                "." | "" => {}
                _ => depth += 1,
            }
            if depth < 0 {
                return true;
            }
        }
        return repo.root.join(doc_dir).join(name).exists();
    }
    let name = name.trim_start_matches('/');
    let paths: Vec<&String> = if name.ends_with('/') {
        // A directory the guide has written files under is one too.
        repo.dirs
            .iter()
            .chain(written.iter().filter(|w| w.contains('/')))
            .collect()
    } else {
        repo.files.iter().chain(written).collect()
    };
    let is = |path: &str, want: &str| {
        if want.ends_with('/') && !path.ends_with('/') {
            path.starts_with(want) // a written file's directory
        } else {
            path == want
        }
    };
    let ends = |path: &str, under: &str, want: &str| {
        path.strip_prefix(under).is_some_and(|rest| {
            is(rest, want)
                || rest
                    .match_indices('/')
                    .any(|(i, _)| is(&rest[i + 1..], want))
        })
    };
    match place {
        None => paths.iter().any(|p| ends(p, "", name)),
        Some(Place::Entry(path)) => paths.iter().any(|p| is(p, path)),
        Some(Place::Under(dir)) => paths
            .iter()
            .any(|p| ends(p, dir, name) || (name.contains('/') && is(p, name))),
    }
}

/// Made by builds and scripts, not committed: a name under one is not checked.
fn generated(name: &str) -> bool {
    SKIPPED
        .iter()
        .any(|dir| name.trim_start_matches("./").split('/').next() == Some(*dir))
}

/// What is wrong with the names of one doc: `doc:line: name: why` each.
fn check(repo: &Repo, doc: &str, markdown: &str) -> Vec<String> {
    let (names, written) = named(markdown);
    let doc_dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut wrong = Vec::new();
    for Named { line, text, place } in &names {
        let mut why = None;
        if is_file_name(text) || is_dir_name(text) {
            if !generated(text) && !exists(repo, &written, doc_dir, text, place.as_ref()) {
                why = Some(match place {
                    Some(Place::Entry(path)) => format!("the map's {path} does not exist"),
                    Some(Place::Under(dir)) => format!("no such file or directory under /{dir}"),
                    None => "no file or directory of the repository has this path".to_owned(),
                });
            }
        } else if place.is_none()
            && is_test_name(text)
            && !repo.fns.contains(text)
            && !repo.schema.contains(text)
        {
            why = Some("no fn (test) of the repository, nor schema object, has this name".into());
        }
        if place.is_none() {
            for (krate, path) in rust_paths(text) {
                let missing: Vec<&str> = path
                    .iter()
                    .map(String::as_str)
                    .filter(|s| !matches!(*s, "*" | "self") && !repo.names[krate].contains(*s))
                    .collect();
                if !missing.is_empty() {
                    why = Some(format!(
                        "{}::{}: {} defined or re-exported nowhere in {}",
                        CRATES[krate].0,
                        path.join("::"),
                        missing.join(", "),
                        CRATES[krate].1
                    ));
                }
            }
        }
        if let Some(why) = why {
            wrong.push(format!("{doc}:{line}: `{text}`: {why}"));
        }
    }
    wrong
}

fn docs(root: &Path) -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("an entry of docs/")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".to_owned());
    docs
}

#[test]
fn every_doc_names_only_files_items_and_tests_that_exist() {
    let root = workspace_root();
    let repo = Repo::read(&root);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in docs(&root) {
        let markdown = std::fs::read_to_string(root.join(&doc)).expect("a doc");
        checked += named(&markdown).0.len();
        wrong.extend(check(&repo, &doc, &markdown));
    }
    assert!(
        checked > 100,
        "the docs name only {checked} things: is the reading broken?"
    );
    assert!(
        wrong.is_empty(),
        "the docs name {} thing(s) that do not exist:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_rules_catch_what_does_not_exist() {
    let root = workspace_root();
    let repo = Repo::read(&root);
    let doc = "docs/made-up.md";
    let markdown = "\
Real: `shared/src/fence/mod.rs`, `paging/mod.rs`, `scripts/test.sh`, `.cargo/config.toml`,
`shared::fence::{FenceClaim, claim_fence}`, `shared::paging::Route`, `shared/src/fence/`,
`dead_letters_pending_job_idx`, `shared::dead_letter::ErrorKind::Poison`.

Made up: `shared/src/fence.rs`, `shared/src/no_such/`, `shared::fence::open_the_fence`,
`shared::{fence::FenceClaim, nowhere::FenceClaim}`, `no_such_test_of_this_repository`,
`e2e::no_such_module`, `dlq::commands::NoSuchCommand`, `../no/such/file.md`.

Generated, not checked: `target/`, `.tools/stack/logs/`.

```
shared/src/
  fence/        a folder (mod.rs, claim.rs)
  fence.rs      gone, though config/ has one (config/fence.rs)
  paging/       whom incidents page (routes.rs), and (no_such.rs)
    mod.rs      the Pager trait
  ledger.rs, metrics/   two entries, telemetry/otel.rs beside them
tests/          crate e2e (src/dev.rs, bin dev: scripts/dev.sh)
```
";
    let wrong = check(&repo, doc, markdown);
    let mut caught: Vec<&str> = wrong
        .iter()
        .map(|w| w.split('`').nth(1).expect("the name, in backticks"))
        .collect();
    caught.sort_unstable();
    let mut made_up = [
        "shared/src/fence.rs",
        "shared/src/no_such/",
        "shared::fence::open_the_fence",
        "shared::{fence::FenceClaim, nowhere::FenceClaim}",
        "no_such_test_of_this_repository",
        "e2e::no_such_module",
        "dlq::commands::NoSuchCommand",
        "../no/such/file.md",
        "fence.rs",
        "no_such.rs",
    ];
    made_up.sort_unstable();
    assert_eq!(caught, made_up, "{wrong:#?}");
}
