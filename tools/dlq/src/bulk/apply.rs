//! Changing the pinned set one letter at a time, at the rate, with progress, until done,
//! stopped by a refusal every letter would meet, or interrupted.

use super::action::Action;
use super::summary::Summary;
use crate::args::{Bulk, Progress};
use crate::client::{Answer, ApiError, Client, Letter};
use crate::terminal::{Newlines, shown};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Why a bulk run stops at a refusal: every other letter would be refused the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The token was refused (401, 403).
    Token,
    /// The reason was refused (422 `invalid_body`).
    Reason,
}

/// Whether the token may `action` at all, asked before anything is read or planned: the same
/// request on the nil letter id, which no letter has. API Gateway's authorizer answers 401 or
/// 403 before the function runs; a token that may gets the function's 404 and nothing changes.
/// Any other answer is left to the run itself.
pub(super) async fn may_apply(client: &Client, action: Action) -> Result<(), String> {
    let probe = "dlq: checking the token's scope before the plan";
    let answer = match action {
        Action::Replay => client.replay(uuid::Uuid::nil(), probe).await,
        Action::Discard => client.discard(uuid::Uuid::nil(), probe).await,
    };
    match answer {
        Err(ApiError::Refused {
            status: status @ (401 | 403),
            message,
            ..
        }) => Err(format!(
            "the token may not {verb} letters ({status}: {message}): {verb} needs the scope \
             core.dead_letters.{verb} (DLQ_TOKEN / --token); nothing was read or changed",
            verb = action.verb(),
        )),
        _ => Ok(()),
    }
}

/// Changes `letters` one at a time, at most one every `pause`, counting each in `summary`,
/// until every one is done or Ctrl-C; a refusal every other letter would meet too stops the
/// run, and is returned with the line that said it.
pub(super) async fn apply_all(
    client: &Client,
    action: Action,
    bulk: &Bulk,
    letters: &[Letter],
    reason: &str,
    pause: Duration,
    summary: &mut Summary,
) -> Option<(String, Stop)> {
    let interrupted = on_ctrl_c();
    let bar = progress_bar(bulk.progress, letters.len());
    let mut ticker = tokio::time::interval(pause);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused = None;
    for letter in letters {
        ticker.tick().await;
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        let (line, stop) = apply(client, action, letter, reason, summary).await;
        let line = shown(&line, Newlines::Escape);
        if bulk.progress == Progress::Lines {
            eprintln!("{line}");
        }
        bar.set_message(summary.counts(action));
        bar.inc(1);
        if let Some(stop) = stop {
            refused = Some((line, stop));
            break;
        }
    }
    bar.finish_and_clear();
    refused
}

/// A flag that Ctrl-C sets: the run stops before the next letter.
fn on_ctrl_c() -> Arc<AtomicBool> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    interrupted
}

/// Changes one letter; counts what happened and returns a line saying it, and whether to stop
/// (a refusal every other letter would meet too).
async fn apply(
    client: &Client,
    action: Action,
    letter: &Letter,
    reason: &str,
    summary: &mut Summary,
) -> (String, Option<Stop>) {
    if action == Action::Replay && letter.job_id.is_none() {
        summary.skipped += 1;
        return (
            format!("skipped {}: no job id, not replayable", letter.id),
            None,
        );
    }
    let answer = match action {
        Action::Replay => client.replay(letter.id, reason).await,
        Action::Discard => client.discard(letter.id, reason).await,
    };
    match answer {
        Ok(answer) => (done(action, letter, &answer, summary), None),
        Err(e) if e.code() == Some("not_pending") => {
            summary.skipped += 1;
            (format!("skipped {}: {e}", letter.id), None)
        }
        Err(e) => {
            summary.failed += 1;
            let stop = stop_for(&e);
            (format!("failed {}: {e}", letter.id), stop)
        }
    }
}

/// A letter the API changed: counted by what became of it, and the line that says so.
fn done(action: Action, letter: &Letter, answer: &Answer, summary: &mut Summary) -> String {
    if action == Action::Discard {
        summary.discarded += 1;
        return format!("discarded {}", letter.id);
    }
    if answer.body["replay"]["fence_exists"] == true {
        summary.already_processed += 1;
        return format!("already processed {} (nothing sent)", letter.id);
    }
    if answer.status == 202 {
        summary.queued += 1;
        return format!("queued {} (the scheduled run sends it)", letter.id);
    }
    summary.replayed += 1;
    format!(
        "replayed {} (message {})",
        letter.id,
        answer.body["replay"]["message_id"].as_str().unwrap_or("?")
    )
}

/// Whether a refusal is one every other letter would meet too (the token, the reason).
fn stop_for(e: &ApiError) -> Option<Stop> {
    match e {
        ApiError::Refused {
            status: 401 | 403, ..
        } => Some(Stop::Token),
        ApiError::Refused {
            status: 422, code, ..
        } if code == "invalid_body" => Some(Stop::Reason),
        _ => None,
    }
}

fn progress_bar(progress: Progress, len: usize) -> ProgressBar {
    let target = match progress {
        Progress::Auto if std::io::stderr().is_terminal() => ProgressDrawTarget::stderr(),
        _ => ProgressDrawTarget::hidden(),
    };
    let bar = ProgressBar::with_draw_target(Some(len as u64), target);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (about {eta} left)",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}
