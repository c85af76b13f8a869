//! A bulk command from start to end: checks, the pinned set, the plan, the prompt, the run and
//! its summary.

use super::action::Action;
use super::apply::{Stop, apply_all, may_apply};
use super::plan::print_plan;
use super::select::{Selection, patterns, select};
use super::summary::{Ending, Summary, print_summary};
use crate::args::{Bulk, MAX_RATE, MIN_RATE, parse_rate};
use crate::client::Client;
use std::time::{Duration, Instant};

/// Runs a bulk command: pins and reads the set, prints the plan, asks, then changes one letter
/// at a time at the rate, with progress, until done or interrupted.
pub async fn run(
    client: &Client,
    action: Action,
    bulk: &Bulk,
    reason: Option<&str>,
    json_out: bool,
) -> Result<(Ending, Summary), String> {
    if bulk.filter.is_empty() {
        return Err(format!(
            "say which letters to {}: --group, --queue, --kind, --job-id, … (every pending letter \
             is never a default)",
            action.verb()
        ));
    }
    let pause = pause(bulk)?;
    let reason = reason_for(action, bulk.dry_run, reason)?;
    check_scope(client, action, bulk.dry_run).await?;
    let selection = select(client, bulk).await.map_err(|e| e.to_string())?;
    let patterns = patterns(client, &selection).await;
    print_plan(action, bulk, &selection, &patterns, json_out);
    let mut summary = Summary {
        selected: selection.letters.len(),
        ..Default::default()
    };
    if let Some(ending) = ends_unchanged(action, bulk, &selection, json_out)? {
        return Ok((ending, summary));
    }
    let reason = reason.expect("checked above: only a dry run goes without a reason");
    let started = Instant::now();
    let letters = &selection.letters;
    let refused = apply_all(client, action, bulk, letters, &reason, pause, &mut summary).await;
    summary.not_done = summary.selected - summary.done();
    if let Some((line, stop)) = refused {
        return Err(stopped(action, &line, stop, &summary));
    }
    let ending = summary.ending();
    let took = started.elapsed();
    print_summary(action, bulk, &selection, &summary, ending, took, json_out);
    Ok((ending, summary))
}

/// The pause between two letters, from `--rate`.
fn pause(bulk: &Bulk) -> Result<Duration, String> {
    // Checked by clap already; again here for a `Bulk` built otherwise.
    parse_rate(&bulk.rate.to_string())
        .ok()
        .and_then(|rate| Duration::try_from_secs_f64(1.0 / rate).ok())
        .ok_or_else(|| {
            format!(
                "--rate must be a finite number from {MIN_RATE} to {MAX_RATE} letters per \
                 second, got {}",
                bulk.rate
            )
        })
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

/// Stops a run whose token may not `action`; a dry run goes on, saying so.
async fn check_scope(client: &Client, action: Action, dry_run: bool) -> Result<(), String> {
    if let Err(refused) = may_apply(client, action).await {
        if !dry_run {
            return Err(refused);
        }
        eprintln!("dlq: {refused}; the dry run goes on, but the real run would stop here");
    }
    Ok(())
}

/// How the run ends before anything changes, if it does: a dry run, nothing to do, or a no at
/// the prompt.
fn ends_unchanged(
    action: Action,
    bulk: &Bulk,
    selection: &Selection,
    json_out: bool,
) -> Result<Option<Ending>, String> {
    if bulk.dry_run {
        if !json_out {
            println!("Dry run: nothing was changed.");
        }
        return Ok(Some(Ending::Done));
    }
    if selection.letters.is_empty() {
        if !json_out {
            println!("Nothing to {}.", action.verb());
        }
        return Ok(Some(Ending::Done));
    }
    if !bulk.yes && !confirm(action, selection.letters.len())? {
        return Ok(Some(Ending::Declined));
    }
    Ok(None)
}

/// Asks on the terminal; refuses to guess when there is none.
fn confirm(action: Action, letters: usize) -> Result<bool, String> {
    crate::terminal::confirmed(
        &format!("{} {letters} letter(s)?", capitalized(action.verb())),
        "run with --dry-run first, then --yes",
    )
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// The error a run stopped by a refusal ends with: the refusal, why every letter would meet
/// it, and how many letters it left untouched.
fn stopped(action: Action, line: &str, stop: Stop, summary: &Summary) -> String {
    let why = match stop {
        Stop::Token => format!(
            "The token lacks what {} needs (scope core.dead_letters.{}), or has expired",
            action.verb(),
            action.verb()
        ),
        Stop::Reason => "The API refuses the reason, as it would for every letter: \
                         change --reason"
            .to_owned(),
    };
    format!(
        "stopped at the first letter: {line}. {why}; {} letter(s) untouched",
        summary.not_done + summary.failed
    )
}
