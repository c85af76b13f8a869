//! A job's edits are one family (issue 34, item 2): the body received and every edit of it, a
//! chain of any length, are the same job. A commit of any member closes every pending letter of
//! the job whose body is of the family; a late copy of any member is the job's duplicate; the
//! review never calls the committed fence "another job" for a letter of the family, so nothing
//! advises sending it again. Another body under the id is still another job. In both commit
//! modes, edits made as the API makes them (`lock_letter`, `Verdict::Replayed` with the body).

use consumer::{AwardPoints, count_awards};
use serde_json::json;
use shared::dead_letter::{DeadLetter, ErrorKind, ReviewStatus, fence_is_another_job};
use shared::harness::{CommitMode, Harness, IncomingMessage, RecordOutcome};
use shared::ids::{DeadLetterId, JobId};
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// Edits letter `id` to `body` and replays it, as the API's edit route does.
async fn edit(pool: &PgPool, id: DeadLetterId, body: &str) {
    queue_replay(pool, id, Some(body)).await;
}

/// The replay of letter `of`, carrying `body`.
fn replay(body: &str, of: DeadLetterId) -> IncomingMessage {
    IncomingMessage {
        replay_of: Some(of),
        ..message(body, 1)
    }
}

async fn the_letters(pool: &PgPool, job_id: JobId) -> Vec<DeadLetter> {
    letters(pool, job_id, &reference_name()).await
}

/// Delivers `msg` and says its outcome, which must be a letter of `kind`; returns the letter.
async fn lettered(
    harness: &Harness<AwardPoints>,
    pool: &PgPool,
    job_id: JobId,
    msg: &IncomingMessage,
    kind: ErrorKind,
) -> DeadLetter {
    let outcome = deliver(harness, msg).await;
    assert_eq!(outcome.dead_letter_kind(), Some(kind), "{outcome:?}");
    let all = the_letters(pool, job_id).await;
    all.into_iter()
        .find(|l| l.message_id == msg.message_id)
        .expect("its letter")
}

/// `msg` past its budget (five executions charged, the ledger refusing its account): its
/// `exhausted` letter, which keeps the job's digest.
async fn exhausted(
    harness: &Harness<AwardPoints>,
    pool: &PgPool,
    job_id: JobId,
    msg: IncomingMessage,
) -> DeadLetter {
    charge_executions(pool, job_id, &reference_name(), 5, Some("ledger refused")).await;
    let msg = IncomingMessage {
        receive_count: 9,
        ..msg
    };
    lettered(harness, pool, job_id, &msg, ErrorKind::Exhausted).await
}

async fn a_chain_of_edits_is_one_job(pool: PgPool, mode: CommitMode) {
    refuse_account_boom(&pool).await;
    let harness = harness_in(&pool, award_points(), mode);
    // B0 fails until exhausted, received twice: letters L1 and L2, each with the job's digest.
    let (job_id, b0) = job(json!({"account_id": "boom", "points": 3}));
    let l1 = exhausted(&harness, &pool, job_id, message(&b0, 1)).await;
    let l2 = exhausted(&harness, &pool, job_id, message(&b0, 1)).await;
    // L1 edited to B1, which fails too: its replay is letter L3, and a copy of B1 letter L4.
    let b1 = with_payload(&b0, json!({"account_id": "boom", "points": 4}));
    edit(&pool, l1.id, &b1).await;
    let l3 = exhausted(&harness, &pool, job_id, replay(&b1, l1.id)).await;
    let l4 = exhausted(&harness, &pool, job_id, message(&b1, 1)).await;
    // L3 edited to B2, which commits.
    let b2 = with_payload(&b0, json!({"account_id": "acct-1", "points": 3}));
    edit(&pool, l3.id, &b2).await;
    assert_eq!(
        deliver(&harness, &replay(&b2, l3.id)).await,
        RecordOutcome::Processed,
        "{mode:?}"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
    // Every pending letter of the family is closed by the commit: L2 (the body L1 received)
    // and L4 (the first edit's).
    let now: Vec<(DeadLetterId, ReviewStatus, Option<String>)> = the_letters(&pool, job_id)
        .await
        .into_iter()
        .map(|l| (l.id, l.status, l.reviewed_by.clone()))
        .collect();
    for sibling in [l2.id, l4.id] {
        let (_, status, by) = now.iter().find(|(id, _, _)| *id == sibling).unwrap();
        assert_eq!(
            (*status, by.as_deref()),
            (ReviewStatus::Discarded, Some("harness")),
            "{mode:?}: {now:?}"
        );
    }
    // The committed fence is never another job for a letter of the family.
    for letter in [&l1, &l2, &l3, &l4] {
        assert!(
            !fence_is_another_job(&pool, letter).await.unwrap(),
            "{mode:?}: letter {} would be told its job never ran",
            letter.id
        );
    }
    // Late copies of every member, first and repeat deliveries: the job's duplicates.
    for body in [&b0, &b1, &b2] {
        for receive_count in [1, 2] {
            assert_eq!(
                deliver(&harness, &message(body, receive_count)).await,
                RecordOutcome::Duplicate,
                "{mode:?}: {body}"
            );
        }
    }
    assert_eq!(the_letters(&pool, job_id).await.len(), 4, "no new letter");
    // Another body under the id is still another job.
    let other = with_payload(&b0, json!({"account_id": "acct-9", "points": 1}));
    let conflict = deliver(&harness, &message(&other, 1)).await;
    assert_eq!(conflict.dead_letter_kind(), Some(ErrorKind::Conflict));
    let conflict = the_letters(&pool, job_id)
        .await
        .into_iter()
        .find(|l| l.error_kind == ErrorKind::Conflict)
        .unwrap();
    assert!(fence_is_another_job(&pool, &conflict).await.unwrap());
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "one effect");
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_chain_of_edits_is_one_job_per_job(pool: PgPool) {
    a_chain_of_edits_is_one_job(pool, CommitMode::PerJob).await
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_chain_of_edits_is_one_job_in_batch_mode(pool: PgPool) {
    a_chain_of_edits_is_one_job(pool, CommitMode::Batch).await
}

/// The body received commits (a transient fault over) after an operator edited a sibling
/// letter: the edit's own letters and its late copy belong to the job too.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_body_received_committing_closes_the_letters_of_its_edits(pool: PgPool) {
    refuse_account_boom(&pool).await;
    let harness = harness_in(&pool, award_points(), CommitMode::PerJob);
    let (job_id, b0) = job(json!({"account_id": "boom", "points": 3}));
    let permanent = |m: IncomingMessage| IncomingMessage {
        receive_count: 9,
        ..m
    };
    // Exhausted: a letter with the job's digest.
    charge_executions(&pool, job_id, &reference_name(), 5, Some("ledger refused")).await;
    let l1 = lettered(
        &harness,
        &pool,
        job_id,
        &permanent(message(&b0, 9)),
        ErrorKind::Exhausted,
    )
    .await;
    // Edited to another account that the ledger also refuses: the edit's replay fails too.
    let b1 = with_payload(&b0, json!({"account_id": "boom", "points": 4}));
    edit(&pool, l1.id, &b1).await;
    charge_executions(&pool, job_id, &reference_name(), 5, Some("ledger refused")).await;
    let l2 = lettered(
        &harness,
        &pool,
        job_id,
        &permanent(replay(&b1, l1.id)),
        ErrorKind::Exhausted,
    )
    .await;
    // The ledger accepts again, and a late copy of the body received commits.
    sqlx::query("DROP TRIGGER refuse_boom ON reference.point_awards")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        harness.process(&message(&b0, 1)).await,
        RecordOutcome::Processed
    );
    let l2 = the_letters(&pool, job_id)
        .await
        .into_iter()
        .find(|l| l.id == l2.id)
        .unwrap();
    assert_eq!(
        l2.status,
        ReviewStatus::Discarded,
        "the edit's letter closed"
    );
    assert!(!fence_is_another_job(&pool, &l2).await.unwrap());
    assert_eq!(
        harness.process(&message(&b1, 1)).await,
        RecordOutcome::Duplicate,
        "the edit's late copy"
    );
    assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
}

/// Found by the model-based test (issue 34): a replay in one SQS batch with a redelivery of the
/// message its letter came from (the original's delete was lost) took that redelivery's outcome,
/// the letter it already had (now replayed), and was acked unrun: the job had no pending letter
/// and never committed. A replay beside another delivery of its job runs on its own.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_replay_beside_a_redelivery_of_its_original_runs_on_its_own(pool: PgPool) {
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        let harness = harness_in(&pool, award_points(), mode);
        let (job_id, body) = job(json!({"account_id": "acct-1", "points": "seven"}));
        let original = message(&body, 1);
        let letter = lettered(&harness, &pool, job_id, &original, ErrorKind::Poison).await;
        // Replayed as received, as the API's replay route does.
        queue_replay(&pool, letter.id, None).await;
        let replay_body = body.clone();
        let redelivered = IncomingMessage {
            receive_count: 2,
            ..original
        };
        let outcomes = run_batch(&harness, &[redelivered, replay(&replay_body, letter.id)]).await;
        let shown = format!("{mode:?}: {outcomes:?}");
        assert!(outcomes[0].is_ack(), "{shown}");
        assert!(
            matches!(
                &outcomes[1],
                RecordOutcome::DeadLettered {
                    letter: shared::dead_letter::Recorded::New(_),
                    ..
                }
            ),
            "the replay ran (poison again: a new letter of its own): {shown}"
        );
        let pending = the_letters(&pool, job_id)
            .await
            .into_iter()
            .filter(|l| l.status == ReviewStatus::PendingReview)
            .count();
        assert_eq!(pending, 1, "{shown}");
    }
}
