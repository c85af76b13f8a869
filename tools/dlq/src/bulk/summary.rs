//! What a bulk run did: its counts, how it ended, and how to finish or retry it.

use super::action::Action;
use super::select::Selection;
use crate::args::Bulk;
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

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
    pub(super) fn done(&self) -> usize {
        self.replayed
            + self.queued
            + self.already_processed
            + self.discarded
            + self.skipped
            + self.failed
    }

    /// How a run with these counts ended: interrupted if letters were not reached, else by
    /// whether any failed.
    pub(super) fn ending(&self) -> Ending {
        if self.not_done > 0 {
            Ending::Interrupted
        } else if self.failed > 0 {
            Ending::SomeFailed
        } else {
            Ending::Done
        }
    }

    pub(super) fn counts(&self, action: Action) -> String {
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

/// The summary a run ends with, and the command that finishes or retries the same set.
pub(super) fn print_summary(
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
