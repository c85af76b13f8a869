//! `dlq edit <letter>`: a letter's body corrected in `$VISUAL` / `$EDITOR` (as `kubectl edit`
//! does) and replayed under the same job.
//!
//! Invariants:
//! - nothing changes before the operator has seen the diff and the API's plan and said yes (or
//!   passed `--yes`). The API checks the edit (same job and tenant, an envelope, one SQS
//!   message) in a dry run before the real request; a token without the edit scope is refused
//!   before the editor opens, and an edit left unchanged sends nothing;
//! - the editor starts from the body as received, key for key and number for number (only its
//!   whitespace laid out, [`laid_out`]), never from the stored `jsonb`, which reorders keys and
//!   rewrites numbers;
//! - the working file is the operator's alone: made new (never an existing path) with a name no
//!   one can guess, readable by its owner only, and removed afterwards.

use crate::client::{ApiError, Client};
use crate::exit;
use crate::terminal::{self, Newlines, shown};
use serde_json::Value;
use std::path::PathBuf;

/// How the edit is made.
#[derive(Debug, Clone, Default)]
pub struct How {
    /// Why (required unless `dry_run`).
    pub reason: Option<String>,
    /// The edited envelope from this file, not the editor.
    pub file: Option<PathBuf>,
    /// Diff and plan only.
    pub dry_run: bool,
    /// No prompt.
    pub yes: bool,
}

/// Edits letter `id` and replays it; the exit status says how it went.
pub async fn run(client: &Client, id: uuid::Uuid, how: &How, json: bool) -> Result<u8, String> {
    let reason = match (&how.reason, how.dry_run) {
        (Some(reason), _) => reason.clone(),
        (None, true) => "dlq edit --dry-run".to_owned(),
        (None, false) => {
            return Err(
                "--reason is required: say what was wrong with the body and why the edit fixes \
                 it (or --dry-run to see the plan first)"
                    .into(),
            );
        }
    };
    may_edit(client).await?;
    let answer = client.letter(id).await.map_err(|e| e.to_string())?;
    let letter = &answer["letter"];
    if letter["status"] != "pending_review" {
        return Err(format!(
            "letter {id} is {}: only a letter pending review can be edited and replayed",
            shown(
                letter["status"].as_str().unwrap_or("unknown"),
                Newlines::Escape
            )
        ));
    }
    let original = match answer["body"].as_str() {
        Some(received) => laid_out(received),
        None => as_text(&letter["payload"]),
    };
    let edited_text = match &how.file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?
        }
        None => in_editor(id, &original)?,
    };
    let edited: Value = serde_json::from_str(&edited_text).map_err(|e| {
        format!("the edited body is not JSON ({e}); nothing was sent: run dlq edit again")
    })?;
    if serde_json::from_str::<Value>(&original).is_ok_and(|o| o == edited) {
        eprintln!("dlq: edit cancelled, no changes made");
        return Ok(exit::OK);
    }
    print_diff(&original, &as_text(&edited));
    let plan = client
        .edit(id, &edited, &reason, true)
        .await
        .map_err(|e| format!("the API refused the edit: {e}; nothing was sent"))?;
    let effect = plan.body["replay"]["effect"].as_str().unwrap_or_default();
    println!(
        "Plan: replay letter {id} (job {}, queue {}) with the edited body: {}",
        shown(
            plan.body["replay"]["job_id"].as_str().unwrap_or("?"),
            Newlines::Escape
        ),
        shown(
            plan.body["replay"]["queue"].as_str().unwrap_or("?"),
            Newlines::Escape
        ),
        shown(effect, Newlines::Escape),
    );
    if how.dry_run {
        println!("Dry run: nothing was recorded or sent.");
        return Ok(exit::OK);
    }
    if !how.yes
        && !terminal::confirmed(
            "Replay it with the edited body?",
            "run with --dry-run first, then --yes",
        )?
    {
        eprintln!("dlq: declined; nothing was sent");
        return Ok(exit::DECLINED);
    }
    let done = client
        .edit(id, &edited, &reason, false)
        .await
        .map_err(|e| format!("the API refused the edit: {e}"))?;
    if json {
        println!("{}", terminal::json(&done.body, false));
    } else {
        let replay = &done.body["replay"];
        let said = match (replay["sent"].as_bool(), replay["fence_exists"].as_bool()) {
            (_, Some(true)) => "already processed: the job's fence exists, nothing was sent",
            (Some(true), _) => "sent: the consumer runs the edited job, at most once",
            _ => "queued: the queue refused it just now; the scheduled run sends it",
        };
        println!("Letter {id}: {said}.");
    }
    Ok(exit::OK)
}

/// Stops before anything is read or opened if the token may not edit: an edit of the nil letter
/// id, which no letter has (the gateway answers 401 or 403 before the function runs; a token
/// that may gets the function's 404).
async fn may_edit(client: &Client) -> Result<(), String> {
    let probe = "dlq: checking the token's scope before the edit";
    match client
        .edit(uuid::Uuid::nil(), &serde_json::json!({}), probe, true)
        .await
    {
        Err(ApiError::Refused {
            status: status @ (401 | 403),
            message,
            ..
        }) => Err(format!(
            "the token may not edit letters ({status}: {message}): an edited replay needs the \
             scope core.dead_letters.edit (DLQ_TOKEN / --token); nothing was read or changed"
        )),
        _ => Ok(()),
    }
}

/// A body as the editor shows it: JSON pretty-printed, a body that was not JSON as it came.
fn as_text(body: &Value) -> String {
    match body {
        Value::String(raw) => raw.clone(),
        json => serde_json::to_string_pretty(json).unwrap_or_default() + "\n",
    }
}

/// A JSON body laid out one value a line, two spaces an indent, as `serde_json` pretty-prints,
/// but from its text: its keys in their order, its numbers and string escapes as written. A
/// body that is not JSON comes back as it is.
pub fn laid_out(body: &str) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(body).is_err() {
        return body.to_owned();
    }
    let mut out = String::with_capacity(body.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                    chars.next();
                }
                if chars.peek().is_some_and(|&n| n == '}' || n == ']') {
                    out.extend(chars.next());
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

/// Opens `text` in `$VISUAL`, else `$EDITOR`, else `vi`, and returns what was saved. The file
/// is created new, with a name no one can guess, readable and writable by its owner only.
fn in_editor(id: uuid::Uuid, text: &str) -> Result<String, String> {
    use std::io::Write as _;
    let editor = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.trim().is_empty()))
        .unwrap_or_else(|| "vi".to_owned());
    let mut file = tempfile::Builder::new()
        .prefix(&format!("dlq-edit-{}-", &id.simple().to_string()[..8]))
        .suffix(".json")
        .tempfile()
        .map_err(|e| format!("creating the working file: {e}"))?;
    let path = file.path().to_owned();
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    // Through the shell, as git runs its editor: `$EDITOR` may carry arguments (`code -w`).
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .map_err(|e| format!("running the editor {editor}: {e}"))?;
    let saved = std::fs::read_to_string(&path);
    // Removed with the handle (an editor that saved by renaming left a file at the path too).
    drop(file);
    let _ = std::fs::remove_file(&path);
    if !status.success() {
        return Err(format!(
            "the editor {editor} exited with {status}; nothing was sent"
        ));
    }
    saved.map_err(|e| format!("reading back {}: {e}", path.display()))
}

/// The line diff of the body received and the edit, every line escaped for the terminal.
fn print_diff(original: &str, edited: &str) {
    let diff = similar::TextDiff::from_lines(original, edited);
    println!("--- received\n+++ edited");
    for change in diff.iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
            similar::ChangeTag::Equal => ' ',
        };
        let line = change.value().trim_end_matches('\n');
        println!("{sign}{}", shown(line, Newlines::Escape));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_laid_out_key_for_key_and_number_for_number() {
        let received =
            r#"{"job_id":"j","payload":{"z":1.50,"a":[1e2, {}, []],"s":"a,b:{\"c\"}"},"b":-0}"#;
        assert_eq!(
            laid_out(received),
            "{\n  \"job_id\": \"j\",\n  \"payload\": {\n    \"z\": 1.50,\n    \"a\": [\n      1e2,\n      {},\n      []\n    ],\n    \"s\": \"a,b:{\\\"c\\\"}\"\n  },\n  \"b\": -0\n}\n"
        );
        let value: Value = serde_json::from_str(received).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&laid_out(received)).unwrap(),
            value
        );
        let sorted = serde_json::to_string(&value).unwrap();
        assert_eq!(
            laid_out(&sorted),
            as_text(&value),
            "as serde_json pretty-prints"
        );
        assert_eq!(laid_out("not json {"), "not json {");
    }
}
