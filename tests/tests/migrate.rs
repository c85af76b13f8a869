//! The migrate function (issue 16) as CloudFormation runs it: the real binary invoked with custom
//! resource requests, its answers PUT to a local server standing in for the pre-signed URL. It
//! applies the whole schema to a fresh database, in tracking tables of each owner's own schema
//! (never the database's default `_sqlx_migrations`), is a no-op the second time, fails the
//! deploy with the migration's error, and never drops anything on delete. A rollback and a
//! re-deploy of an older version succeed (issue 22, item 5): the function accepts applied
//! migrations of a newer release it does not know, still refuses a known one whose content
//! changed, and repairs an index an interrupted concurrent build left invalid.

use e2e::alert_receiver::{AlertReceiver, Received};
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use migrate::schema::owners;
use serde_json::{Value, json};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool, SqlSafeStr};
use std::time::Duration;

fn function(connect: &PgConnectOptions) -> LambdaHost {
    LambdaHost::new(FunctionSpec {
        name: "migrate".into(),
        binary: env!("CARGO_BIN_EXE_local-migrate").into(),
        env: vec![("DATABASE_URL".into(), e2e::test_database_url(connect))],
        timeout: Duration::from_secs(120),
        log_file: None,
        deadline_as_duration: false,
    })
}

fn request(kind: &str, cloudformation: &AlertReceiver) -> Value {
    json!({
        "RequestType": kind,
        "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:stack-MigrateFunction",
        "ResponseURL": format!("{}/cloudformation-response?X-Amz-Signature=abc", cloudformation.url),
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/jobs-staging/1",
        "RequestId": uuid::Uuid::new_v4(),
        "ResourceType": "Custom::SchemaMigration",
        "LogicalResourceId": "SchemaMigration",
        "PhysicalResourceId": "job-harness-schema",
        "ResourceProperties": {"ServiceToken": "…", "MigrateVersion": "7"}
    })
}

/// Invokes the function with a `kind` request; returns the answer CloudFormation got.
async fn deploy(host: &LambdaHost, kind: &str) -> Received {
    let cloudformation = AlertReceiver::start().await;
    host.invoke(&request(kind, &cloudformation))
        .await
        .expect("the function answers");
    let answers = cloudformation.received();
    assert_eq!(answers.len(), 1, "one answer: {answers:#?}");
    let answer = answers[0].clone();
    assert_eq!(answer.method, "PUT");
    assert_eq!(answer.path, "/cloudformation-response");
    assert_eq!(answer.body["PhysicalResourceId"], "job-harness-schema");
    assert_eq!(answer.body["LogicalResourceId"], "SchemaMigration");
    answer
}

async fn tracking_tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT schemaname || '.' || tablename FROM pg_tables WHERE tablename = '_sqlx_migrations'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// What every owner's tracking table records, summed.
async fn recorded(pool: &PgPool) -> i64 {
    let mut total = 0;
    for owner in owners() {
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}._sqlx_migrations",
            owner.schema
        )))
        .fetch_one(pool)
        .await
        .unwrap();
        total += count;
    }
    total
}

/// The tables of `schema` (its tracking table aside).
async fn tables_of(pool: &PgPool, schema: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 AND tablename <> '_sqlx_migrations'
         ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The owners are found from the workspace: core first, then every consumer crate that
/// declares `[package.metadata.job-consumer]`, in member order, today's two among them.
#[test]
fn the_owners_are_core_then_the_workspaces_consumers_in_member_order() {
    let names: Vec<&str> = owners().iter().map(|o| o.name).collect();
    assert_eq!(names[0], "core");
    assert_eq!(
        &names[1..3],
        ["award-points (reference consumer)", "redeem-reward"],
        "today's consumers keep their order: {names:?}"
    );
    assert_eq!(names.len(), 1 + migrate::consumers::CONSUMERS.len());
    let schemas: Vec<&str> = owners().iter().map(|o| o.schema).collect();
    assert_eq!(&schemas[..3], ["core", "reference", "rewards"]);
    // The migrate function's migrators are the consumers' own.
    for (owner, own) in owners()[1..3]
        .iter()
        .zip([&*consumer::MIGRATOR, &*redeem_reward::MIGRATOR])
    {
        let versions = |m: &Migrator| {
            m.iter()
                .map(|m| (m.version, m.checksum.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(versions(owner.migrator), versions(own), "{}", owner.name);
    }
}

#[sqlx::test(migrations = false)]
async fn the_migrate_function_applies_the_schema_once_and_is_a_no_op_the_second_time(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let host = function(&connect);
    let created = deploy(&host, "Create").await;
    assert_eq!(created.body["Status"], "SUCCESS", "{:#}", created.body);
    let expected = owners()
        .iter()
        .map(|o| o.migrator.iter().count())
        .sum::<usize>() as i64;
    assert_eq!(created.body["Data"]["Applied"], expected);
    for table in [
        "core.processed_jobs",
        "core.dead_letter_groups",
        "reference.point_awards",
        "rewards.redemptions",
    ] {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(exists, "{table}");
    }
    for owner in owners() {
        assert!(
            !tables_of(&pool, owner.schema).await.is_empty(),
            "{}'s tables in schema {}",
            owner.name,
            owner.schema
        );
    }
    let mut own_tables: Vec<String> = owners()
        .iter()
        .map(|o| format!("{}._sqlx_migrations", o.schema))
        .collect();
    own_tables.sort();
    assert_eq!(
        tracking_tables(&pool).await,
        own_tables,
        "each owner's own tracking table, never public._sqlx_migrations"
    );
    assert_eq!(recorded(&pool).await, expected);

    let again = deploy(&host, "Update").await;
    assert_eq!(again.body["Status"], "SUCCESS", "{:#}", again.body);
    assert_eq!(again.body["Data"]["Applied"], 0, "a no-op the second time");
    assert_eq!(recorded(&pool).await, expected);

    let deleted = deploy(&host, "Delete").await;
    assert_eq!(deleted.body["Status"], "SUCCESS");
    assert_eq!(recorded(&pool).await, expected, "a delete drops nothing");
    assert_eq!(host.starts(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_failing_migration_fails_the_deploy_with_its_error(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    // Something in the way of the first migration.
    sqlx::raw_sql("CREATE SCHEMA core; CREATE TABLE core.processed_jobs (something_else int)")
        .execute(&pool)
        .await
        .unwrap();
    let answer = deploy(&function(&connect), "Create").await;
    assert_eq!(answer.body["Status"], "FAILED");
    let reason = answer.body["Reason"].as_str().unwrap();
    for needle in ["core migrations failed", "20261130000001", "already exists"] {
        assert!(reason.contains(needle), "{needle:?} missing from {reason}");
    }
    let consumers_schema: bool =
        sqlx::query_scalar("SELECT to_regclass('reference.point_awards') IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!consumers_schema, "nothing after the failure was applied");
}

/// Invoked by hand (no `RequestType`), it migrates and says what it applied.
#[sqlx::test(migrations = false)]
async fn invoked_by_hand_it_migrates_and_reports(_: PgPoolOptions, connect: PgConnectOptions) {
    let report = function(&connect)
        .invoke(&json!({}))
        .await
        .expect("a report");
    assert!(report["Applied"].as_u64().unwrap() > 10, "{report}");
    assert_eq!(report["Migrations"][0]["owner"], "core");
}

/// `base` and one migration of a newer release after it, recorded where `base` records its own.
fn newer_release(base: &Migrator, schema: &'static str, sql: &'static str) -> (Migrator, i64) {
    let version = base.iter().map(|m| m.version).max().unwrap() + 1;
    let mut migrations: Vec<Migration> = base.iter().cloned().collect();
    migrations.push(Migration::new(
        version,
        "a newer release's".into(),
        MigrationType::Simple,
        sql.into_sql_str(),
        false,
    ));
    let migrator = shared::own_migrations(Migrator::with_migrations(migrations), schema);
    (migrator, version)
}

/// The database as a newer release left it: this code's migrations, then one more of core's
/// and one more of the reference consumer's, which this code does not know. Their versions.
async fn migrated_by_a_newer_release(host: &LambdaHost, pool: &PgPool) -> (i64, i64) {
    let created = deploy(host, "Create").await;
    assert_eq!(created.body["Status"], "SUCCESS", "{:#}", created.body);
    let (core, core_version) = newer_release(
        &shared::MIGRATOR,
        "core",
        "CREATE TABLE core.from_a_newer_release (id int)",
    );
    let (reference, reference_version) = newer_release(
        &consumer::MIGRATOR,
        "reference",
        "CREATE TABLE reference.from_a_newer_release (id int)",
    );
    core.run(pool).await.unwrap();
    reference.run(pool).await.unwrap();
    (core_version, reference_version)
}

/// A CloudFormation rollback: the previous release's migrate function (this code) answers the
/// `Update` on a schema a newer release migrated further. It succeeds, applies nothing, names
/// what it does not know, and leaves the newer release's objects in place.
#[sqlx::test(migrations = false)]
async fn a_rollback_migrates_a_schema_a_newer_release_migrated_further(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let host = function(&connect);
    let (core_version, reference_version) = migrated_by_a_newer_release(&host, &pool).await;

    let rollback = deploy(&host, "Update").await;
    assert_eq!(rollback.body["Status"], "SUCCESS", "{:#}", rollback.body);
    assert_eq!(rollback.body["Data"]["Applied"], 0, "{:#}", rollback.body);
    assert_eq!(
        rollback.body["Data"]["UnknownApplied"],
        json!([
            {"owner": "core", "version": core_version},
            {"owner": "award-points (reference consumer)", "version": reference_version},
        ]),
        "{:#}",
        rollback.body
    );
    for table in [
        "core.from_a_newer_release",
        "reference.from_a_newer_release",
    ] {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(exists, "{table} is left in place");
    }
    // And deployed again (the older version re-deployed): the same.
    let again = deploy(&host, "Update").await;
    assert_eq!(again.body["Status"], "SUCCESS", "{:#}", again.body);
}

/// Accepting a newer release's migrations is not accepting anything: a migration this code
/// knows, recorded with other content than this code's, still fails the deploy, by its version.
#[sqlx::test(migrations = false)]
async fn a_known_migration_whose_content_changed_is_still_refused_beside_newer_ones(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let host = function(&connect);
    migrated_by_a_newer_release(&host, &pool).await;
    let changed = shared::MIGRATOR.iter().map(|m| m.version).max().unwrap();
    sqlx::query("UPDATE core._sqlx_migrations SET checksum = '\\x00'::bytea WHERE version = $1")
        .bind(changed)
        .execute(&pool)
        .await
        .unwrap();

    let answer = deploy(&host, "Update").await;
    assert_eq!(answer.body["Status"], "FAILED", "{:#}", answer.body);
    let reason = answer.body["Reason"].as_str().unwrap();
    for needle in [
        "core migrations failed".to_owned(),
        changed.to_string(),
        "has been modified".to_owned(),
    ] {
        assert!(reason.contains(&needle), "{needle:?} missing from {reason}");
    }
}

/// A migration changed in place after a database may have applied it (0028, whose corrections
/// moved to 0029) is recorded anew, not refused, on a database that recorded the superseded
/// content and not yet its successor; the successor then applies, and the next run is a no-op.
#[sqlx::test(migrations = false)]
async fn a_superseded_content_of_a_migration_is_recorded_anew_and_its_successor_applied(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let host = function(&connect);
    let created = deploy(&host, "Create").await;
    assert_eq!(created.body["Status"], "SUCCESS", "{:#}", created.body);
    let old = &migrate::schema::SUPERSEDED[0];
    let now = shared::MIGRATOR
        .iter()
        .find(|m| m.version == old.version)
        .unwrap();
    assert_ne!(hex(&now.checksum), old.checksum, "superseded, not today's");
    sqlx::query("UPDATE core._sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = $2")
        .bind(old.checksum)
        .bind(old.version)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM core._sqlx_migrations WHERE version = $1")
        .bind(old.by)
        .execute(&pool)
        .await
        .unwrap();

    let answer = deploy(&host, "Update").await;
    assert_eq!(answer.body["Status"], "SUCCESS", "{:#}", answer.body);
    assert_eq!(
        answer.body["Data"]["Rebaselined"],
        json!([{"owner": "core", "version": old.version}])
    );
    assert_eq!(
        answer.body["Data"]["Migrations"][0]["version"], old.by,
        "{:#}",
        answer.body
    );
    let recorded: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM core._sqlx_migrations WHERE version = $1")
            .bind(old.version)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(recorded, *now.checksum);
    let again = deploy(&host, "Update").await;
    assert_eq!(again.body["Data"]["Applied"], 0, "{:#}", again.body);
    assert_eq!(again.body["Data"]["Rebaselined"], json!([]));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn index_valid(pool: &PgPool, index: &str) -> Option<bool> {
    sqlx::query_scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)")
        .bind(index)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// The migration of `shared::MIGRATOR` that creates `index`.
fn creating_migration(index: &str) -> &'static Migration {
    shared::MIGRATOR
        .iter()
        .find(|m| m.sql.as_str().contains(&format!("IF NOT EXISTS {index}")))
        .unwrap_or_else(|| panic!("no migration creates {index}"))
}

/// `CREATE INDEX CONCURRENTLY IF NOT EXISTS` skips an invalid index, so a rerun alone never
/// repairs what an interrupted build left. Three such states, then one run of the function:
/// - the deploy of a concurrent-index migration interrupted for real (a statement timeout while
///   the build waits for an old snapshot): the index invalid, the migration not recorded;
/// - an index invalid under a migration already recorded (a rerun that skipped it);
/// - the transient `_ccnew` index of an interrupted rebuild.
///
/// After the run every index is valid, the leftover is gone, and the report names each.
#[sqlx::test(migrations = false)]
async fn an_index_an_interrupted_concurrent_build_left_invalid_is_repaired_on_the_next_run(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_opts.connect_with(connect.clone()).await.unwrap();
    let host = function(&connect);
    let created = deploy(&host, "Create").await;
    assert_eq!(created.body["Status"], "SUCCESS", "{:#}", created.body);

    // 1. The deploy of the by-message index, interrupted half-way.
    let interrupted = "core.dead_letters_message_idx";
    let migration = creating_migration("dead_letters_message_idx");
    assert!(migration.no_tx);
    sqlx::query("DROP INDEX core.dead_letters_message_idx")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM core._sqlx_migrations WHERE version = $1")
        .bind(migration.version)
        .execute(&pool)
        .await
        .unwrap();
    let mut reader = pool.acquire().await.unwrap();
    reader
        .execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM core.dead_letters")
        .await
        .unwrap();
    let mut builder = pool.acquire().await.unwrap();
    builder
        .execute("SET statement_timeout = '1s'")
        .await
        .unwrap();
    let build = builder.execute(migration.sql.clone()).await;
    assert!(
        build.unwrap_err().to_string().contains("statement timeout"),
        "the build is interrupted"
    );
    reader.execute("ROLLBACK").await.unwrap();
    builder.execute("RESET statement_timeout").await.unwrap();
    drop((reader, builder));
    assert_eq!(index_valid(&pool, interrupted).await, Some(false));

    // 2. An invalid index under a recorded migration.
    let recorded_invalid = "core.dead_letters_tenant_created_idx";
    // 3. The leftover of an interrupted REINDEX CONCURRENTLY.
    let leftover = "core.dead_letters_tenant_created_idx_ccnew";
    sqlx::raw_sql(
        "CREATE INDEX dead_letters_tenant_created_idx_ccnew ON core.dead_letters (tenant_id);
         UPDATE pg_index SET indisvalid = false
         WHERE indexrelid IN ('core.dead_letters_tenant_created_idx'::regclass,
                              'core.dead_letters_tenant_created_idx_ccnew'::regclass)",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(index_valid(&pool, recorded_invalid).await, Some(false));

    let rerun = deploy(&host, "Update").await;
    assert_eq!(rerun.body["Status"], "SUCCESS", "{:#}", rerun.body);
    assert_eq!(rerun.body["Data"]["Applied"], 1, "{:#}", rerun.body);
    assert_eq!(
        rerun.body["Data"]["Migrations"][0]["version"],
        migration.version
    );
    for index in [interrupted, recorded_invalid] {
        assert_eq!(
            index_valid(&pool, index).await,
            Some(true),
            "{index} repaired"
        );
    }
    assert_eq!(
        index_valid(&pool, leftover).await,
        None,
        "the leftover is dropped"
    );
    assert_eq!(
        rerun.body["Data"]["RepairedIndexes"],
        json!([
            {"index": leftover, "action": "dropped"},
            {"index": interrupted, "action": "rebuilt"},
            {"index": recorded_invalid, "action": "rebuilt"},
        ]),
        "{:#}",
        rerun.body
    );
    // Nothing left to repair the next time.
    let again = deploy(&host, "Update").await;
    assert_eq!(again.body["Data"]["RepairedIndexes"], json!([]));
}
