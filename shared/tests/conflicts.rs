//! Issue 22: a different job under a reused job id. A producer bug that reuses a
//! `job_id` with another payload was acked as a duplicate: the second job never happened and
//! nothing recorded it. The fence now keeps a digest of what makes up the job (the payload, or
//! the fields the consumer names); a copy whose digest differs becomes a `conflict` letter (no
//! retry, an alert), on every path that finds a fence: the first delivery's claim, a repeat
//! delivery's ledger look, and batch mode's one-statement lookup. A copy with the same body, as
//! every replay sends, stays a duplicate.

use consumer::{AwardPoints, count_awards};
use serde_json::{Value, json};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::dead_letter::{ErrorKind, Settled, letters_for_job, record_unless_processed};
use shared::envelope::Envelope;
use shared::harness::{CommitMode, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::metrics::Metric;
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// Settles and writes the letter of a copy of `job_id` carrying `body` that failed on its last
/// attempt (as the harness does), with the digest of what makes up its job.
async fn record_failed_copy(pool: &PgPool, job_id: JobId, body: &str) -> Settled {
    let letter = TestLetter {
        last_error: "partner down".into(),
        ..TestLetter::new(Some(job_id), &reference_name(), QUEUE, body)
    };
    let digest = Envelope::<Value>::parse_job(body, &[]).unwrap().1;
    let wait = std::time::Duration::from_secs(1);
    record_unless_processed(pool, &letter.as_new(), Some(&digest), t0(), wait)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_reused_job_id_with_another_payload_is_a_conflict_letter_on_every_path(pool: PgPool) {
    for (mode, receive_count) in [
        (CommitMode::PerJob, 1),
        (CommitMode::PerJob, 2),
        (CommitMode::Batch, 1),
    ] {
        let harness = harness_in(&pool, award_points(), mode);
        let (job_id, body) = job(award(5));
        assert_eq!(
            deliver(&harness, &message(&body, 1)).await,
            RecordOutcome::Processed
        );
        let other = with_payload(&body, award(7));
        let outcome = deliver(&harness, &message(&other, receive_count)).await;
        assert_eq!(
            outcome.dead_letter_kind(),
            Some(ErrorKind::Conflict),
            "{mode:?}, delivery {receive_count}: {outcome:?}"
        );
        assert!(outcome.is_ack(), "no retry");
        let letters = letters_for_job(&pool, job_id, &reference_name())
            .await
            .unwrap();
        assert_eq!(letters.len(), 1, "{mode:?}");
        assert_eq!(
            letters[0].body.as_deref(),
            Some(other.as_str()),
            "the other job, whole"
        );
        assert!(
            letters[0].last_error.contains("another payload"),
            "{}",
            letters[0].last_error
        );
        assert_eq!(
            count_awards(&pool, job_id).await.unwrap(),
            1,
            "the first job only"
        );
        // The same body again, as a replay or a redelivery sends it, is a duplicate.
        assert_eq!(
            deliver(&harness, &message(&body, receive_count)).await,
            RecordOutcome::Duplicate,
            "{mode:?}"
        );
        assert_eq!(
            harness
                .metrics()
                .get(Metric::DeadLettered(ErrorKind::Conflict)),
            1
        );
    }
}

/// A consumer that names the fields making up its job: a copy that differs elsewhere (a note,
/// a timestamp its producer adds on every send) is still a duplicate.
struct Transfer(ConsumerName);

impl Consumer for Transfer {
    type Payload = Value;
    fn name(&self) -> &ConsumerName {
        &self.0
    }
    fn job_fields(&self) -> &[&str] {
        &["account_id", "amount"]
    }
    async fn handle(&self, _: &Job<Value>, _: &mut PgConnection) -> Result<(), ProcessError> {
        Ok(())
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn only_the_fields_a_consumer_names_make_up_its_job(pool: PgPool) {
    let harness = harness_in(&pool, Transfer(reference_name()), CommitMode::PerJob);
    let envelope = |payload: Value| {
        json!({"job_id": JobId(Uuid::from_u128(1)), "tenant_id": TenantId(Uuid::from_u128(2)),
            "correlation_id": "c", "payload": payload})
        .to_string()
    };
    let first = envelope(json!({"account_id": "a", "amount": "10.00", "sent": "08:00"}));
    assert_eq!(
        harness.process(&message(&first, 1)).await,
        RecordOutcome::Processed
    );
    let resent = envelope(json!({"sent": "08:05", "amount": "10.00", "account_id": "a"}));
    assert_eq!(
        harness.process(&message(&resent, 1)).await,
        RecordOutcome::Duplicate
    );
    let other = envelope(json!({"account_id": "a", "amount": "99.00", "sent": "08:00"}));
    assert_eq!(
        harness
            .process(&message(&other, 1))
            .await
            .dead_letter_kind(),
        Some(ErrorKind::Conflict)
    );
}

/// The other order (the reviewer's find): a job X fails under an id and gets its letter, then
/// another job Y under the same id commits. Before, Y's commit closed X's letter as "the job
/// committed through another delivery": X never ran, and its letter said it had. The letter
/// keeps X's digest now, and Y's commit closes only letters of the same job.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_commit_of_another_job_under_the_id_leaves_the_first_jobs_letter_pending(pool: PgPool) {
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        let harness = harness_in(&pool, award_points(), mode);
        let (job_id, x) = job(award(0)); // poison: points must be positive
        assert_eq!(
            deliver(&harness, &message(&x, 1)).await.dead_letter_kind(),
            Some(ErrorKind::Poison)
        );
        let y = with_payload(&x, award(7));
        assert_eq!(
            deliver(&harness, &message(&y, 1)).await,
            RecordOutcome::Processed
        );
        let letters = letters_for_job(&pool, job_id, &reference_name())
            .await
            .unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(
            letters[0].status,
            shared::dead_letter::ReviewStatus::PendingReview,
            "{mode:?}: X's letter stays pending: X never ran"
        );
        assert!(
            shared::dead_letter::fence_is_another_job(&pool, &letters[0])
                .await
                .unwrap(),
            "{mode:?}: and a replay sees the id taken by another job"
        );
        // The same job committing through another copy still closes its letter.
        let (same_job, first) = job(award(2));
        record_failed_copy(&pool, same_job, &first).await;
        assert_eq!(
            deliver(&harness, &message(&first, 1)).await,
            RecordOutcome::Processed
        );
        let closed = letters_for_job(&pool, same_job, &reference_name())
            .await
            .unwrap();
        assert_eq!(
            closed[0].status,
            shared::dead_letter::ReviewStatus::Discarded,
            "{mode:?}"
        );
    }
}

/// A letter settled through a fence that another job under the id committed (the last attempt
/// racing the other job's commit, a lost `COMMIT` reply): before, the claim found the fence and
/// acked the failed job with no letter at all. It is a `conflict` letter now.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_letter_settled_through_another_jobs_fence_is_a_conflict_not_a_silence(pool: PgPool) {
    let harness = harness(&pool, award_points());
    let (job_id, y) = job(award(7));
    assert_eq!(
        harness.process(&message(&y, 1)).await,
        RecordOutcome::Processed
    );
    let x = with_payload(&y, award(3));
    let settled = record_failed_copy(&pool, job_id, &x).await;
    assert!(matches!(settled, Settled::Conflict(_)), "{settled:?}");
    let letters = letters_for_job(&pool, job_id, &reference_name())
        .await
        .unwrap();
    assert_eq!(letters[0].error_kind, ErrorKind::Conflict);
    assert!(
        letters[0].last_error.contains("partner down"),
        "its own failure kept"
    );
    // A failed copy of the very job that committed gets no letter.
    assert_eq!(
        record_failed_copy(&pool, job_id, &y).await,
        Settled::AlreadyProcessed
    );
}
