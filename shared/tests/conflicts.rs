//! Issue 22, hole 8: a different job under a reused job id. A producer bug that reuses a
//! `job_id` with another payload was acked as a duplicate: the second job never happened and
//! nothing recorded it. The fence now keeps a digest of what makes up the job (the payload, or
//! the fields the consumer names); a copy whose digest differs becomes a `conflict` letter (no
//! retry, an alert), on every path that finds a fence: the first delivery's claim, a repeat
//! delivery's ledger look, and batch mode's one-statement lookup. A copy with the same body, as
//! every replay sends, stays a duplicate.

mod support;

use consumer::count_awards;
use serde_json::{Value, json};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::dead_letter::{ErrorKind, letters_for_job};
use shared::harness::{CommitMode, RecordOutcome};
use shared::ids::{ConsumerName, JobId, TenantId};
use shared::metrics::Metric;
use sqlx::{PgConnection, PgPool};
use support::*;
use uuid::Uuid;

/// The same job id and tenant as `body`, with another payload.
fn reused(body: &str, payload: Value) -> String {
    let mut envelope: Value = serde_json::from_str(body).unwrap();
    envelope["payload"] = payload;
    envelope.to_string()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn hole8_a_reused_job_id_with_another_payload_is_a_conflict_letter_on_every_path(
    pool: PgPool,
) {
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
        let other = reused(&body, award(7));
        let outcome = deliver(&harness, &message(&other, receive_count)).await;
        assert_eq!(
            outcome.dead_letter_kind(),
            Some(ErrorKind::Conflict),
            "{mode:?}, delivery {receive_count}: {outcome:?}"
        );
        assert!(outcome.is_ack(), "no retry");
        let letters = letters_for_job(&pool, job_id, &consumer_name())
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
async fn hole8_only_the_fields_a_consumer_names_make_up_its_job(pool: PgPool) {
    let harness = harness_in(&pool, Transfer(consumer_name()), CommitMode::PerJob);
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
