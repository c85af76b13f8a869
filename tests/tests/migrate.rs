//! The migrate function (issue 16) as CloudFormation runs it: the real binary invoked with custom
//! resource requests, its answers PUT to a local server standing in for the pre-signed URL. It
//! applies the whole schema to a fresh database, in tracking tables of each owner's own schema
//! (never the database's default `_sqlx_migrations`), is a no-op the second time, fails the
//! deploy with the migration's error, and never drops anything on delete.

use e2e::alert_receiver::{AlertReceiver, Received};
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
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

async fn recorded(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM core._sqlx_migrations) + (SELECT count(*) FROM reference._sqlx_migrations)
              + (SELECT count(*) FROM rewards._sqlx_migrations)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
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
    let expected = (shared::MIGRATOR.iter().count()
        + consumer::MIGRATOR.iter().count()
        + redeem_reward::MIGRATOR.iter().count()) as i64;
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
    assert_eq!(
        tracking_tables(&pool).await,
        [
            "core._sqlx_migrations",
            "reference._sqlx_migrations",
            "rewards._sqlx_migrations"
        ],
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
