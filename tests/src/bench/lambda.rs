//! The functions' own binaries as the benchmarks drive them: each process in the local Lambda
//! host ([`crate::lambda_host`]), invoked with SQS events built from messages, as the event
//! source mapping invokes it.

use crate::lambda_host::{FunctionSpec, LambdaHost};
use serde_json::{Value, json};
use shared::harness::IncomingMessage;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An SQS event of `messages`, each a record as the event source mapping sends it (sent now,
/// received `receive_count` times, from its `queue`).
pub fn sqs_event(messages: impl IntoIterator<Item = IncomingMessage>) -> Value {
    let sent = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .to_string();
    let records: Vec<Value> = messages
        .into_iter()
        .map(|msg| {
            json!({"messageId": msg.message_id, "receiptHandle": "bench", "body": msg.body,
                "attributes": {"ApproximateReceiveCount": msg.receive_count.to_string(), "SentTimestamp": sent},
                "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:us-east-1:123456789012:{}", msg.queue),
                "awsRegion": "us-east-1"})
        })
        .collect();
    json!({ "Records": records })
}

/// A host for the function `name` running `binary` on the database `url` as the reference
/// consumer's (`award-points`), alerting off and logging warnings only, with `env` on top
/// (its pool size, its commit mode, …).
pub fn host(name: &str, binary: PathBuf, url: &str, env: &[(&str, &str)]) -> LambdaHost {
    let consumer = crate::consumer_name();
    let common = [
        ("DATABASE_URL", url),
        ("CONSUMER_NAME", consumer.as_str()),
        ("ALERTING_DISABLED", "true"),
        ("RUST_LOG", "warn"),
    ];
    LambdaHost::new(FunctionSpec {
        name: name.into(),
        binary,
        env: common
            .iter()
            .chain(env)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        timeout: Duration::from_secs(60),
        log_file: None,
        deadline_as_duration: false,
    })
}
