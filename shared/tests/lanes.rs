//! A lane is a clean connection for every job, and only a job's own failures are charged as its
//! executions (issue 34, item 7). A handler that leaves session state on its connection (a read-
//! only default, a search path, a temporary table, a session advisory lock) made every later job
//! on that lane fail or wait, each failure charged to a job that never ran its work; and a fence
//! claim the server refused (a read-only or demoted server after a failover) was charged as an
//! execution, so five of them made an `exhausted` letter for a job that never ran.

use serde_json::{Value, json};
use shared::consumer::{Consumer, Job, ProcessError};
use shared::harness::{CommitMode, HarnessSettings, RecordOutcome};
use shared::ids::ConsumerName;
use shared_testkit::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

/// A consumer whose job, when its payload says `leave`, leaves session state behind; every job
/// makes a temporary table of one name (which fails if an earlier job's is still there).
struct LeavesItsSession(ConsumerName);

impl Consumer for LeavesItsSession {
    type Payload = Value;
    fn name(&self) -> &ConsumerName {
        &self.0
    }
    async fn handle(&self, job: &Job<Value>, tx: &mut PgConnection) -> Result<(), ProcessError> {
        sqlx::raw_sql("CREATE TEMP TABLE scratch (x int)")
            .execute(&mut *tx)
            .await?;
        if job.envelope.payload["leave"] == json!(true) {
            sqlx::raw_sql(
                "SET search_path = nowhere; SET lock_timeout = 1;
                 SET default_transaction_read_only = on; SELECT pg_advisory_lock(4242);
                 LISTEN somewhere",
            )
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("INSERT INTO public.effects (job_id) VALUES ($1)")
            .bind(job.envelope.job_id.0)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

async fn effects_table(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE public.effects (job_id uuid PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_lane_is_a_clean_connection_for_every_job(_: PgPoolOptions, connect: PgConnectOptions) {
    for mode in [CommitMode::PerJob, CommitMode::Batch] {
        // One connection: every job runs on the same lane.
        let pool = own_pool(connect.clone(), 1).await;
        sqlx::raw_sql("DROP TABLE IF EXISTS public.effects")
            .execute(&pool)
            .await
            .unwrap();
        effects_table(&pool).await;
        let settings = HarnessSettings {
            commit: mode,
            ..settings()
        };
        let (harness, _) = harness_with(&pool, LeavesItsSession(consumer_name("leaves")), settings);
        let (_, leaves) = job(json!({"leave": true}));
        assert_eq!(
            harness.process(&message(&leaves, 1)).await,
            RecordOutcome::Processed
        );
        for _ in 0..3 {
            let (_, next) = job(json!({"leave": false}));
            assert_eq!(
                harness.process(&message(&next, 1)).await,
                RecordOutcome::Processed,
                "{mode:?}: the next job on the lane inherits nothing"
            );
        }
        // The advisory lock went with the session's reset: another session takes it at once.
        let other = own_pool(connect.clone(), 1).await;
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(4242)")
            .fetch_one(&other)
            .await
            .unwrap();
        assert!(free, "{mode:?}: a session lock outlived its job");
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM public.effects")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(count, 4, "{mode:?}");
        other.close().await;
        pool.close().await;
    }
}

/// The server refuses the fence's insert as a read-only server does after a failover (SQLSTATE
/// 25006), while the ledger still takes writes: the job never runs, its repeat deliveries are
/// handed back uncharged, and no letter claims it ran out of executions.
#[sqlx::test(migrator = "consumer::MIGRATOR_WITH_CORE")]
async fn a_claim_the_server_refuses_is_never_charged_to_the_job(pool: PgPool) {
    sqlx::raw_sql(
        "CREATE FUNCTION public.read_only_fences() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction'
                 USING ERRCODE = '25006';
         END $$;
         CREATE TRIGGER read_only_fences BEFORE INSERT ON core.processed_jobs
             FOR EACH ROW EXECUTE FUNCTION public.read_only_fences();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let name = consumer_name("leaves");
    let harness = harness(&pool, LeavesItsSession(name.clone()));
    let (job_id, body) = job(json!({"leave": false}));
    for receive_count in 1..=8 {
        let outcome = harness.process(&message(&body, receive_count)).await;
        assert!(
            matches!(outcome, RecordOutcome::HandedBack { .. }),
            "delivery {receive_count}: {outcome:?}"
        );
    }
    assert_eq!(executions(&pool, job_id, &name).await, 0);
    assert!(letters(&pool, job_id, &name).await.is_empty());
}
