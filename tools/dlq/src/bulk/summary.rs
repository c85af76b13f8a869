//! An operation as the operator reads it: its counts, how it ended and what is left to do, the
//! exit status it means, and the commands to follow or stop it.

use crate::client::{Operation, OperationProgress};
use crate::exit;
use crate::terminal::{Newlines, shown};
use serde_json::{Map, Value};
use std::time::Duration;

/// What an operation did, in words: `replayed 4 (sent 4) · already processed 1 · …`.
pub fn counts(action: &str, p: &OperationProgress) -> String {
    match action {
        "discard" => format!("discarded {}", p.discarded),
        _ => format!(
            "replayed {} (sent {}) · already processed {} · not replayable {} · not sendable {}",
            p.replayed,
            p.sent,
            p.already_processed,
            p.skipped_not_replayable,
            p.skipped_not_sendable
        ),
    }
}

/// The API's parameters and the `dlq` flags that set them, in the order `dlq` writes them.
const FLAGS: [(&str, &str); 10] = [
    ("group_id", "--group"),
    ("queue", "--queue"),
    ("consumer", "--consumer"),
    ("error_kind", "--kind"),
    ("job_id", "--job-id"),
    ("correlation_id", "--correlation-id"),
    ("tenant_id", "--tenant-id"),
    ("message_id", "--message-id"),
    ("created_from", "--from"),
    ("created_before", "--before"),
];

/// An operation's selection as the `dlq` flags that select the same letters (`--group 4
/// --kind exhausted`); an id prefix (which no bulk flag sets) as the range of ids it covers.
pub fn selection_flags(selection: &Map<String, Value>) -> String {
    let mut words = Vec::new();
    for (parameter, flag) in FLAGS {
        if let Some(value) = selection.get(parameter) {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            words.push(format!("{flag} {}", crate::args::shell_word(&value)));
        }
    }
    if let Some([first, last]) = selection
        .get("id_range")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        words.push(format!("(ids {} to {})", text(first), text(last)));
    }
    for other in selection.keys() {
        if other != "id_range" && !FLAGS.iter().any(|(p, _)| p == other) {
            words.push(format!("({other} {})", text(&selection[other])));
        }
    }
    shown(&words.join(" "), Newlines::Escape)
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v.to_string())
}

/// The exit status an ended operation means: 0 when every letter it selected was reviewed, 1
/// when letters are left pending review (skipped, or not reached: cancelled).
pub fn exit_status(op: &Operation) -> u8 {
    if op.status == "done" && op.progress.skipped() == 0 {
        exit::OK
    } else {
        exit::SOME_FAILED
    }
}

/// The commands that follow and stop a running operation.
fn follow_commands(op: &Operation) -> String {
    format!(
        "  follow it:  dlq operation {id} --follow\n  stop it:    dlq cancel {id} --reason '…'",
        id = op.id
    )
}

/// The most of an operation's last error `dlq operation` shows (`--json` has it whole).
const LONGEST_ERROR: usize = 300;

/// `s` cut to `max` characters, with `…` where it was cut.
pub(super) fn clipped(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// An operation whole, a line per field, and what to run next.
pub fn print_operation(op: &Operation) {
    let one_line = |s: &str| shown(s, Newlines::Escape);
    println!("operation     {}", op.id);
    println!("action        {}", one_line(&op.action));
    let status = match (op.running(), op.failures) {
        (true, 0) if op.progress.worked() == 0 => {
            "running (waiting for the scheduled worker, every minute)".to_owned()
        }
        (true, n) if n > 0 => format!(
            "running ({n} failure(s) in a row, retried after a backoff: {})",
            clipped(
                &one_line(op.last_error.as_deref().unwrap_or("?")),
                LONGEST_ERROR
            )
        ),
        _ => one_line(&op.status),
    };
    println!("status        {status}");
    println!("selection     {}", selection_flags(&op.selection));
    println!("reason        {}", one_line(&op.reason));
    println!(
        "requested     by {} at {}",
        one_line(&op.requested_by),
        one_line(&op.created_at)
    );
    println!(
        "progress      {} of {} letter(s) worked: {}",
        op.progress.worked(),
        op.planned,
        counts(&op.action, &op.progress)
    );
    if let Some(by) = &op.cancelled_by {
        println!(
            "cancelled     by {}: {}",
            one_line(by),
            one_line(op.cancel_reason.as_deref().unwrap_or(""))
        );
    }
    match &op.finished_at {
        Some(at) => println!("finished      {}", one_line(at)),
        None => println!("updated       {}", one_line(&op.updated_at)),
    }
    if op.running() {
        println!("{}", follow_commands(op));
    } else {
        for line in left_to_do(op) {
            println!("{line}");
        }
    }
}

/// How an operation that was followed ended, with what is left to do.
pub fn print_ended(op: &Operation, took: Duration, json: bool) {
    if json {
        let out = serde_json::json!({"operation": op, "ending": op.status,
                                     "seconds": took.as_secs_f64()});
        println!("{}", crate::terminal::json(&out, false));
        return;
    }
    let worked = format!(
        "{} of {} letter(s) worked: {}",
        op.progress.worked(),
        op.planned,
        counts(&op.action, &op.progress)
    );
    if op.status == "cancelled" {
        println!(
            "Cancelled by {} ({}): {} operation {}, {worked}",
            shown(op.cancelled_by.as_deref().unwrap_or("?"), Newlines::Escape),
            shown(op.cancel_reason.as_deref().unwrap_or(""), Newlines::Escape),
            shown(&op.action, Newlines::Escape),
            op.id
        );
    } else {
        println!(
            "Done: {} operation {} in {}: {worked}",
            shown(&op.action, Newlines::Escape),
            op.id,
            super::follow::duration(took)
        );
    }
    for line in left_to_do(op) {
        println!("{line}");
    }
}

/// Following stopped while the operation runs on (Ctrl-C, or `--detach`): where it stands,
/// and how to follow or stop it.
pub fn print_interrupted(op: &Operation, ending: &str, json: bool) {
    if json {
        let out = serde_json::json!({"operation": op, "ending": ending,
            "follow": format!("dlq operation {} --follow", op.id)});
        println!("{}", crate::terminal::json(&out, false));
        return;
    }
    println!(
        "The {} operation {} goes on server-side ({} of {} letter(s) worked so far); nothing \
         was cancelled.\n{}",
        shown(&op.action, Newlines::Escape),
        op.id,
        op.progress.worked(),
        op.planned,
        follow_commands(op)
    );
}

/// What an ended operation left to do, a line each: letters it left pending and why, replays
/// still to send, letters someone else reviewed meanwhile, the rest of a cancelled one.
fn left_to_do(op: &Operation) -> Vec<String> {
    let p = &op.progress;
    let flags = selection_flags(&op.selection);
    let mut lines = Vec::new();
    if p.skipped_not_replayable > 0 {
        lines.push(format!(
            "{} letter(s) left pending review, not replayable (unsettled, a poison without a job \
             id, or another job under its id): see them with `dlq list {flags} --status \
             pending_review`; check each by hand, then discard it with a reason",
            p.skipped_not_replayable
        ));
    }
    if p.skipped_not_sendable > 0 {
        lines.push(format!(
            "{} letter(s) left pending review, not sendable (SQS would refuse the body): `dlq \
             edit <letter>` each, or discard them",
            p.skipped_not_sendable
        ));
    }
    if p.replayed > p.sent {
        lines.push(format!(
            "{} replay(s) recorded but not sent yet: the scheduled run sends them within minutes \
             (`dlq show <letter>` says queued)",
            p.replayed - p.sent
        ));
    }
    if op.status == "cancelled" {
        lines.push(format!(
            "What it did stays done; the rest of its letters are still pending review: `dlq list \
             {flags} --status pending_review`"
        ));
    } else if p.worked() < op.planned {
        lines.push(format!(
            "{} of the {} letter(s) planned were reviewed by someone else meanwhile",
            op.planned - p.worked(),
            op.planned
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_reads_as_the_flags_that_select_it() {
        let selection: Map<String, Value> = serde_json::from_value(serde_json::json!({
            "group_id": 42, "error_kind": "exhausted", "queue": "points jobs",
            "created_before": "2026-12-01T08:00:00Z"
        }))
        .unwrap();
        assert_eq!(
            selection_flags(&selection),
            "--group 42 --queue 'points jobs' --kind exhausted --before 2026-12-01T08:00:00Z"
        );
    }
}
