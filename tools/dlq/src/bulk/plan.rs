//! The plan a bulk command prints before it changes anything: the API's dry run of the
//! operation (how many letters pending review the filter selects now, of which kinds, how many
//! a replay could not take), and the failure group it names.

use super::action::Action;
use crate::args::Bulk;
use crate::client::{Client, Plan};
use crate::terminal::{Newlines, shown};

/// Prints the plan (`dlq` words; `--json`: the API's answer).
pub(super) async fn print_plan(
    client: &Client,
    action: Action,
    bulk: &Bulk,
    plan: &Plan,
    answer: &serde_json::Value,
    json_out: bool,
) {
    if json_out {
        println!("{}", crate::terminal::json(answer, false));
        return;
    }
    println!(
        "Plan: {} {} letter(s) pending review, selected by {} (letters written from now on are \
         not taken)",
        action.verb(),
        plan.letters,
        bulk.filter.flags()
    );
    if let Some(id) = bulk.filter.group
        && let Ok(g) = client.group(id).await
    {
        let one_line = |s: &str| shown(s, Newlines::Escape);
        println!(
            "  group {id} ({}): {} / {} on {}: {}",
            one_line(&g.status),
            one_line(&g.consumer),
            one_line(&g.error_kind),
            one_line(&g.queue),
            one_line(&g.pattern)
        );
    }
    if !plan.by_kind.is_empty() {
        let kinds: Vec<String> = plan
            .by_kind
            .iter()
            .map(|(kind, n)| format!("{} {n}", shown(kind, Newlines::Escape)))
            .collect();
        println!("  by kind: {}", kinds.join(" · "));
    }
    if action == Action::Replay {
        println!(
            "  not replayable: {} (unsettled, or a poison without a job id): left pending",
            plan.not_replayable
        );
        println!(
            "  A letter whose job committed meanwhile is replayed as already processed: nothing \
             is sent for it."
        );
    }
}
