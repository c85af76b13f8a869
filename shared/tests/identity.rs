//! One identity per job, read once (issue 34, items 1 and 6): the batch lookup, the commit
//! group, the ledger and the letter all use the one parse of a body. Another job under a
//! reused id in one batch gets its conflict letter and is never acked unrun; a body naming a
//! key twice is poison with a letter of its own; the same job in another spelling is its
//! duplicate; a job twice in one FIFO batch runs (and is charged) once. In both commit modes.

use consumer::{AwardPoints, count_awards};
use serde_json::{Value, json};
use shared::dead_letter::ErrorKind;
use shared::harness::{CommitMode, IncomingMessage, RecordOutcome};
use shared::ids::JobId;
use shared_testkit::reference::*;
use shared_testkit::*;
use sqlx::PgPool;

const MODES: [CommitMode; 2] = [CommitMode::PerJob, CommitMode::Batch];

fn award_points() -> AwardPoints {
    AwardPoints::new(reference_name())
}

/// The batch shapes two records can arrive in: a standard batch, one FIFO group, two groups.
fn shapes(a: &str, b: &str) -> Vec<(&'static str, Vec<IncomingMessage>)> {
    let (a, b) = (message(a, 1), message(b, 1));
    vec![
        ("standard", vec![a.clone(), b.clone()]),
        (
            "one FIFO group",
            vec![in_group("g", a.clone()), in_group("g", b.clone())],
        ),
        (
            "two FIFO groups",
            vec![in_group("g1", a), in_group("g2", b)],
        ),
    ]
}

async fn kinds_of_letters(pool: &PgPool, job_id: JobId) -> Vec<ErrorKind> {
    letters(pool, job_id, &reference_name())
        .await
        .iter()
        .map(|l| l.error_kind)
        .collect()
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn another_job_under_a_reused_id_in_one_batch_gets_its_conflict_letter_in_every_shape(
    pool: PgPool,
) {
    for mode in MODES {
        for shape in 0..3 {
            // A fresh id each round: two bodies under it, the second another job.
            let (job_id, body) = job(award(5));
            let other = with_payload(&body, json!({"account_id": "acct-2", "points": 7}));
            let (shape, batch) = shapes(&body, &other).swap_remove(shape);
            let harness = harness_in(&pool, award_points(), mode);
            let outcomes = run_batch(&harness, &batch).await;
            let shown = format!("{mode:?}, {shape}: {outcomes:?}");
            assert_eq!(outcomes[0], RecordOutcome::Processed, "{shown}");
            assert_eq!(
                outcomes[1].dead_letter_kind(),
                Some(ErrorKind::Conflict),
                "{shown}"
            );
            assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "{shown}");
            assert_eq!(
                kinds_of_letters(&pool, job_id).await,
                [ErrorKind::Conflict],
                "{shown}"
            );
        }
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_body_naming_a_key_twice_is_poison_with_a_letter_of_its_own(pool: PgPool) {
    for mode in MODES {
        let (job_id, body) = job(award(5));
        let other = JobId(uuid::Uuid::new_v4());
        // The job's id written twice: the second another job's, or its own again.
        let twice = [
            body.replacen('{', &format!(r#"{{"job_id":"{other}","#), 1),
            body.replacen('{', &format!(r#"{{"job\u005fid":"{job_id}","#), 1),
            with_payload(&body, json!({})).replace(
                r#""payload":{}"#,
                r#""payload":{"account_id":"acct-1","points":5,"points":500}"#,
            ),
        ];
        for shape in 0..3 {
            let harness = harness_in(&pool, award_points(), mode);
            let (job_id, body) = job(award(5));
            let twice = body.replacen('{', &format!(r#"{{"job_id":"{other}","#), 1);
            let (shape, batch) = shapes(&body, &twice).swap_remove(shape);
            let outcomes = run_batch(&harness, &batch).await;
            let shown = format!("{mode:?}, {shape}: {outcomes:?}");
            assert_eq!(outcomes[0], RecordOutcome::Processed, "{shown}");
            assert_eq!(
                outcomes[1].dead_letter_kind(),
                Some(ErrorKind::Poison),
                "{shown}"
            );
            assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1, "{shown}");
        }
        // After the job committed, alone or as a repeat delivery: poison, never its duplicate.
        let harness = harness_in(&pool, award_points(), mode);
        assert_eq!(
            deliver(&harness, &message(&body, 1)).await,
            RecordOutcome::Processed
        );
        for ambiguous in &twice {
            for receive_count in [1, 3] {
                let outcome = deliver(&harness, &message(ambiguous, receive_count)).await;
                assert_eq!(
                    outcome.dead_letter_kind(),
                    Some(ErrorKind::Poison),
                    "{mode:?} {ambiguous}: {outcome:?}"
                );
            }
        }
        assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
        let poison: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM core.dead_letters WHERE error_kind = 'poison'
             AND last_error LIKE 'body is ambiguous%' AND job_id IS NULL AND body LIKE $1",
        )
        .bind(format!("%{job_id}%"))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(poison, 6, "{mode:?}: one letter per ambiguous message");
    }
}

/// `body` spelled otherwise: ids upper case and without dashes, keys in another order, no
/// spaces or extra ones, a number written with a trailing zero.
fn respelled(body: &str) -> Vec<String> {
    let value: Value = serde_json::from_str(body).unwrap();
    let (job_id, tenant) = (
        value["job_id"].as_str().unwrap(),
        value["tenant_id"].as_str().unwrap(),
    );
    let points = &value["payload"]["points"];
    vec![
        format!(
            r#"{{ "payload" : {{ "points" : {points}, "account_id" : "acct-1" }}, "correlation_id" : "another",
                 "tenant_id" : "{}", "job_id" : "{}" }}"#,
            tenant.to_uppercase(),
            job_id.to_uppercase()
        ),
        format!(
            r#"{{"job_id":"{}","tenant_id":"urn:uuid:{tenant}","correlation_id":"c","payload":{{"account_id":"acct-1","points":{points}}}}}"#,
            job_id.replace('-', "")
        ),
    ]
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_same_job_in_another_spelling_is_its_duplicate_never_a_conflict(pool: PgPool) {
    for mode in MODES {
        let harness = harness_in(&pool, award_points(), mode);
        // Committed first, then its copies in other spellings, first and repeat deliveries.
        let (job_id, body) = job(award(5));
        assert_eq!(
            deliver(&harness, &message(&body, 1)).await,
            RecordOutcome::Processed
        );
        for spelled in respelled(&body) {
            for receive_count in [1, 2] {
                assert_eq!(
                    deliver(&harness, &message(&spelled, receive_count)).await,
                    RecordOutcome::Duplicate,
                    "{mode:?}: {spelled}"
                );
            }
        }
        assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
        assert!(letters(&pool, job_id, &reference_name()).await.is_empty());
        // In one batch with the first delivery: copies of it, run once.
        let (job_id, body) = job(award(9));
        let mut bodies = vec![body.clone()];
        bodies.extend(respelled(&body));
        for (shape, msgs) in [
            ("standard", batch(&bodies)),
            (
                "FIFO",
                batch(&bodies)
                    .into_iter()
                    .enumerate()
                    .map(|(i, m)| in_group(&format!("g{i}"), m))
                    .collect(),
            ),
        ] {
            let outcomes = run_batch(&harness, &msgs).await;
            assert!(
                outcomes.iter().all(RecordOutcome::is_ack),
                "{mode:?} {shape}: {outcomes:?}"
            );
            assert_eq!(count_awards(&pool, job_id).await.unwrap(), 1);
            assert!(letters(&pool, job_id, &reference_name()).await.is_empty());
        }
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn the_same_job_twice_in_one_fifo_batch_runs_and_is_charged_once(pool: PgPool) {
    refuse_account_boom(&pool).await;
    for mode in MODES {
        for receive_count in [1, 2] {
            for groups in [["g", "g"], ["g1", "g2"]] {
                let harness = harness_in(&pool, award_points(), mode);
                let (job_id, body) = job(json!({"account_id": "boom", "points": 1}));
                let msgs = [
                    in_group(groups[0], message(&body, receive_count)),
                    in_group(groups[1], message(&body, receive_count)),
                ];
                let outcomes = run_batch(&harness, &msgs).await;
                let shown = format!("{mode:?}, receive {receive_count}, {groups:?}: {outcomes:?}");
                assert!(
                    outcomes.iter().all(|o| !o.is_ack()),
                    "the transient failure holds both: {shown}"
                );
                assert_eq!(
                    executions(&pool, job_id, &reference_name()).await,
                    1,
                    "one run, one execution charged: {shown}"
                );
            }
        }
    }
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_claim_of_one_job_twice_in_a_commit_group_is_refused_never_dropped(pool: PgPool) {
    let job = uuid::Uuid::new_v4();
    let refused = sqlx::query(
        "SELECT * FROM core.claim_job_fences($1, 'c', $2, now(), now() + interval '1 day', '1s', $3)",
    )
    .bind(vec![job, job])
    .bind(vec![uuid::Uuid::nil(), uuid::Uuid::nil()])
    .bind(vec![vec![1u8], vec![2u8]])
    .fetch_all(&pool)
    .await
    .unwrap_err();
    let code = refused.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("JF004"), "{refused}");
    let fences: i64 = sqlx::query_scalar("SELECT count(*) FROM core.processed_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(fences, 0);
}
