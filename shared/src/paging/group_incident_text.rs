//! What a failure group's incident says: what failed, how often, an example, where to look.

use super::betterstack::clip;
use super::routes::with_route;
use crate::dead_letter::Group;
use serde_json::{Value, json};

/// The incident for a group: what failed, how often, an example, where to look, whom it pages,
/// and the incident resolved by hand before it, if any.
pub(super) fn incident_body(group: &Group, route: &super::Route, previous: Option<&str>) -> Value {
    let mut description = description(group);
    if let Some(previous) = previous {
        description = format!("{}\n\n{description}", raised_again_note(group, previous));
    }
    let mut body = json!({
        "name": format!("Dead letters: {} / {} on {}", group.consumer, group.error_kind, group.queue),
        "summary": format!("{} {} dead letter(s) on {}: {}", group.letter_count, group.error_kind,
            group.queue, clip(&group.pattern, 120)),
        "description": description,
    });
    with_route(&mut body, route);
    body
}

fn description(group: &Group) -> String {
    format!(
        "Group {id}: {count} dead letter(s) of consumer {consumer}, kind {kind}, on queue {queue}, \
         since {first}.\nThe failure: {pattern}\nFirst error: {sample}\nSample job_id: {job}, \
         correlation_id: {corr}\n\n\
         See it: dlq group {id}   (or GET /v1/core/dead-letter-groups/{id})\n\
         Its letters: dlq list --group {id}\n\
         Once the cause is fixed: dlq replay --group {id} --dry-run, then without --dry-run.\n\
         This incident is updated with the group's count and resolved when every letter of the \
         group has been replayed or discarded.",
        id = group.id,
        count = group.letter_count,
        consumer = group.consumer,
        kind = group.error_kind,
        queue = group.queue,
        first = group.first_letter_at.to_rfc3339(),
        pattern = group.pattern,
        sample = clip(&group.sample_error, 1000),
        job = group
            .sample_job_id
            .map(|j| j.to_string())
            .unwrap_or_else(|| "(none)".into()),
        corr = group.sample_correlation_id.as_deref().unwrap_or("(none)"),
    )
}

/// The comment that brings an incident up to the group's count.
pub(super) fn update_comment(group: &Group) -> String {
    format!(
        "Group {}: now {} dead letter(s), {} pending review; the latest at {}.\nLatest error: {}",
        group.id,
        group.letter_count,
        group.pending_count,
        group.last_letter_at.to_rfc3339(),
        clip(&group.last_error, 1000)
    )
}

/// What a group's new incident says when its previous one was resolved by hand.
fn raised_again_note(group: &Group, previous: &str) -> String {
    format!(
        "Raised again: incident {previous} was resolved in BetterStack while {pending} letter(s) \
         of group {id} were still pending review. This incident stays open until they are \
         replayed or discarded (dlq replay|discard --group {id}); the harness resolves it then. \
         Resolving it by hand raises it again.",
        pending = group.pending_count,
        id = group.id,
    )
}
