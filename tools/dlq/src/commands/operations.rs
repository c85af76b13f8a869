//! `dlq operations`, `dlq operation` and `dlq cancel`: the bulk operations, one of them (and
//! following it), and stopping one.

use super::fields::short_time;
use crate::args::{OperationId, Progress};
use crate::bulk::{
    Followed, Interrupt, counts, exit_status, follow, print_ended, print_interrupted,
    print_operation, selection_flags,
};
use crate::client::{ApiError, Client, Operation};
use crate::exit;
use crate::table::Table;
use crate::terminal;
use std::time::Instant;

/// `dlq operations`: the latest operations, newest first.
pub(super) async fn list(client: &Client, json: bool) -> Result<u8, String> {
    let operations = client.operations().await.map_err(|e| e.to_string())?;
    if json {
        let value = serde_json::to_value(&operations).map_err(|e| e.to_string())?;
        println!("{}", terminal::json(&value, false));
        return Ok(exit::OK);
    }
    let mut t = Table::new([
        "created",
        "id",
        "action",
        "status",
        "worked",
        "planned",
        "by",
        "selection",
        "reason",
    ]);
    for op in &operations {
        let status = match op.failures {
            n if n > 0 && op.running() => format!("{} ({n} failures)", op.status),
            _ => op.status.clone(),
        };
        t.row([
            short_time(&op.created_at),
            op.id.to_string(),
            op.action.clone(),
            status,
            op.progress.worked().to_string(),
            op.planned.to_string(),
            op.requested_by.clone(),
            selection_flags(&op.selection),
            op.reason.clone(),
        ]);
    }
    t.print_indented(0);
    println!("{} operation(s), the latest first", operations.len());
    if let Some(running) = operations.iter().find(|op| op.running()) {
        println!("follow one: dlq operation {} --follow", running.id);
    }
    Ok(exit::OK)
}

/// `dlq operation`: one operation; with `follow`, its progress until it ends.
pub(super) async fn show(
    client: &Client,
    id: OperationId,
    follow_it: bool,
    progress: Progress,
    json: bool,
) -> Result<u8, String> {
    let op = read(client, id).await?;
    if !follow_it || !op.running() {
        if json {
            let out = serde_json::json!({ "operation": op });
            println!("{}", terminal::json(&out, false));
        } else {
            print_operation(&op);
        }
        return Ok(exit::OK);
    }
    if !json {
        println!(
            "Following {} operation {} (Ctrl-C stops following, not the operation):",
            op.action, op.id
        );
    }
    let started = Instant::now();
    let interrupt = Interrupt::on_ctrl_c();
    match follow(client, op, progress, &interrupt).await? {
        Followed::Ended(op) => {
            print_ended(&op, started.elapsed(), json);
            Ok(exit_status(&op))
        }
        Followed::Interrupted(op) => {
            print_interrupted(&op, "interrupted", json);
            Ok(exit::INTERRUPTED)
        }
    }
}

/// `dlq cancel`: stops a running operation, saying why.
pub(super) async fn cancel(
    client: &Client,
    id: OperationId,
    reason: &str,
    json: bool,
) -> Result<u8, String> {
    let op = read(client, id).await?;
    let cancelled = match client.cancel_operation(op.id, reason).await {
        Ok(cancelled) => cancelled,
        Err(ApiError::Refused {
            status: status @ (401 | 403),
            message,
            ..
        }) => {
            return Err(format!(
                "the token may not cancel it ({status}: {message}): cancelling a {action} \
                 operation needs the scope core.dead_letters.{action}, as starting one does; \
                 nothing changed",
                action = op.action
            ));
        }
        Err(ApiError::Refused {
            status: 409,
            message,
            ..
        }) => {
            return Err(format!(
                "{message}; nothing changed (see it: dlq operation {})",
                op.id
            ));
        }
        Err(e) => return Err(e.to_string()),
    };
    if json {
        let out = serde_json::json!({ "operation": cancelled });
        println!("{}", terminal::json(&out, false));
        return Ok(exit::OK);
    }
    println!(
        "Cancelled {} operation {}: {} of {} letter(s) worked ({}). What it did stays done; the \
         rest of its letters stay pending review: dlq list {} --status pending_review",
        cancelled.action,
        cancelled.id,
        cancelled.progress.worked(),
        cancelled.planned,
        counts(&cancelled.action, &cancelled.progress),
        selection_flags(&cancelled.selection)
    );
    Ok(exit::OK)
}

/// The operation a command names: a whole id read as it is; a prefix, the one operation among
/// the latest whose id starts with it (none, or two, is an error that says which).
async fn read(client: &Client, id: OperationId) -> Result<Operation, String> {
    let prefix = match id {
        OperationId::Whole(id) => {
            return client.operation(id).await.map_err(|e| e.to_string());
        }
        OperationId::Prefix(prefix) => prefix,
    };
    let digits = prefix.replace('-', "");
    let operations = client.operations().await.map_err(|e| e.to_string())?;
    let mut matching = operations
        .into_iter()
        .filter(|op| op.id.simple().to_string().starts_with(&digits));
    match (matching.next(), matching.next()) {
        (Some(one), None) => Ok(one),
        (None, _) => Err(format!(
            "no operation among the latest has an id starting with {prefix} (dlq operations \
             lists them): give the whole id"
        )),
        (Some(a), Some(b)) => Err(format!(
            "{prefix} is ambiguous: operations {} and {} (and maybe more) start with it; give \
             more of the id",
            a.id, b.id
        )),
    }
}
