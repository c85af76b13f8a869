//! What the model-based test (`shared/tests/model.rs`) found, each as a minimal plain test
//! driving the library directly, so a finding is shown not to be the model's own mistake.
//!
//! Each asserts the promise, and was red on the tree it was written against.

use consumer::AwardPoints;
use shared::dead_letter::ErrorKind;
use shared::harness::{CommitMode, RecordOutcome};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// `body` (points 100) with the points written `1e2`: the same job by its digest, poison to
/// the payload type's `i64`.
fn spelled_1e2(body: &str) -> String {
    let spelled = body.replace(r#""points":100"#, r#""points":1e2"#);
    assert_ne!(spelled, body);
    spelled
}

// ---------------------------------------------------------------------------------------------
// FOUND BY THE MODEL (seed 7). A letter written (or re-acked) for a copy of a job that never
// ran (a number spelling the payload type refuses) wipes the job id's execution ledger while a
// valid copy of the same job is between its attempts: the valid copy's executions are no
// longer charged, so it runs more often than `RETRY_MAX_ATTEMPTS` before it is `exhausted`
// ("Attempts are executions": "a job over its budget is dead-lettered without running again").
// Minimal model history (FIFO, per job; the same on a standard queue):
//   send m0 = job1a with points `1001.0`; send m1 = job1a exact (its account failing, transient);
//   deliver [m0, m1] -> m0 Letter(poison), m1 Retry(attempt 1)   (ledger: 1 execution)
//   m0's delete is lost; deliver [m0] -> Letter(poison) (acked by its letter)  (ledger: 0)
// Cause: `shared/src/dead_letter/record.rs` `settle_in`, the `FenceClaim::Claimed` arm, deletes
// `core.job_executions` for the job id on every letter it settles, including one for a copy
// that never ran and a redelivery acked by the letter it already has.
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_poison_spelling_letter_does_not_wipe_the_executions_of_a_valid_copy(pool: PgPool) {
    let failing = harness_in(
        &pool,
        Counting::failing(award_points(), Fault::AlwaysTransient),
        CommitMode::PerJob,
    );
    let (job_id, body) = job(award(100));
    let valid = message(&body, 1);
    let poison = message(&spelled_1e2(&body), 1);

    // The poison copy first: its letter (nothing has run yet).
    let first = failing.process(&poison).await;
    assert_eq!(
        first.dead_letter_kind(),
        Some(ErrorKind::Poison),
        "{first:?}"
    );
    // The valid copy runs once and fails transiently: one execution charged.
    let ran = failing.process(&valid).await;
    assert!(
        matches!(ran, RecordOutcome::Retry { attempt: 1, .. }),
        "{ran:?}"
    );
    assert_eq!(executions(&pool, job_id, &reference_name()).await, 1);

    // The poison copy comes back (a lost delete): acked by its letter, it runs nothing.
    let again = shared::harness::IncomingMessage {
        receive_count: 2,
        ..poison.clone()
    };
    let acked = failing.process(&again).await;
    assert!(acked.is_ack(), "{acked:?}");
    assert_eq!(
        executions(&pool, job_id, &reference_name()).await,
        1,
        "the valid copy ran once and is charged nothing (its next delivery counts attempt 1 \
         again); the redelivered poison copy's letter wiped the ledger"
    );
}

/// The same hole's consequence: interleaved with redeliveries of the poison copy, the valid
/// copy runs as often as it is delivered and is never `exhausted`.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_valid_copy_runs_at_most_its_attempts_whatever_its_poison_copies_do(pool: PgPool) {
    let counting = Counting::failing(award_points(), Fault::AlwaysTransient);
    let failing = harness_in(&pool, counting, CommitMode::PerJob);
    let max = failing.settings().policy.max_attempts();
    let (job_id, body) = job(award(100));
    let valid = message(&body, 1);
    let poison = message(&spelled_1e2(&body), 1);
    let mut letter_kind = None;
    for n in 1..=(2 * max + 2) {
        let outcome = failing
            .process(&shared::harness::IncomingMessage {
                receive_count: n,
                ..valid.clone()
            })
            .await;
        if let Some(kind) = outcome.dead_letter_kind() {
            letter_kind = Some(kind);
            break;
        }
        let acked = failing
            .process(&shared::harness::IncomingMessage {
                receive_count: n,
                ..poison.clone()
            })
            .await;
        assert!(acked.is_ack(), "{acked:?}");
    }
    let runs = failing.consumer().calls();
    assert!(
        letter_kind == Some(ErrorKind::Exhausted) && runs <= max as usize,
        "the job ran {runs} times (budget {max}), its letter: {letter_kind:?}; ledger now {}",
        executions(&pool, job_id, &reference_name()).await
    );
}
