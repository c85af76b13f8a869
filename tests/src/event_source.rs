//! Lambda's SQS event source mapping, locally, against a real SQS API (moto's server): receive
//! a batch, invoke the function with the SQS event, delete the records that did not fail, leave
//! the rest. With `ReportBatchItemFailures`, as `template.yaml` configures it.

use crate::lambda_host::LambdaHost;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::time::Duration;

/// An SQS client for the local API named by `AWS_ENDPOINT_URL_SQS`.
pub async fn sqs_client() -> Client {
    assert!(
        std::env::var_os("AWS_ENDPOINT_URL_SQS").is_some(),
        "AWS_ENDPOINT_URL_SQS is not set: these tests need the local SQS API, which `bash scripts/test.sh` starts"
    );
    Client::new(&aws_config::load_from_env().await)
}

/// A queue: its name, URL and ARN.
#[derive(Debug, Clone)]
pub struct Queue {
    /// Name.
    pub name: String,
    /// URL as the API returned it.
    pub url: String,
    /// ARN, as the event source puts in `eventSourceARN`.
    pub arn: String,
}

/// Creates (or finds) a queue with the given attributes.
pub async fn create_queue(
    sqs: &Client,
    name: &str,
    attributes: &[(QueueAttributeName, String)],
) -> Queue {
    let mut request = sqs.create_queue().queue_name(name);
    for (key, value) in attributes {
        request = request.attributes(key.clone(), value);
    }
    let url = request
        .send()
        .await
        .expect("CreateQueue")
        .queue_url
        .expect("queue url");
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("GetQueueAttributes");
    let arn = attrs
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("QueueArn");
    Queue {
        name: name.to_owned(),
        url,
        arn,
    }
}

/// A job queue and its backstop DLQ, wired with a redrive policy. A `name` ending in `.fifo`
/// makes both FIFO queues (SQS requires a FIFO queue's DLQ to be one), with content-based
/// deduplication as `templates/consumer.yaml` declares them.
pub async fn create_queue_pair(
    sqs: &Client,
    name: &str,
    visibility: Duration,
    max_receive_count: u32,
) -> (Queue, Queue) {
    let fifo = name.strip_suffix(".fifo");
    let fifo_attributes: Vec<(QueueAttributeName, String)> = match fifo {
        Some(_) => vec![
            (QueueAttributeName::FifoQueue, "true".into()),
            (QueueAttributeName::ContentBasedDeduplication, "true".into()),
        ],
        None => Vec::new(),
    };
    let dlq_name = match fifo {
        Some(stem) => format!("{stem}-dlq.fifo"),
        None => format!("{name}-dlq"),
    };
    let dlq = create_queue(sqs, &dlq_name, &fifo_attributes).await;
    let redrive =
        json!({"deadLetterTargetArn": dlq.arn, "maxReceiveCount": max_receive_count.to_string()});
    let mut attributes = vec![
        (
            QueueAttributeName::VisibilityTimeout,
            visibility.as_secs().to_string(),
        ),
        (QueueAttributeName::RedrivePolicy, redrive.to_string()),
    ];
    attributes.extend(fifo_attributes);
    let jobs = create_queue(sqs, name, &attributes).await;
    (jobs, dlq)
}

impl Queue {
    /// Whether it is a FIFO queue (its name ends in `.fifo`, as SQS requires).
    pub fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }
}

/// Messages visible plus in flight.
pub async fn depth(sqs: &Client, queue: &Queue) -> u64 {
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&queue.url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default();
    attrs.values().filter_map(|v| v.parse::<u64>().ok()).sum()
}

/// What one poll did.
#[derive(Debug, Default, Clone)]
pub struct PollReport {
    /// Records received and passed to the function.
    pub received: usize,
    /// Records deleted (the function did not report them).
    pub deleted: usize,
    /// Records left on the queue.
    pub left: usize,
    /// Why the invocation failed, if it did (then every record is left).
    pub invoke_error: Option<String>,
    /// Each record received: its message id, receive count, and whether it was deleted (what a
    /// soak writes down, so a job it finds lost can be followed through the queue).
    pub records: Vec<(String, String, bool)>,
}

/// A function an event source can invoke: a [`LambdaHost`] here, or one served over HTTP by
/// `cargo lambda watch` ([`WatchedFunction`]).
pub trait Invoke: Sync {
    /// Invokes the function with `event`; its response, or why there is none.
    fn invoke(&self, event: &Value) -> impl Future<Output = Result<Value, String>> + Send;
}

impl Invoke for LambdaHost {
    async fn invoke(&self, event: &Value) -> Result<Value, String> {
        LambdaHost::invoke(self, event)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A function `cargo lambda watch` serves: invoked through its Lambda Invoke API
/// (`POST /2015-03-31/functions/<name>/invocations`), as `cargo lambda invoke` does.
pub struct WatchedFunction {
    /// `http://127.0.0.1:9000/2015-03-31/functions/<name>/invocations`.
    pub url: String,
    /// The HTTP client.
    pub http: reqwest::Client,
}

impl WatchedFunction {
    /// The function `name` (its binary) of the `watch` listening on `addr` (`127.0.0.1:9000`).
    pub fn new(addr: &str, name: &str) -> Self {
        Self {
            url: format!("http://{addr}/2015-03-31/functions/{name}/invocations"),
            http: reqwest::Client::new(),
        }
    }
}

impl Invoke for WatchedFunction {
    async fn invoke(&self, event: &Value) -> Result<Value, String> {
        let response = self
            .http
            .post(&self.url)
            .json(event)
            .timeout(Duration::from_secs(300)) // a first invoke waits for the build
            .send()
            .await
            .map_err(|e| format!("no answer from cargo lambda watch at {}: {e}", self.url))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {body}"));
        }
        let value: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if value.get("errorType").is_some() || value.get("errorMessage").is_some() {
            return Err(format!("function error: {value}"));
        }
        Ok(value)
    }
}

/// One queue feeding one function.
pub struct EventSource<'a, F: Invoke = LambdaHost> {
    /// The SQS client.
    pub sqs: &'a Client,
    /// The queue polled.
    pub queue: &'a Queue,
    /// The function invoked.
    pub function: &'a F,
    /// Records per invocation (1–10).
    pub batch_size: i32,
    /// The share of `DeleteMessageBatch` calls that are lost (an injected SQS API fault): the
    /// records stay and come back after the visibility timeout, as duplicates. 0 normally.
    pub delete_loss: f64,
}

impl<F: Invoke> EventSource<'_, F> {
    /// Receives one batch (waiting up to 1 s for it), invokes the function, deletes what succeeded.
    pub async fn poll_once(&self) -> PollReport {
        let received = self
            .sqs
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(self.batch_size)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await;
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                let error = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
                return PollReport {
                    invoke_error: Some(format!("ReceiveMessage: {error}")),
                    ..Default::default()
                };
            }
        };
        if messages.is_empty() {
            return PollReport::default();
        }
        let records: Vec<Value> = messages.iter().map(|m| self.record(m)).collect();
        let mut report = PollReport {
            received: messages.len(),
            ..Default::default()
        };
        let failed: HashSet<String> = match self.function.invoke(&json!({"Records": records})).await
        {
            Ok(response) => response["batchItemFailures"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
                .collect(),
            Err(e) => {
                report.invoke_error = Some(e);
                messages
                    .iter()
                    .filter_map(|m| m.message_id.clone())
                    .collect()
            }
        };
        let done: Vec<_> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.message_id.as_ref().is_some_and(|id| failed.contains(id)))
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle.clone().unwrap_or_default())
                    .build()
                    .expect("entry")
            })
            .collect();
        report.records = messages
            .iter()
            .map(|m| {
                let id = m.message_id.clone().unwrap_or_default();
                let count = m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .cloned()
                    .unwrap_or_default();
                let deleted = !failed.contains(&id);
                (id, count, deleted)
            })
            .collect();
        if !done.is_empty() && self.delete_loss > 0.0 && rand::random_bool(self.delete_loss) {
            report.left = messages.len();
            report.records.iter_mut().for_each(|r| r.2 = false);
            report.invoke_error = Some("DeleteMessageBatch lost (injected fault)".into());
            return report;
        }
        report.deleted = done.len();
        report.left = messages.len() - done.len();
        if !done.is_empty() {
            self.sqs
                .delete_message_batch()
                .queue_url(&self.queue.url)
                .set_entries(Some(done))
                .send()
                .await
                .expect("DeleteMessageBatch");
        }
        report
    }

    /// The record as Lambda's SQS event source delivers it.
    fn record(&self, m: &aws_sdk_sqs::types::Message) -> Value {
        let attributes: Map<String, Value> = m
            .attributes
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str().to_owned(), Value::String(v.clone())))
            .collect();
        let message_attributes: Map<String, Value> = m
            .message_attributes
            .iter()
            .flatten()
            .map(|(k, v)| {
                let value = json!({"stringValue": v.string_value, "stringListValues": [], "binaryListValues": [], "dataType": v.data_type});
                (k.clone(), value)
            })
            .collect();
        json!({
            "messageId": m.message_id, "receiptHandle": m.receipt_handle, "body": m.body,
            "attributes": attributes, "messageAttributes": message_attributes,
            "md5OfBody": m.md5_of_body, "eventSource": "aws:sqs",
            "eventSourceARN": self.queue.arn, "awsRegion": "us-east-1",
        })
    }
}
