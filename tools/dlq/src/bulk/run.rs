//! A bulk command from start to end: checks, the plan, the prompt, the operation started on the
//! API, then followed to its end (or left running: Ctrl-C, `--detach`).

use super::action::Action;
use super::follow::{Followed, Interrupt, follow};
use super::plan::print_plan;
use super::summary::{exit_status, print_ended, print_interrupted};
use crate::args::Bulk;
use crate::client::{ApiError, Client, Plan};
use crate::exit;
use std::time::Instant;

/// The reason a dry run sends: the API asks for one, and records nothing.
const DRY_RUN_REASON: &str = "dlq --dry-run: the plan only";

/// Runs a bulk command; the exit status says how it ended.
pub async fn run(
    client: &Client,
    action: Action,
    bulk: &Bulk,
    reason: Option<&str>,
    json_out: bool,
) -> Result<u8, String> {
    if bulk.filter.is_empty() {
        return Err(format!(
            "say which letters to {}: --group, --queue, --kind, --job-id, … (every pending letter \
             is never a default)",
            action.verb()
        ));
    }
    let reason = reason_for(action, bulk.dry_run, reason)?;
    let filter = bulk.filter.operation_filter();
    let answer = client
        .plan_operation(
            action.verb(),
            &filter,
            reason.as_deref().unwrap_or(DRY_RUN_REASON),
        )
        .await
        .map_err(|e| refused(action, e))?;
    let plan: Plan = serde_json::from_value(answer["plan"].clone())
        .map_err(|e| format!("the API's plan is not what this tool expects: {e}"))?;
    // `--json`: one document on stdout; a real run's is its ending.
    if bulk.dry_run || !json_out {
        print_plan(client, action, bulk, &plan, &answer, json_out).await;
    }
    if bulk.dry_run {
        if !json_out {
            println!("Dry run: nothing was changed.");
        }
        return Ok(exit::OK);
    }
    if plan.letters == 0 {
        if json_out {
            let out = serde_json::json!({"operation": null, "ending": "nothing_to_do",
                                         "plan": answer["plan"]});
            println!("{}", crate::terminal::json(&out, false));
        } else {
            println!("Nothing to {}.", action.verb());
        }
        return Ok(exit::OK);
    }
    if !bulk.yes && !confirm(action, plan.letters)? {
        return Ok(exit::DECLINED);
    }
    let reason = reason.expect("checked above: only a dry run goes without a reason");
    let interrupt = Interrupt::on_ctrl_c();
    let op = client
        .start_operation(action.verb(), &filter, &reason)
        .await
        .map_err(|e| not_started(action, e))?;
    if bulk.detach || interrupt.caught() {
        if !json_out {
            println!(
                "Started {} operation {}: {} letter(s) planned; the scheduled function works it \
                 (every minute).",
                action.verb(),
                op.id,
                op.planned
            );
        }
        let ending = if bulk.detach {
            "detached"
        } else {
            "interrupted"
        };
        print_interrupted(&op, ending, json_out);
        return Ok(if bulk.detach {
            exit::OK
        } else {
            exit::INTERRUPTED
        });
    }
    if !json_out {
        println!(
            "Started {} operation {}: {} letter(s) planned. Following it (Ctrl-C stops following, \
             not the operation):",
            action.verb(),
            op.id,
            op.planned
        );
    }
    let started = Instant::now();
    match follow(client, op, bulk.progress, &interrupt).await? {
        Followed::Ended(op) => {
            print_ended(&op, started.elapsed(), json_out);
            Ok(exit_status(&op))
        }
        Followed::Interrupted(op) => {
            print_interrupted(&op, "interrupted", json_out);
            Ok(exit::INTERRUPTED)
        }
    }
}

/// The reason kept on each letter: required, but for a dry run.
fn reason_for(
    action: Action,
    dry_run: bool,
    reason: Option<&str>,
) -> Result<Option<String>, String> {
    match (reason.map(str::trim), dry_run) {
        (Some(r), _) if !r.is_empty() => Ok(Some(r.to_owned())),
        (_, true) => Ok(None),
        _ => Err(format!(
            "--reason is required: say why you {} these letters; it is kept on each of them",
            action.verb()
        )),
    }
}

/// The plan refused: a token without the action's scope said in those words (a dry run needs
/// it too: the plan is the operation's own route).
fn refused(action: Action, e: ApiError) -> String {
    match e {
        ApiError::Refused {
            status: status @ (401 | 403),
            message,
            ..
        } => format!(
            "the token may not {verb} letters ({status}: {message}): {verb}, and its dry run, \
             need the scope core.dead_letters.{verb} (DLQ_TOKEN / --token); nothing was changed",
            verb = action.verb(),
        ),
        e => e.to_string(),
    }
}

/// The start failed: if it may have reached the API, the operation may exist all the same.
fn not_started(action: Action, e: ApiError) -> String {
    let maybe = match &e {
        ApiError::Unreachable(_) => true,
        ApiError::Refused { status, .. } => *status >= 500,
    };
    if maybe {
        format!(
            "the {} operation's start got no answer ({e}): it may have started all the same. \
             Look with `dlq operations` before starting it again",
            action.verb()
        )
    } else {
        refused(action, e)
    }
}

/// Asks on the terminal; refuses to guess when there is none.
fn confirm(action: Action, letters: i64) -> Result<bool, String> {
    crate::terminal::confirmed(
        &format!(
            "{} {letters} letter(s), as one operation worked server-side?",
            capitalized(action.verb())
        ),
        "run with --dry-run first, then --yes",
    )
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
