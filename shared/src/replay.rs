//! Republishing a dead letter's stored envelope to its queue: the replay route's send, and the
//! scheduled run's for replays recorded but not yet sent. No other function sends.
//!
//! Invariant: the body sent is the body received, byte for byte where it was JSON (same `job_id`,
//! so the consumer's fence makes the replay a no-op if the job already succeeded). The message
//! carries [`REPLAY_OF_ATTRIBUTE`], so a replay that fails again is linked to this letter.
//! A replay the queue refused stays `queued`, with a send state ([`crate::replay_sends`]).

use crate::dead_letter::DeadLetter;
use crate::sqs::REPLAY_OF_ATTRIBUTE;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::MessageAttributeValue;
use serde_json::Value;
use std::collections::HashMap;
use tokio::sync::Mutex;

/// Sends replays through the AWS SDK; queue URLs are looked up by name once and cached.
#[derive(Debug)]
pub struct Replayer {
    client: aws_sdk_sqs::Client,
    urls: Mutex<HashMap<String, String>>,
}

/// A replay the queue accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The new SQS message id.
    pub message_id: String,
    /// The queue URL it went to.
    pub queue_url: String,
}

impl Replayer {
    /// A replayer over `client`.
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            urls: Mutex::default(),
        }
    }

    /// Sends `letter`'s stored envelope to `letter.queue`. The error is for the log.
    pub async fn send(&self, letter: &DeadLetter) -> Result<Sent, String> {
        let queue_url = self.queue_url(&letter.queue).await?;
        let attribute = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(letter.id.to_string())
            .build()
            .map_err(|e| e.to_string())?;
        let sent = self
            .client
            .send_message()
            .queue_url(&queue_url)
            .message_body(letter_body(letter))
            .message_attributes(REPLAY_OF_ATTRIBUTE, attribute)
            .send()
            .await
            .map_err(|e| format!("SendMessage to {queue_url}: {}", DisplayErrorContext(e)))?;
        Ok(Sent {
            message_id: sent.message_id.unwrap_or_default(),
            queue_url,
        })
    }

    async fn queue_url(&self, queue: &str) -> Result<String, String> {
        if let Some(url) = self.urls.lock().await.get(queue) {
            return Ok(url.clone());
        }
        let url = self
            .client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| format!("GetQueueUrl {queue}: {}", DisplayErrorContext(e)))?
            .queue_url
            .ok_or_else(|| format!("GetQueueUrl {queue}: no URL in the response"))?;
        self.urls.lock().await.insert(queue.to_owned(), url.clone());
        Ok(url)
    }
}

/// The message body a letter was written from, exactly as received; for a letter older than
/// the stored body, rebuilt from its payload ([`original_body`]).
pub fn letter_body(letter: &DeadLetter) -> String {
    match &letter.body {
        Some(body) => body.clone(),
        None => original_body(&letter.payload),
    }
}

/// The message body a letter's payload was made from: a JSON body as JSON, a body that was not
/// JSON (stored as a JSON string) as that string.
pub fn original_body(payload: &Value) -> String {
    match payload {
        Value::String(raw) => raw.clone(),
        json => json.to_string(),
    }
}
