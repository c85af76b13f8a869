//! `dlq`, the on-call operator's tool over the dead-letter API: find a letter from what a ticket
//! names (job, correlation id, tenant, message), see failures grouped as they page, and replay
//! or discard a whole group (or any filter) in bulk: a dry run first, a pinned set, a rate, a
//! progress bar, a summary and an exit status a script can use.
//!
//! Invariant: nothing is changed but through the API's one-letter replay, edit and discard
//! routes, so every guarantee of a single replay (same job id, the fence, a 409 for a letter
//! already reviewed) holds for every letter of a bulk run and for an edit.

#![warn(missing_docs)]

pub mod args;
pub mod bulk;
pub mod client;
pub mod edit;
pub mod table;
pub mod terminal;

use args::{Cli, Command};
use bulk::{Action, Ending};
use client::{ApiError, Client};
use serde_json::Value;
use std::process::ExitCode;
use table::Table;
use terminal::{Newlines, shown};

/// Exit statuses, for scripts.
pub mod exit {
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
}

/// Runs the command line; the exit status says how it went.
pub async fn run(cli: Cli) -> ExitCode {
    match run_command(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("dlq: {}", shown(&message, Newlines::Keep));
            ExitCode::from(exit::USAGE)
        }
    }
}

async fn run_command(cli: Cli) -> Result<u8, String> {
    let api = cli.api.ok_or(
        "no API: pass --api or set DLQ_API_URL (the stack's DeadLetterApiUrl output; locally \
         `bash scripts/stack.sh env` prints it)",
    )?;
    let token = cli.token.ok_or(
        "no token: set DLQ_TOKEN (or pass --token) to an access token with the scopes you need \
         (docs/operations.md says how to get one)",
    )?;
    let client = Client::new(&api, token)?;
    let json = cli.json;
    let refused = |e: ApiError| e.to_string();
    match cli.command {
        Command::List {
            filter,
            status,
            limit,
        } => {
            let mut query = filter.query();
            if let Some(status) = status {
                query.push(("status".into(), status));
            }
            let Letters { items, more } = collect_letters(&client, query, limit)
                .await
                .map_err(refused)?;
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
        Command::Show { id } => {
            let id = resolve_letter(&client, id).await?;
            let letter = client.letter(id).await.map_err(refused)?;
            if json {
                println!("{}", terminal::json(&letter, false));
            } else {
                print_letter(&letter);
            }
            Ok(exit::OK)
        }
        Command::Groups {
            status,
            queue,
            consumer,
            kind,
            limit,
        } => {
            let mut query = vec![("status".to_owned(), status)];
            for (k, v) in [
                ("queue", queue),
                ("consumer", consumer),
                ("error_kind", kind),
            ] {
                if let Some(v) = v {
                    query.push((k.into(), v));
                }
            }
            query.push(("limit".into(), limit.clamp(1, 200).to_string()));
            let page = client.groups(&query).await.map_err(refused)?;
            if json {
                let raw: Vec<Value> = page.items.iter().map(group_json).collect();
                println!("{}", terminal::json(&Value::Array(raw), false));
            } else {
                print_groups(&page.items);
            }
            Ok(exit::OK)
        }
        Command::Group { id } => {
            let group = client.group(id).await.map_err(refused)?;
            let query = vec![
                ("group_id".to_owned(), id.to_string()),
                ("status".to_owned(), "pending_review".to_owned()),
            ];
            let Letters {
                items: letters,
                more,
            } = collect_letters(&client, query, 20).await.map_err(refused)?;
            if json {
                let both =
                    serde_json::json!({"group": group_json(&group), "pending_letters": letters});
                println!("{}", terminal::json(&both, false));
            } else {
                print_group(&group, &letters);
            }
            if more {
                eprintln!(
                    "dlq: the group has more letters pending review than the {} shown: \
                     dlq list --group {id} --status pending_review --limit N",
                    letters.len()
                );
            }
            Ok(exit::OK)
        }
        Command::Replay { bulk, reason } => {
            bulk_exit(bulk::run(&client, Action::Replay, &bulk, reason.as_deref(), json).await)
        }
        Command::Edit {
            id,
            reason,
            file,
            dry_run,
            yes,
        } => {
            let id = resolve_letter(&client, id).await?;
            let how = edit::How {
                reason,
                file,
                dry_run,
                yes,
            };
            edit::run(&client, id, &how, json).await
        }
        Command::Discard { bulk, reason } => {
            bulk_exit(bulk::run(&client, Action::Discard, &bulk, reason.as_deref(), json).await)
        }
    }
}

fn bulk_exit(result: Result<(Ending, bulk::Summary), String>) -> Result<u8, String> {
    Ok(match result?.0 {
        Ending::Done => exit::OK,
        Ending::SomeFailed => exit::SOME_FAILED,
        Ending::Declined => exit::DECLINED,
        Ending::Interrupted => exit::INTERRUPTED,
    })
}

/// The letter a command names: a whole id as it is; a prefix, the one letter whose id starts
/// with it (none, or two, is an error that says which).
async fn resolve_letter(client: &Client, id: args::LetterId) -> Result<uuid::Uuid, String> {
    let prefix = match id {
        args::LetterId::Whole(id) => return Ok(id),
        args::LetterId::Prefix(prefix) => prefix,
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
struct Letters {
    items: Vec<Value>,
    more: bool,
}

/// Up to `limit` letters, reading pages as needed (the raw JSON, for `--json`).
async fn collect_letters(
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
        args::MAX_LIST
    );
}

fn short_time(t: &str) -> String {
    t.get(..19).unwrap_or(t).replace('T', " ")
}

/// A value of the API's as one line of text, shown inert ([`terminal::shown`]).
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => shown(s, Newlines::Escape),
        other => shown(&other.to_string(), Newlines::Escape),
    }
}

fn print_letters(letters: &[Value]) {
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

fn print_letter(body: &Value) {
    let l = &body["letter"];
    for (name, field) in [
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
    ] {
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

fn group_json(g: &client::Group) -> Value {
    serde_json::json!({"id": g.id, "status": g.status, "consumer": g.consumer, "queue": g.queue,
        "error_kind": g.error_kind, "pattern": g.pattern, "sample_error": g.sample_error,
        "letter_count": g.letter_count, "pending_count": g.pending_count,
        "first_letter_at": g.first_letter_at, "last_letter_at": g.last_letter_at, "incident": g.incident,
        "failed_replays": g.failed_replays})
}

fn print_groups(groups: &[client::Group]) {
    let mut t = Table::new([
        "group", "status", "consumer", "queue", "kind", "pending", "total", "first", "last",
        "failure",
    ]);
    for g in groups {
        t.row([
            g.id.to_string(),
            g.status.clone(),
            g.consumer.clone(),
            g.queue.clone(),
            g.error_kind.clone(),
            g.pending_count.to_string(),
            g.letter_count.to_string(),
            short_time(&g.first_letter_at),
            short_time(&g.last_letter_at),
            g.pattern.clone(),
        ]);
    }
    t.print_indented(0);
    println!("{} group(s)", groups.len());
}

fn print_group(g: &client::Group, pending: &[Value]) {
    let one_line = |s: &str| shown(s, Newlines::Escape);
    println!(
        "group {} ({}): {} / {} on {}",
        g.id,
        one_line(&g.status),
        one_line(&g.consumer),
        one_line(&g.error_kind),
        one_line(&g.queue)
    );
    println!("failure        {}", one_line(&g.pattern));
    println!("first error    {}", one_line(&g.sample_error));
    println!(
        "letters        {} ({} pending review), {} to {}",
        g.letter_count,
        g.pending_count,
        short_time(&g.first_letter_at),
        short_time(&g.last_letter_at)
    );
    if let Some(incident) = &g.incident {
        println!(
            "incident       {} (shows {} letter(s){})",
            text(&incident["id"]),
            text(&incident["count"]),
            if incident["resolved_at"].is_null() {
                ""
            } else {
                ", resolved"
            }
        );
    }
    for again in &g.failed_replays {
        println!(
            "replayed, failed again: {} letter(s) in group {id}: dlq group {id}",
            again.letters,
            id = again.group_id
        );
    }
    if !pending.is_empty() {
        println!("pending letters (newest {}):", pending.len());
        print_letters(pending);
    }
    println!(
        "next: dlq replay --group {id} --dry-run   (or: dlq discard --group {id} --reason '…')",
        id = g.id
    );
}
