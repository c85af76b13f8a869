//! The plan a bulk command prints before it changes anything: how many letters, which groups,
//! and what a replay would do to them.

use super::action::Action;
use super::select::Selection;
use crate::args::{Bulk, rfc3339};
use crate::client::Letter;
use crate::table::Table;
use serde_json::json;
use std::collections::BTreeMap;

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

/// A group of the set as the plan shows it: where its letters failed, and how many there are.
struct GroupLine {
    consumer: String,
    queue: String,
    kind: String,
    letters: usize,
}

/// The set counted for the plan: its groups (letters without one together, under `None`) and
/// what a replay would do to its letters.
struct Tally {
    groups: BTreeMap<Option<i64>, GroupLine>,
    effects: BTreeMap<Effect, usize>,
}

impl Tally {
    fn of(selection: &Selection) -> Self {
        let mut groups: BTreeMap<Option<i64>, GroupLine> = BTreeMap::new();
        let mut effects: BTreeMap<Effect, usize> = BTreeMap::new();
        for letter in &selection.letters {
            let entry = groups.entry(letter.group_id).or_insert_with(|| GroupLine {
                consumer: letter.consumer.clone(),
                queue: letter.queue.clone(),
                kind: letter.error_kind.clone(),
                letters: 0,
            });
            entry.letters += 1;
            *effects.entry(predicted(letter)).or_default() += 1;
        }
        Self { groups, effects }
    }

    fn count(&self, effect: Effect) -> usize {
        self.effects.get(&effect).copied().unwrap_or(0)
    }
}

/// Prints the plan: how many letters, which groups, and what replay would do to them.
pub(super) fn print_plan(
    action: Action,
    bulk: &Bulk,
    selection: &Selection,
    patterns: &BTreeMap<i64, String>,
    json_out: bool,
) {
    let tally = Tally::of(selection);
    if json_out {
        print_json(action, bulk, selection, patterns, &tally);
        return;
    }
    println!(
        "Plan: {} {} letter(s) pending review, written before {} ({} group(s))",
        action.verb(),
        selection.letters.len(),
        rfc3339(selection.pin),
        tally.groups.len()
    );
    print_groups(&tally, patterns);
    if action == Action::Replay {
        print_effects(&tally);
    }
}

/// The plan as one JSON value (`--json`).
fn print_json(
    action: Action,
    bulk: &Bulk,
    selection: &Selection,
    patterns: &BTreeMap<i64, String>,
    tally: &Tally,
) {
    let count = |e| tally.count(e);
    let groups: Vec<_> = tally
        .groups
        .iter()
        .map(|(id, line)| {
            json!({"group_id": id, "consumer": line.consumer, "queue": line.queue,
            "error_kind": line.kind, "letters": line.letters,
            "failure": id.and_then(|g| patterns.get(&g))})
        })
        .collect();
    let plan = json!({
        "action": action.verb(), "dry_run": bulk.dry_run, "pinned_before": rfc3339(selection.pin),
        "letters": selection.letters.len(), "groups": groups,
        "would": match action {
            Action::Replay => json!({"run": count(Effect::Run), "already_processed": count(Effect::AlreadyProcessed),
                                     "not_replayable": count(Effect::NotReplayable)}),
            Action::Discard => json!({"discard": selection.letters.len()}),
        },
    });
    println!("{}", crate::terminal::json(&plan, false));
}

/// The set's groups, a row each.
fn print_groups(tally: &Tally, patterns: &BTreeMap<i64, String>) {
    let mut table = Table::new(["group", "consumer", "queue", "kind", "letters", "failure"]);
    for (id, line) in &tally.groups {
        table.row([
            id.map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
            line.consumer.clone(),
            line.queue.clone(),
            line.kind.clone(),
            line.letters.to_string(),
            id.and_then(|g| patterns.get(&g).cloned())
                .unwrap_or_default(),
        ]);
    }
    table.print_indented(2);
}

/// What a replay would do to the set's letters, by their jobs' fences.
fn print_effects(tally: &Tally) {
    println!("What the replay would do:");
    println!(
        "  run                {:>6}  no fence yet: the consumer runs the job, at most once",
        tally.count(Effect::Run)
    );
    println!(
        "  already processed  {:>6}  the job's effect committed: marked replayed, nothing sent",
        tally.count(Effect::AlreadyProcessed)
    );
    println!(
        "  not replayable     {:>6}  poison without a job id: left alone (discard them)",
        tally.count(Effect::NotReplayable)
    );
}
