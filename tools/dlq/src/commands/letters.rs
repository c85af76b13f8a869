//! `dlq list` and `dlq show`: letters found by what a ticket names, and one letter whole.

use super::fields::{short_time, text};
use crate::args::{Filter, LetterId, MAX_LIST};
use crate::client::{ApiError, Client};
use crate::exit;
use crate::table::Table;
use crate::terminal::{self, Newlines, shown};
use serde_json::Value;

/// `dlq list`: letters, newest first, up to `limit`.
pub(super) async fn list(
    client: &Client,
    filter: &Filter,
    status: Option<String>,
    limit: usize,
    json: bool,
) -> Result<u8, String> {
    let mut query = filter.query();
    if let Some(status) = status {
        query.push(("status".into(), status));
    }
    let Letters { items, more } = collect_letters(client, query, limit)
        .await
        .map_err(|e| e.to_string())?;
    let shown = items.len();
    if json {
        println!("{}", terminal::json(&Value::Array(items), false));
    } else {
        print_letters(&items);
    }
    if more {
        say_more_match(shown);
    }
    Ok(exit::OK)
}

/// `dlq show`: one letter whole.
pub(super) async fn show(client: &Client, id: LetterId, json: bool) -> Result<u8, String> {
    let id = resolve_letter(client, id).await?;
    let letter = client.letter(id).await.map_err(|e| e.to_string())?;
    if json {
        println!("{}", terminal::json(&letter, false));
    } else {
        print_letter(&letter);
    }
    Ok(exit::OK)
}

/// The letter a command names: a whole id as it is; a prefix, the one letter whose id starts
/// with it (none, or two, is an error that says which).
pub(super) async fn resolve_letter(client: &Client, id: LetterId) -> Result<uuid::Uuid, String> {
    let prefix = match id {
        LetterId::Whole(id) => return Ok(id),
        LetterId::Prefix(prefix) => prefix,
    };
    let query = [
        ("id_prefix".to_owned(), prefix.clone()),
        ("limit".to_owned(), "2".to_owned()),
    ];
    let page = client.letters(&query).await.map_err(|e| e.to_string())?;
    match page.items.as_slice() {
        [one] => Ok(one.id),
        [] => Err(format!("no letter's id starts with {prefix}")),
        [a, b, ..] => Err(format!(
            "{prefix} is ambiguous: letters {} and {} (and maybe more) start with it; give more \
             of the id",
            a.id, b.id
        )),
    }
}

/// Letters read page by page, up to a limit, and whether more match than were read.
pub(super) struct Letters {
    pub(super) items: Vec<Value>,
    pub(super) more: bool,
}

/// Up to `limit` letters, reading pages as needed (the raw JSON, for `--json`).
pub(super) async fn collect_letters(
    client: &Client,
    mut query: Vec<(String, String)>,
    limit: usize,
) -> Result<Letters, ApiError> {
    query.push(("limit".into(), limit.clamp(1, 200).to_string()));
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut more = false;
    while items.len() < limit {
        let mut q = query.clone();
        if let Some(c) = &cursor {
            q.push(("cursor".into(), c.clone()));
        }
        let raw = client.letters_raw(&q).await?;
        let page = raw["items"].as_array().cloned().unwrap_or_default();
        let room = limit - items.len();
        more = page.len() > room;
        items.extend(page.into_iter().take(room));
        match raw["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        more = more || items.len() >= limit;
    }
    Ok(Letters { items, more })
}

/// On stderr, so that `--json` output stays one value: more letters match than were shown.
fn say_more_match(shown: usize) {
    eprintln!(
        "dlq: more letters match than the {shown} shown (newest first): raise --limit (up to {}) \
         or narrow the filter (--status, --kind, --group, --from, --before, …)",
        MAX_LIST
    );
}

/// Letters as a table, a row each, and how many.
pub(super) fn print_letters(letters: &[Value]) {
    let mut t = Table::new([
        "created",
        "id",
        "kind",
        "tries",
        "status",
        "group",
        "job",
        "last error",
    ]);
    for l in letters {
        t.row([
            short_time(l["created_at"].as_str().unwrap_or("")),
            text(&l["id"]),
            text(&l["error_kind"]),
            text(&l["attempts"]),
            text(&l["status"]),
            text(&l["group_id"]),
            text(&l["job_id"]),
            text(&l["last_error"]),
        ]);
    }
    t.print_indented(0);
    println!("{} letter(s)", letters.len());
}

/// What `dlq show` prints of a letter, a line each: its name there, and the API's field (a
/// field the letter lacks is left out).
const LETTER_FIELDS: [(&str, &str); 20] = [
    ("id", "id"),
    ("status", "status"),
    ("kind", "error_kind"),
    ("attempts", "attempts"),
    ("consumer", "consumer"),
    ("queue", "queue"),
    ("group", "group_id"),
    ("job", "job_id"),
    ("tenant", "tenant_id"),
    ("correlation", "correlation_id"),
    ("message", "message_id"),
    ("fifo group", "message_group"),
    ("created", "created_at"),
    ("replay of", "replay_of"),
    ("reviewed by", "reviewed_by"),
    ("reviewed at", "reviewed_at"),
    ("discard reason", "discard_reason"),
    ("replay outcome", "replay_outcome"),
    ("replay reason", "replay_reason"),
    ("replay message", "replay_message_id"),
];

/// One letter whole: its fields, its job's fence, its failed replays, its last error and its
/// payload.
fn print_letter(body: &Value) {
    let l = &body["letter"];
    for (name, field) in LETTER_FIELDS {
        if !l[field].is_null() {
            println!("{name:<15} {}", text(&l[field]));
        }
    }
    let fence = match body["fence_exists"].as_bool() {
        Some(true) => "exists: the job's effect committed; a replay would send nothing",
        Some(false) => "none: a replay runs the job, at most once",
        None => "no job id: not replayable",
    };
    println!("{:<15} {fence}", "fence");
    if let Some(replays) = body["failed_replays"].as_array().filter(|r| !r.is_empty()) {
        let ids: Vec<String> = replays.iter().map(text).collect();
        println!("{:<15} {}", "failed replays", ids.join(", "));
    }
    let last_error = match &l["last_error"] {
        Value::String(s) => shown(s, Newlines::Keep),
        other => text(other),
    };
    println!("last error:\n  {}", last_error.replace('\n', "\n  "));
    println!(
        "payload (as received):\n{}",
        terminal::json(&l["payload"], true)
    );
}
