//! The reference consumer's fixtures, for the platform's own tests (`shared`'s and the e2e
//! crate's): its fence name and its payload. The kit does not depend on the consumer itself
//! (its tests depend on the kit); a suite builds `AwardPoints::new(reference_name())`.

use crate::{job, message, run_batch};
use serde_json::{Value, json};
use shared::consumer::Consumer;
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::ConsumerName;
use sqlx::PgPool;

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

/// A trigger on the reference consumer's effect table refusing account `boom`: a statement that
/// fails (transiently, as any SQL error) for the job that awards it, and for a batch holding it.
pub async fn refuse_account_boom(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE FUNCTION reference.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.account_id = 'boom' THEN RAISE EXCEPTION 'ledger refused account boom'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_boom BEFORE INSERT ON reference.point_awards
             FOR EACH ROW EXECUTE FUNCTION reference.refuse_boom();",
    )
    .execute(pool)
    .await
    .expect("the refuse_boom trigger");
}

/// The points of `account`'s awards in the order they were written (the effect table's ids): for
/// checking the order jobs committed in.
pub async fn awards_in_order(pool: &PgPool, account: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT points FROM reference.point_awards WHERE account_id = $1 ORDER BY id",
    )
    .bind(account)
    .fetch_all(pool)
    .await
    .expect("reading the awards")
}
