//! Replaying or discarding many letters at once, safely.
//!
//! Invariants: the set is pinned before anything changes (letters pending review written before
//! one instant, `--before`), so letters written while the run goes (a replay that fails again
//! included) are never picked up; a letter is changed only through the API's one-letter routes,
//! one at a time at a bounded rate, so an interrupted run leaves every letter either done or
//! untouched, and running the same command again (same `--before`) finishes the rest without
//! touching what is done. A dry run only reads.

use crate::args::{Bulk, Progress};
use crate::client::{ApiError, Client, Letter};
use crate::table::Table;
use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What a bulk command does to each letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Replay (republish with the same job id).
    Replay,
    /// Discard with a reason.
    Discard,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Discard => "discard",
        }
    }
}

/// The pinned set: every letter pending review that the filter selects, written before `pin`.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The instant the set is pinned at.
    pub pin: DateTime<Utc>,
    /// The letters, newest first.
    pub letters: Vec<Letter>,
}

/// Reads the whole pinned set, page by page.
pub async fn select(client: &Client, bulk: &Bulk) -> Result<Selection, ApiError> {
    let pin = bulk.filter.before.unwrap_or_else(Utc::now);
    let mut filter = bulk.filter.clone();
    filter.before = Some(pin);
    let mut query = filter.query();
    query.push(("status".into(), "pending_review".into()));
    query.push(("limit".into(), "200".into()));
    let mut letters = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut q = query.clone();
        if let Some(c) = &cursor {
            q.push(("cursor".into(), c.clone()));
        }
        let page = client.letters(&q).await?;
        letters.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(Selection { pin, letters })
}

/// What a replay of `letter` would do, by what the API says of its job's fence.
fn predicted(letter: &Letter) -> Effect {
    match (letter.job_id, letter.fence_exists) {
        (None, _) => Effect::NotReplayable,
        (Some(_), Some(true)) => Effect::AlreadyProcessed,
        (Some(_), _) => Effect::Run,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Effect {
    Run,
    AlreadyProcessed,
    NotReplayable,
}

/// The counts a bulk run ends with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Letters in the pinned set.
    pub selected: usize,
    /// Replayed and sent: the consumer runs the job, at most once.
    pub replayed: usize,
    /// Replayed but the queue refused the message just now: the scheduled run sends it.
    pub queued: usize,
    /// Replayed without sending: the job's effect had committed already.
    pub already_processed: usize,
    /// Discarded.
    pub discarded: usize,
    /// Left alone: reviewed by someone else meanwhile, or not replayable (no job id).
    pub skipped: usize,
    /// Refused or unanswered: still pending review; run the command again.
    pub failed: usize,
    /// Not reached: the run was interrupted.
    pub not_done: usize,
}

impl Summary {
    fn done(&self) -> usize {
        self.replayed
            + self.queued
            + self.already_processed
            + self.discarded
            + self.skipped
            + self.failed
    }

    fn counts(&self, action: Action) -> String {
        match action {
            Action::Replay => format!(
                "replayed {} · queued {} · already processed {} · skipped {} · failed {}",
                self.replayed, self.queued, self.already_processed, self.skipped, self.failed
            ),
            Action::Discard => format!(
                "discarded {} · skipped {} · failed {}",
                self.discarded, self.skipped, self.failed
            ),
        }
    }
}

/// How a bulk run ended, for the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every letter done (nothing failed).
    Done,
    /// Some letters failed.
    SomeFailed,
    /// The operator declined at the prompt; nothing changed.
    Declined,
    /// Interrupted; what was done is done, the rest untouched.
    Interrupted,
}

/// The failure each group of the set stands for (its pattern), for the plan; at most the first
/// 20 groups are looked up, the rest show without it.
async fn patterns(client: &Client, selection: &Selection) -> BTreeMap<i64, String> {
    let ids: std::collections::BTreeSet<i64> = selection
        .letters
        .iter()
        .filter_map(|l| l.group_id)
        .collect();
    let mut patterns = BTreeMap::new();
    for id in ids.into_iter().take(20) {
        if let Ok(group) = client.group(id).await {
            patterns.insert(id, group.pattern);
        }
    }
    patterns
}

/// Prints the plan: how many letters, which groups, and what replay would do to them.
fn print_plan(
    action: Action,
    bulk: &Bulk,
    selection: &Selection,
    patterns: &BTreeMap<i64, String>,
    json_out: bool,
) {
    let mut groups: BTreeMap<Option<i64>, (String, String, String, usize)> = BTreeMap::new();
    let mut effects: BTreeMap<Effect, usize> = BTreeMap::new();
    for letter in &selection.letters {
        let entry = groups.entry(letter.group_id).or_insert_with(|| {
            (
                letter.consumer.clone(),
                letter.queue.clone(),
                letter.error_kind.clone(),
                0,
            )
        });
        entry.3 += 1;
        *effects.entry(predicted(letter)).or_default() += 1;
    }
    let count = |e| effects.get(&e).copied().unwrap_or(0);
    if json_out {
        let groups: Vec<_> = groups
            .iter()
            .map(|(id, (c, q, k, n))| {
                json!({"group_id": id, "consumer": c, "queue": q, "error_kind": k, "letters": n,
                "failure": id.and_then(|g| patterns.get(&g))})
            })
            .collect();
        let plan = json!({
            "action": action.verb(), "dry_run": bulk.dry_run, "pinned_before": crate::args::rfc3339(selection.pin),
            "letters": selection.letters.len(), "groups": groups,
            "would": match action {
                Action::Replay => json!({"run": count(Effect::Run), "already_processed": count(Effect::AlreadyProcessed),
                                         "not_replayable": count(Effect::NotReplayable)}),
                Action::Discard => json!({"discard": selection.letters.len()}),
            },
        });
        println!("{}", crate::terminal::json(&plan, false));
        return;
    }
    println!(
        "Plan: {} {} letter(s) pending review, written before {} ({} group(s))",
        action.verb(),
        selection.letters.len(),
        crate::args::rfc3339(selection.pin),
        groups.len()
    );
    let mut table = Table::new(["group", "consumer", "queue", "kind", "letters", "failure"]);
    for (id, (consumer, queue, kind, n)) in &groups {
        table.row([
            id.map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
            consumer.clone(),
            queue.clone(),
            kind.clone(),
            n.to_string(),
            id.and_then(|g| patterns.get(&g).cloned())
                .unwrap_or_default(),
        ]);
    }
    table.print_indented(2);
    if action == Action::Replay {
        println!("What the replay would do:");
        println!(
            "  run                {:>6}  no fence yet: the consumer runs the job, at most once",
            count(Effect::Run)
        );
        println!(
            "  already processed  {:>6}  the job's effect committed: marked replayed, nothing sent",
            count(Effect::AlreadyProcessed)
        );
        println!(
            "  not replayable     {:>6}  poison without a job id: left alone (discard them)",
            count(Effect::NotReplayable)
        );
    }
}

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
    // Checked by clap already; again here for a `Bulk` built otherwise.
    let pause = crate::args::parse_rate(&bulk.rate.to_string())
        .ok()
        .and_then(|rate| Duration::try_from_secs_f64(1.0 / rate).ok())
        .ok_or_else(|| {
            format!(
                "--rate must be a finite number from {} to {} letters per second, got {}",
                crate::args::MIN_RATE,
                crate::args::MAX_RATE,
                bulk.rate
            )
        })?;
    let reason = match (reason.map(str::trim), bulk.dry_run) {
        (Some(r), _) if !r.is_empty() => Some(r.to_owned()),
        (_, true) => None,
        _ => {
            return Err(format!(
                "--reason is required: say why you {} these letters; it is kept on each of them",
                action.verb()
            ));
        }
    };
    if let Err(refused) = may_apply(client, action).await {
        if !bulk.dry_run {
            return Err(refused);
        }
        eprintln!("dlq: {refused}; the dry run goes on, but the real run would stop here");
    }
    let selection = select(client, bulk).await.map_err(|e| e.to_string())?;
    print_plan(
        action,
        bulk,
        &selection,
        &patterns(client, &selection).await,
        json_out,
    );
    let mut summary = Summary {
        selected: selection.letters.len(),
        ..Default::default()
    };
    if bulk.dry_run {
        if !json_out {
            println!("Dry run: nothing was changed.");
        }
        return Ok((Ending::Done, summary));
    }
    if selection.letters.is_empty() {
        if !json_out {
            println!("Nothing to {}.", action.verb());
        }
        return Ok((Ending::Done, summary));
    }
    if !bulk.yes && !confirm(action, selection.letters.len())? {
        return Ok((Ending::Declined, summary));
    }
    let reason = reason.expect("checked above: only a dry run goes without a reason");
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    let bar = progress_bar(bulk.progress, selection.letters.len());
    let started = Instant::now();
    let mut ticker = tokio::time::interval(pause);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused = None;
    for letter in &selection.letters {
        ticker.tick().await;
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        let (line, stop) = apply(client, action, letter, &reason, &mut summary).await;
        let line = crate::terminal::shown(&line, crate::terminal::Newlines::Escape);
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
    summary.not_done = summary.selected - summary.done();
    if let Some((line, stop)) = refused {
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
        return Err(format!(
            "stopped at the first letter: {line}. {why}; {} letter(s) untouched",
            summary.not_done + summary.failed
        ));
    }
    let ending = if summary.not_done > 0 {
        Ending::Interrupted
    } else if summary.failed > 0 {
        Ending::SomeFailed
    } else {
        Ending::Done
    };
    print_summary(
        action,
        bulk,
        &selection,
        &summary,
        ending,
        started.elapsed(),
        json_out,
    );
    Ok((ending, summary))
}

/// Why a bulk run stops at a refusal: every other letter would be refused the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The token was refused (401, 403).
    Token,
    /// The reason was refused (422 `invalid_body`).
    Reason,
}

/// Whether the token may `action` at all, asked before anything is read or planned: the same
/// request on the nil letter id, which no letter has. API Gateway's authorizer answers 401 or
/// 403 before the function runs; a token that may gets the function's 404 and nothing changes.
/// Any other answer is left to the run itself.
async fn may_apply(client: &Client, action: Action) -> Result<(), String> {
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
    let line = match answer {
        Ok(_) if action == Action::Discard => {
            summary.discarded += 1;
            format!("discarded {}", letter.id)
        }
        Ok(answer) if answer.body["replay"]["fence_exists"] == true => {
            summary.already_processed += 1;
            format!("already processed {} (nothing sent)", letter.id)
        }
        Ok(answer) if answer.status == 202 => {
            summary.queued += 1;
            format!("queued {} (the scheduled run sends it)", letter.id)
        }
        Ok(answer) => {
            summary.replayed += 1;
            format!(
                "replayed {} (message {})",
                letter.id,
                answer.body["replay"]["message_id"].as_str().unwrap_or("?")
            )
        }
        Err(e) if e.code() == Some("not_pending") => {
            summary.skipped += 1;
            format!("skipped {}: {e}", letter.id)
        }
        Err(e) => {
            summary.failed += 1;
            let stop = match &e {
                ApiError::Refused {
                    status: 401 | 403, ..
                } => Some(Stop::Token),
                ApiError::Refused {
                    status: 422, code, ..
                } if code == "invalid_body" => Some(Stop::Reason),
                _ => None,
            };
            return (format!("failed {}: {e}", letter.id), stop);
        }
    };
    (line, None)
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

fn print_summary(
    action: Action,
    bulk: &Bulk,
    selection: &Selection,
    summary: &Summary,
    ending: Ending,
    took: Duration,
    json_out: bool,
) {
    let mut rerun = bulk.filter.clone();
    rerun.before = Some(selection.pin);
    let again = format!(
        "dlq {} {} --reason <the same reason>",
        action.verb(),
        rerun.flags()
    );
    if json_out {
        let out = json!({"summary": summary, "ending": format!("{ending:?}"), "seconds": took.as_secs_f64(),
                         "rerun": (ending != Ending::Done).then_some(again)});
        println!("{}", crate::terminal::json(&out, false));
        return;
    }
    println!(
        "{} {} of {} letter(s) in {:.1} s: {}",
        match ending {
            Ending::Interrupted => "Interrupted after",
            _ => "Done:",
        },
        summary.done(),
        summary.selected,
        took.as_secs_f64(),
        summary.counts(action)
    );
    if ending == Ending::Interrupted {
        println!(
            "{} letter(s) not reached, untouched. Finish the same set with:\n  {again}",
            summary.not_done
        );
    } else if summary.failed > 0 {
        println!(
            "Failed letters are still pending review. Run the same set again to retry them:\n  {again}"
        );
    }
}
