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

mod editor;
mod layout;

pub use layout::laid_out;

use crate::client::{ApiError, Client};
use crate::exit;
use crate::terminal::{self, Newlines, shown};
use editor::{in_editor, print_diff};
use layout::as_text;
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
    let reason = reason(how)?;
    may_edit(client).await?;
    let original = received_body(client, id).await?;
    let edited = edited_body(id, how, &original)?;
    if serde_json::from_str::<Value>(&original).is_ok_and(|o| o == edited) {
        eprintln!("dlq: edit cancelled, no changes made");
        return Ok(exit::OK);
    }
    print_diff(&original, &as_text(&edited));
    print_plan(client, id, &edited, &reason).await?;
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
    replay(client, id, &edited, &reason, json).await?;
    Ok(exit::OK)
}

/// The reason kept with the replay: required, but for a dry run.
fn reason(how: &How) -> Result<String, String> {
    match (&how.reason, how.dry_run) {
        (Some(reason), _) => Ok(reason.clone()),
        (None, true) => Ok("dlq edit --dry-run".to_owned()),
        (None, false) => Err(
            "--reason is required: say what was wrong with the body and why the edit fixes \
             it (or --dry-run to see the plan first)"
                .into(),
        ),
    }
}

/// The body of letter `id` as received, laid out for the editor; only a letter pending review
/// can be edited.
async fn received_body(client: &Client, id: uuid::Uuid) -> Result<String, String> {
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
    Ok(match answer["body"].as_str() {
        Some(received) => laid_out(received),
        None => as_text(&letter["payload"]),
    })
}

/// The edited body, from `--file` or the editor; it must be JSON.
fn edited_body(id: uuid::Uuid, how: &How, original: &str) -> Result<Value, String> {
    let edited_text = match &how.file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?
        }
        None => in_editor(id, original)?,
    };
    serde_json::from_str(&edited_text).map_err(|e| {
        format!("the edited body is not JSON ({e}); nothing was sent: run dlq edit again")
    })
}

/// The API's check of the edit (a dry run of it), and its plan printed.
async fn print_plan(
    client: &Client,
    id: uuid::Uuid,
    edited: &Value,
    reason: &str,
) -> Result<(), String> {
    let plan = client
        .edit(id, edited, reason, true)
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
    Ok(())
}

/// The edited replay itself, and what became of it.
async fn replay(
    client: &Client,
    id: uuid::Uuid,
    edited: &Value,
    reason: &str,
    json: bool,
) -> Result<(), String> {
    let done = client
        .edit(id, edited, reason, false)
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
    Ok(())
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
