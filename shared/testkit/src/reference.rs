//! The reference consumer's fixtures, for the platform's own tests (`shared`'s and the e2e
//! crate's): its fence name and its payload. The kit does not depend on the consumer itself
//! (its tests depend on the kit); a suite builds `AwardPoints::new(reference_name())`.

use crate::{job, message, run_batch};
use serde_json::{Value, json};
use shared::consumer::Consumer;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::ConsumerName;

/// The name the reference consumer fences under.
pub const REFERENCE: &str = "award-points";

/// [`REFERENCE`] as a consumer name.
pub fn reference_name() -> ConsumerName {
    crate::consumer_name(REFERENCE)
}

/// The reference consumer's payload: `points` to account `acct-1`.
pub fn award(points: i64) -> Value {
    json!({"account_id": "acct-1", "points": points})
}

/// Delivers `msg` as the harness's commit mode would see it: alone per job; in batch mode, in
/// an SQS batch with a new award of its own (so the batch's transaction is the one that runs
/// it), whose outcome must be `Processed`. Returns `msg`'s outcome.
pub async fn deliver<C: Consumer>(harness: &Harness<C>, msg: &IncomingMessage) -> RecordOutcome {
    match harness.settings().commit {
        CommitMode::PerJob => harness.process(msg).await,
        CommitMode::Batch => {
            let (_, companion) = job(award(1));
            let batch = [msg.clone(), message(&companion, 1)];
            let mut outcomes = run_batch(harness, &batch).await;
            assert_eq!(outcomes[1], RecordOutcome::Processed, "{outcomes:?}");
            outcomes.swap_remove(0)
        }
    }
}
