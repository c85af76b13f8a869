//! Secrets read at run time (issue 16): a function picks up a rotated database password and a
//! rotated BetterStack token from Secrets Manager (moto's server) without a deploy or a restart.
//! The database is a throwaway cluster of the test's own that checks passwords (the machine's
//! trusts every local connection, and is never reconfigured).

use e2e::alert_receiver::AlertReceiver;
use e2e::lambda_host::{FunctionSpec, LambdaHost};
use e2e::throwaway_pg::ThrowawayCluster;
use serde_json::json;
use shared::clock::SystemClock;
use shared::paging::{Alerter, BetterStack, Routes};
use shared::secrets::{ManagedSecret, Secret};
use std::sync::Arc;
use std::time::Duration;

async fn secrets_client() -> aws_sdk_secretsmanager::Client {
    assert!(
        std::env::var_os("AWS_ENDPOINT_URL_SECRETS_MANAGER").is_some(),
        "AWS_ENDPOINT_URL_SECRETS_MANAGER is not set: `bash scripts/test.sh` points it at moto"
    );
    aws_sdk_secretsmanager::Client::new(&shared::aws::sdk_config().await)
}

async fn create_secret(client: &aws_sdk_secretsmanager::Client, value: &str) -> String {
    let name = format!("test/{}", uuid::Uuid::new_v4().simple());
    client
        .create_secret()
        .name(&name)
        .secret_string(value)
        .send()
        .await
        .expect("CreateSecret")
        .arn
        .expect("an ARN")
}

async fn rotate(client: &aws_sdk_secretsmanager::Client, arn: &str, value: &str) {
    client
        .put_secret_value()
        .secret_id(arn)
        .secret_string(value)
        .send()
        .await
        .expect("PutSecretValue");
}

fn url(cluster: &ThrowawayCluster, password: &str) -> String {
    format!(
        "postgres://postgres:{password}@127.0.0.1:{}/postgres",
        cluster.port
    )
}

#[tokio::test]
async fn a_function_picks_up_a_rotated_database_password_without_a_restart() {
    let cluster = ThrowawayCluster::start_with_password("first-password");
    let admin = sqlx::PgPool::connect(&url(&cluster, "first-password"))
        .await
        .expect("the cluster, with its first password");
    consumer::MIGRATOR_WITH_CORE.run(&admin).await.unwrap();
    let secrets = secrets_client().await;
    // RDS's JSON, as its rotation functions keep it.
    let secret_of = |password: &str| {
        json!({"engine": "postgres", "username": "postgres", "password": password,
               "host": "127.0.0.1", "port": cluster.port, "dbname": "postgres"})
        .to_string()
    };
    let arn = create_secret(&secrets, &secret_of("first-password")).await;
    let read = LambdaHost::new(FunctionSpec {
        name: "dead-letters-read".into(),
        binary: env!("CARGO_BIN_EXE_local-dead-letter-api").into(),
        // Blank, the test's own DATABASE_URL counts as unset: the secret is the only source.
        env: vec![
            ("DATABASE_SECRET_ARN".into(), arn.clone()),
            ("DATABASE_URL".into(), String::new()),
        ],
        timeout: Duration::from_secs(20),
        log_file: None,
        deadline_as_duration: false,
    });
    let list = dead_letter_api::api::ApiRequest {
        method: "GET".into(),
        path: "/v1/core/dead-letters".into(),
        caller: Some(e2e::api_client::caller(
            "ops-1",
            &[dead_letter_api::api::Scope::Read],
        )),
        ..Default::default()
    };
    assert_eq!(e2e::api_client::invoke(&read, &list).await.status, 200);

    // The rotation: the secret holds the new password, the database takes it, and the sessions
    // of the old one end, as they do when a pool recycles them. The last two in one query, on
    // one connection: after the `ALTER` the admin pool could open no other (the one it ran on
    // may still be in the pool's hands, on its way back).
    rotate(&secrets, &arn, &secret_of("second-password")).await;
    sqlx::raw_sql(
        "ALTER USER postgres PASSWORD 'second-password';
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
    )
    .execute(&admin)
    .await
    .unwrap();
    let after = e2e::api_client::invoke(&read, &list).await;
    assert_eq!(after.status, 200, "{:#}", after.body);
    assert_eq!(read.starts(), 1, "the same process, no restart");
}

#[tokio::test]
async fn a_rotated_betterstack_token_is_read_again_when_the_old_one_is_refused() {
    let secrets = secrets_client().await;
    let arn = create_secret(&secrets, "old-token").await;
    let token = Secret::Managed(Arc::new(ManagedSecret::new(secrets.clone(), arn.clone())));
    assert_eq!(token.value().await.unwrap(), "old-token", "read and cached");
    let receiver = AlertReceiver::start().await;
    receiver.require_token("new-token");
    rotate(&secrets, &arn, "new-token").await;
    let client = BetterStack::new(&receiver.url, token, None).unwrap();
    let incident = client
        .create_incident(
            &json!({"name": "n", "summary": "s"}),
            Duration::from_secs(5),
        )
        .await
        .expect("created with the rotated token");
    assert!(!incident.is_empty());
    let got = receiver.received();
    assert_eq!(
        got.iter()
            .map(|r| (r.status, r.authorization.clone().unwrap()))
            .collect::<Vec<_>>(),
        [
            (401, "Bearer old-token".to_owned()),
            (201, "Bearer new-token".to_owned())
        ]
    );
    // A token that stays refused is reported as such, once read again.
    receiver.require_token("yet-another");
    let pool = sqlx::PgPool::connect_lazy("postgres://nowhere/x").unwrap();
    let alerter = Alerter::new(
        pool,
        client,
        Routes::default(),
        Arc::new(SystemClock),
        Duration::from_secs(1),
        Duration::from_secs(900),
    );
    let refused = alerter
        .client()
        .create_incident(&json!({"name": "n"}), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            shared::paging::AlertError::Rejected { status: 401, .. }
        ),
        "{refused}"
    );
}
