//! The SQS side of the harness: an SQS batch in, a partial batch response out.
//!
//! Invariants: a record is reported as a batch-item failure unless its outcome is an ack
//! (processed, duplicate, or dead letter committed), so nothing is deleted that is not done.
//! A retry sets the message's visibility to the backoff delay; if that call fails the record
//! is still reported and comes back after the queue's visibility timeout. Records not started
//! when the Lambda deadline is near are handed back untouched rather than cut off mid-work.
//!
//! A process crash (an abort, out of memory, a timeout) fails the whole invocation, as Lambda
//! does, and every record not yet committed comes back. So records on their first delivery,
//! which cannot have crashed anything yet, run first and concurrently; records seen before
//! (retries, survivors of a crash) run afterwards one at a time, those with the fewest
//! executions charged first. A crash-looping job then cannot take down its batch-mates: they
//! have committed before it runs, and a crash is charged to it alone (see [`crate::ledger`]).

use crate::consumer::Consumer;
use crate::dead_letter::REPLAY_OF_ATTRIBUTE;
use crate::harness::{Harness, IncomingMessage, RecordOutcome};
use crate::ids::DeadLetterId;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsMessage};
use chrono::{DateTime, Utc};
use std::future::Future;
use std::time::Duration;

/// Hides a message for a while: the one SQS call the consumer makes (`ChangeMessageVisibility`).
pub trait Visibility: Send + Sync {
    /// Makes the message reappear after `after`.
    fn delay(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// [`Visibility`] through the AWS SDK.
#[derive(Debug, Clone)]
pub struct SqsVisibility(pub aws_sdk_sqs::Client);

impl Visibility for SqsVisibility {
    async fn delay(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        after: Duration,
    ) -> Result<(), String> {
        self.0
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(visibility_seconds(after))
            .send()
            .await
            .map(drop)
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())
    }
}

/// A delay as SQS visibility seconds: rounded up, at most 12 hours.
pub fn visibility_seconds(after: Duration) -> i32 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.min(crate::retry::MAX_DELAY.as_secs()) as i32
}

/// A queue named by an SQS ARN (`arn:aws:sqs:<region>:<account>:<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRef {
    /// The queue's name.
    pub name: String,
    /// The queue's URL.
    pub url: String,
}

impl QueueRef {
    /// Parses an SQS queue ARN; `None` if it is not one.
    pub fn from_arn(arn: &str) -> Option<Self> {
        let parts: Vec<&str> = arn.split(':').collect();
        match parts.as_slice() {
            ["arn", partition, "sqs", region, account, name] if !name.is_empty() => {
                let domain = if partition.starts_with("aws-cn") {
                    "amazonaws.com.cn"
                } else {
                    "amazonaws.com"
                };
                Some(Self {
                    name: (*name).to_owned(),
                    url: format!("https://sqs.{region}.{domain}/{account}/{name}"),
                })
            }
            _ => None,
        }
    }
}

/// The transport-independent view of one SQS record. A record without a message id (Lambda
/// always sends one) gets a fresh one: a letter is unique per message id, and two such records
/// must never share one letter.
pub fn incoming(record: &SqsMessage) -> IncomingMessage {
    delivery(record.clone()).0
}

/// Where a record's visibility is changed: its queue's URL and its receipt handle.
struct Receipt {
    queue_url: String,
    handle: String,
}

/// A record as the harness takes it, and its [`Receipt`] when it has one: the queue's ARN read
/// once for both.
fn delivery(record: SqsMessage) -> (IncomingMessage, Option<Receipt>) {
    let queue = record
        .event_source_arn
        .as_deref()
        .and_then(QueueRef::from_arn);
    let receive_count = receive_count(&record);
    let replay_of = record
        .message_attributes
        .get(REPLAY_OF_ATTRIBUTE)
        .and_then(|a| a.string_value.as_deref())
        .and_then(|v| v.parse().ok())
        .map(DeadLetterId);
    let trace = trace_of(&record);
    let msg = IncomingMessage {
        message_id: record
            .message_id
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| format!("missing-message-id-{}", uuid::Uuid::new_v4())),
        queue: queue
            .as_ref()
            .map(|q| q.name.clone())
            .unwrap_or_else(|| "unknown".into()),
        body: record.body.unwrap_or_default(),
        receive_count,
        replay_of,
        message_group: record.attributes.get("MessageGroupId").cloned(),
        trace,
    };
    let receipt = queue
        .zip(record.receipt_handle)
        .map(|(queue, handle)| Receipt {
            queue_url: queue.url,
            handle,
        });
    (msg, receipt)
}

/// The trace contexts `record` carried: SQS's `AWSTraceHeader` system attribute and a
/// `traceparent` message attribute, each only if it is one (a producer wrote them).
fn trace_of(record: &SqsMessage) -> crate::telemetry::otel::MessageTrace {
    use crate::telemetry::otel::{AWS_TRACE_HEADER, TRACEPARENT_ATTRIBUTE, TraceParent};
    crate::telemetry::otel::MessageTrace {
        aws: record
            .attributes
            .get(AWS_TRACE_HEADER)
            .and_then(|h| TraceParent::from_xray(h)),
        w3c: record
            .message_attributes
            .get(TRACEPARENT_ATTRIBUTE)
            .and_then(|a| a.string_value.as_deref())
            .and_then(TraceParent::from_w3c),
    }
}

/// `ApproximateReceiveCount`, at least 1.
pub fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|c| c.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// How a batch is processed.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// Records processed at once (at most the pool size).
    pub concurrency: usize,
    /// A record is started only if at least this much time is left before the deadline.
    pub deadline_margin: Duration,
}

/// The invocation's deadline from Lambda's `Lambda-Runtime-Deadline-Ms` (epoch milliseconds), or
/// `None` when it cannot be real: a deadline already past when the invocation starts. Local
/// emulators send one (cargo-lambda 1.9 sends the timeout as a duration, `600000`, which reads
/// as 1970); believing it would hand every record back unstarted. Warns once per process.
pub fn invocation_deadline(deadline_ms: u64, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let deadline = DateTime::from_timestamp_millis(i64::try_from(deadline_ms).ok()?)?;
    if deadline > now {
        return Some(deadline);
    }
    WARNED.call_once(|| {
        tracing::warn!(deadline_ms, "the invocation's deadline is already past, so it cannot be real (a local emulator?): running without one");
    });
    None
}

/// Processes an SQS batch and returns the records to leave on the queue (see
/// [`Harness::process_batch`]: duplicates in one statement, new jobs together in batch mode or
/// concurrently, repeat deliveries one at a time). With a `deadline`, a record is started only
/// while `settings.deadline_margin` is left before it. A record to retry gets its visibility set
/// to its backoff.
pub async fn process_batch<C: Consumer>(
    harness: &Harness<C>,
    visibility: &impl Visibility,
    records: Vec<SqsMessage>,
    deadline: Option<DateTime<Utc>>,
    settings: BatchSettings,
) -> SqsBatchResponse {
    let margin =
        chrono::Duration::from_std(settings.deadline_margin).unwrap_or(chrono::Duration::MAX);
    let may_start = || deadline.is_none_or(|deadline| harness.now() + margin < deadline);
    observe_ages(harness, &records);
    let (msgs, receipts): (Vec<IncomingMessage>, Vec<Option<Receipt>>) =
        records.into_iter().map(delivery).unzip();
    let outcomes = harness
        .process_batch(&msgs, &may_start, settings.concurrency)
        .await;
    let reports = msgs
        .iter()
        .zip(&receipts)
        .zip(&outcomes)
        .map(|((msg, receipt), outcome)| {
            report(
                harness.consumer().name().as_str(),
                visibility,
                msg,
                receipt.as_ref(),
                outcome.as_ref(),
            )
        });
    let failures: Vec<String> = futures_util::future::join_all(reports)
        .await
        .into_iter()
        .flatten()
        .collect();
    batch_response(failures)
}

/// One [`crate::metrics::MESSAGE_AGE`] sample per record that has a `SentTimestamp`: how long
/// it waited in the queue before this invocation took it.
fn observe_ages<C: Consumer>(harness: &Harness<C>, records: &[SqsMessage]) {
    let now = harness.now();
    for sent in records.iter().filter_map(sent_at) {
        let age = (now - sent).to_std().unwrap_or_default();
        harness
            .metrics()
            .observe_duration(crate::metrics::MESSAGE_AGE, age);
    }
}

/// When the record's message was first sent (SQS `SentTimestamp`, epoch milliseconds; a
/// standard queue's redrive keeps it), if the record says.
pub(crate) fn sent_at(record: &SqsMessage) -> Option<DateTime<Utc>> {
    let millis: i64 = record.attributes.get("SentTimestamp")?.parse().ok()?;
    DateTime::from_timestamp_millis(millis)
}

/// The record's batch-item failure, unless its outcome is an ack; a record to redeliver later
/// first gets its visibility set to the outcome's delay.
async fn report(
    consumer: &str,
    visibility: &impl Visibility,
    msg: &IncomingMessage,
    receipt: Option<&Receipt>,
    outcome: Option<&RecordOutcome>,
) -> Option<String> {
    let after = match outcome {
        None => return Some(msg.message_id.clone()), // not started: back as it came
        Some(outcome) => outcome.redeliver_after()?,
    };
    if let Some(receipt) = receipt
        && let Err(error) = visibility
            .delay(&receipt.queue_url, &receipt.handle, after)
            .await
    {
        let ids = crate::envelope::read_ids(&msg.body);
        let _in_its_span =
            crate::telemetry::record_lines_span(consumer, &msg.message_id, &ids).entered();
        tracing::warn!(
            error,
            "ChangeMessageVisibility failed; the message returns after the queue's visibility timeout"
        );
    }
    Some(msg.message_id.clone())
}

/// A partial batch response reporting `message_ids` as failed.
pub fn batch_response(message_ids: Vec<String>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = message_ids
        .into_iter()
        .map(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_urls_come_from_arns() {
        let q = QueueRef::from_arn("arn:aws:sqs:eu-west-1:123456789012:points-award-jobs").unwrap();
        assert_eq!(q.name, "points-award-jobs");
        assert_eq!(
            q.url,
            "https://sqs.eu-west-1.amazonaws.com/123456789012/points-award-jobs"
        );
        assert_eq!(QueueRef::from_arn("arn:aws:sns:eu-west-1:1:topic"), None);
        assert_eq!(QueueRef::from_arn("nonsense"), None);
    }

    #[test]
    fn a_deadline_already_past_is_no_deadline() {
        let now = DateTime::from_timestamp_millis(1_800_000_000_000).unwrap();
        assert_eq!(
            invocation_deadline(600_000, now),
            None,
            "cargo lambda watch"
        );
        assert_eq!(invocation_deadline(1_800_000_000_000, now), None);
        assert_eq!(
            invocation_deadline(1_800_000_060_000, now),
            DateTime::from_timestamp_millis(1_800_000_060_000)
        );
        assert_eq!(invocation_deadline(u64::MAX, now), None);
    }

    #[test]
    fn visibility_rounds_up_and_caps_at_twelve_hours() {
        assert_eq!(visibility_seconds(Duration::from_millis(1_200)), 2);
        assert_eq!(visibility_seconds(Duration::from_secs(30)), 30);
        assert_eq!(visibility_seconds(Duration::from_secs(100_000)), 43_200);
    }

    #[test]
    fn records_map_to_incoming_messages() {
        let record: SqsMessage = serde_json::from_value(serde_json::json!({
            "messageId": "m-1", "receiptHandle": "r", "body": "{}",
            "attributes": {"ApproximateReceiveCount": "3"},
            "messageAttributes": {"replay_of": {"stringValue": "6f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f", "dataType": "String"}},
            "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:jobs", "eventSource": "aws:sqs"
        }))
        .unwrap();
        let msg = incoming(&record);
        assert_eq!(
            (
                msg.message_id.as_str(),
                msg.queue.as_str(),
                msg.receive_count
            ),
            ("m-1", "jobs", 3)
        );
        assert_eq!(
            msg.replay_of.unwrap().to_string(),
            "6f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f"
        );
        let bare: SqsMessage = serde_json::from_value(serde_json::json!({})).unwrap();
        let msg = incoming(&bare);
        assert_eq!((msg.receive_count, msg.body.as_str()), (1, ""));
        assert_ne!(
            incoming(&bare).message_id,
            msg.message_id,
            "no two id-less records share an id"
        );
    }
}
