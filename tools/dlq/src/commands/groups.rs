//! `dlq groups` and `dlq group`: failures grouped as they page, and one group with its letters
//! pending review.

use super::fields::{short_time, text};
use super::letters::{Letters, collect_letters, print_letters};
use crate::client::{Client, Group};
use crate::exit;
use crate::table::Table;
use crate::terminal::{self, Newlines, shown};
use serde_json::Value;

/// The groups endpoint's query for `dlq groups`' flags.
pub(super) fn query(
    status: String,
    queue: Option<String>,
    consumer: Option<String>,
    kind: Option<String>,
    limit: usize,
) -> Vec<(String, String)> {
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
    query
}

/// `dlq groups`: one page of groups, the latest first.
pub(super) async fn list(
    client: &Client,
    query: &[(String, String)],
    json: bool,
) -> Result<u8, String> {
    let page = client.groups(query).await.map_err(|e| e.to_string())?;
    if json {
        let raw: Vec<Value> = page.items.iter().map(group_json).collect();
        println!("{}", terminal::json(&Value::Array(raw), false));
    } else {
        print_groups(&page.items);
    }
    Ok(exit::OK)
}

/// `dlq group`: one group and its newest letters pending review.
pub(super) async fn show(client: &Client, id: i64, json: bool) -> Result<u8, String> {
    let group = client.group(id).await.map_err(|e| e.to_string())?;
    let query = vec![
        ("group_id".to_owned(), id.to_string()),
        ("status".to_owned(), "pending_review".to_owned()),
    ];
    let Letters {
        items: letters,
        more,
    } = collect_letters(client, query, 20)
        .await
        .map_err(|e| e.to_string())?;
    if json {
        let both = serde_json::json!({"group": group_json(&group), "pending_letters": letters});
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

fn group_json(g: &Group) -> Value {
    serde_json::json!({"id": g.id, "status": g.status, "consumer": g.consumer, "queue": g.queue,
        "error_kind": g.error_kind, "pattern": g.pattern, "sample_error": g.sample_error,
        "letter_count": g.letter_count, "pending_count": g.pending_count,
        "first_letter_at": g.first_letter_at, "last_letter_at": g.last_letter_at, "incident": g.incident,
        "failed_replays": g.failed_replays})
}

fn print_groups(groups: &[Group]) {
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

/// One group: what failed, where and how often, what became of it, its pending letters and
/// what to run next.
fn print_group(g: &Group, pending: &[Value]) {
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
    print_aftermath(g);
    if !pending.is_empty() {
        println!("pending letters (newest {}):", pending.len());
        print_letters(pending);
    }
    println!(
        "next: dlq replay --group {id} --dry-run   (or: dlq discard --group {id} --reason '…')",
        id = g.id
    );
}

/// What became of a group: the incident it paged, and the groups its failed replays went to.
fn print_aftermath(g: &Group) {
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
}
