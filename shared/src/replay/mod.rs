//! Republishing a dead letter's stored envelope to its queue: the replay route's send, and the
//! scheduled run's for replays recorded but not yet sent. No other function sends.
//!
//! Invariant: the body sent is the body received, byte for byte where it was JSON (same `job_id`,
//! so the consumer's fence makes the replay a no-op if the job already succeeded). The message
//! carries [`REPLAY_OF_ATTRIBUTE`], so a replay that fails again is linked to this letter.
//! A replay the queue refused stays `queued`, with a send state ([`crate::replay::sends`]); the
//! refusal says whether it was the queue's ([`Refusal::Queue`]) or this message's
//! ([`Refusal::Message`]).

pub mod sends;

use crate::dead_letter::{DeadLetter, ErrorKind, REPLAY_OF_ATTRIBUTE};
use crate::telemetry::otel::TRACEPARENT_ATTRIBUTE;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
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

/// Why a replay was not sent: the queue refused any message, or only this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The queue refused, whatever the message: it does not exist (or its URL could not be
    /// read), access is denied, it throttles, or it did not answer in time or could not be
    /// reached. Its other replays would meet the same answer now. Also any answer not known to
    /// be about the message: taken for the queue's, it costs the queue's other replays one run.
    Queue(String),
    /// This message was refused (its body, its attributes: invalid contents, too long, an
    /// invalid attribute); the queue takes others.
    Message(String),
}

impl Refusal {
    /// Whether the queue refused, not only this message.
    pub(crate) fn queue_level(&self) -> bool {
        matches!(self, Self::Queue(_))
    }

    /// What was answered, for the log and the send state.
    pub fn error(&self) -> &str {
        match self {
            Self::Queue(error) | Self::Message(error) => error,
        }
    }

    /// The refusal of a SendMessage to `queue_url`: the message's if SQS answered with an error
    /// about it ([`refuses_the_message`]), else the queue's (no answer in time, no connection, a
    /// request not built or an answer not read, any other error code).
    fn of_send<E: ProvideErrorMetadata + std::error::Error + 'static, R: fmt::Debug>(
        queue_url: &str,
        error: SdkError<E, R>,
    ) -> Self {
        let the_message =
            matches!(&error, SdkError::ServiceError(e) if refuses_the_message(e.err().code()));
        let error = format!("SendMessage to {queue_url}: {}", DisplayErrorContext(error));
        if the_message {
            Self::Message(error)
        } else {
            Self::Queue(error)
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.error())
    }
}

/// Whether SQS's error `code` for a SendMessage is about the message (its body, its attributes,
/// its parameters), which another message to the same queue would not meet. Both spellings are
/// known: the query code (`InvalidParameterValue`) and the JSON one (`…Exception`).
pub(crate) fn refuses_the_message(code: Option<&str>) -> bool {
    let code = code.unwrap_or_default();
    let code = code.strip_suffix("Exception").unwrap_or(code);
    matches!(
        code,
        "InvalidMessageContents"
            | "InvalidParameterValue"
            | "InvalidParameterCombination"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "MissingParameter"
    )
}

impl Replayer {
    /// A replayer over `client`.
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            urls: Mutex::default(),
        }
    }

    /// Sends `letter`'s replay body ([`letter_body`]: the edited envelope of an edited replay,
    /// else the stored one) to `letter.queue`; a refusal says whether it was the queue's or the
    /// message's.
    pub async fn send(&self, letter: &DeadLetter) -> Result<Sent, Refusal> {
        let queue_url = self.queue_url(&letter.queue).await?;
        let attribute = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(letter.id.to_string())
            .build()
            .map_err(|e| Refusal::Message(format!("the {REPLAY_OF_ATTRIBUTE} attribute: {e}")))?;
        let (group, deduplication) = fifo_ids(letter).unzip();
        let sent = self
            .client
            .send_message()
            .queue_url(&queue_url)
            .message_body(letter_body(letter))
            .set_message_attributes(with_trace(
                letter,
                Some(HashMap::from([(REPLAY_OF_ATTRIBUTE.to_owned(), attribute)])),
            ))
            .set_message_group_id(group)
            .set_message_deduplication_id(deduplication)
            .send()
            .await
            .map_err(|e| Refusal::of_send(&queue_url, e))?;
        Ok(Sent {
            message_id: sent.message_id.unwrap_or_default(),
            queue_url,
        })
    }

    /// Sends the replays of `letters` (of one queue or several) in `SendMessageBatch` calls of
    /// at most ten messages and [`MAX_MESSAGE_BYTES`] in all, one queue per call: what each
    /// letter's send did, in `letters`' order. A call that fails is every one of its messages'
    /// refusal (the queue's, unless SQS said the request was at fault).
    pub async fn send_batch(&self, letters: &[&DeadLetter]) -> Vec<Result<Sent, Refusal>> {
        let mut results: Vec<Option<Result<Sent, Refusal>>> = vec![None; letters.len()];
        for batch in batches(letters) {
            let queue = &letters[batch[0]].queue;
            let sent = match self.queue_url(queue).await {
                Ok(url) => self.send_one_batch(&url, letters, &batch).await,
                Err(refusal) => batch.iter().map(|_| Err(refusal.clone())).collect(),
            };
            for (i, result) in batch.into_iter().zip(sent) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Refusal::Queue("not sent".into()))))
            .collect()
    }

    /// One `SendMessageBatch` of `letters[batch]` to `queue_url`.
    async fn send_one_batch(
        &self,
        queue_url: &str,
        letters: &[&DeadLetter],
        batch: &[usize],
    ) -> Vec<Result<Sent, Refusal>> {
        let mut entries = Vec::with_capacity(batch.len());
        for (n, &i) in batch.iter().enumerate() {
            let letter = letters[i];
            let (group, deduplication) = fifo_ids(letter).unzip();
            let attribute = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(letter.id.to_string())
                .build();
            let entry = attribute.and_then(|attribute| {
                let attributes = HashMap::from([(REPLAY_OF_ATTRIBUTE.to_owned(), attribute)]);
                SendMessageBatchRequestEntry::builder()
                    .id(n.to_string())
                    .message_body(letter_body(letter))
                    .set_message_attributes(with_trace(letter, Some(attributes)))
                    .set_message_group_id(group)
                    .set_message_deduplication_id(deduplication)
                    .build()
            });
            match entry {
                Ok(entry) => entries.push(entry),
                Err(e) => {
                    let refusal = Refusal::Message(format!("the batch entry: {e}"));
                    return batch.iter().map(|_| Err(refusal.clone())).collect();
                }
            }
        }
        let answer = self
            .client
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                let refusal = Refusal::of_send(queue_url, e);
                return batch.iter().map(|_| Err(refusal.clone())).collect();
            }
        };
        let mut results: Vec<Result<Sent, Refusal>> = batch
            .iter()
            .map(|_| {
                Err(Refusal::Queue(format!(
                    "SendMessageBatch to {queue_url}: no answer for the entry"
                )))
            })
            .collect();
        for ok in answer.successful {
            if let Some(slot) = ok.id.parse::<usize>().ok().and_then(|n| results.get_mut(n)) {
                *slot = Ok(Sent {
                    message_id: ok.message_id,
                    queue_url: queue_url.to_owned(),
                });
            }
        }
        for failed in answer.failed {
            let error = format!(
                "SendMessageBatch to {queue_url}: {} ({})",
                failed.code,
                failed.message.as_deref().unwrap_or_default()
            );
            let refusal = if refuses_the_message(Some(&failed.code)) || failed.sender_fault {
                Refusal::Message(error)
            } else {
                Refusal::Queue(error)
            };
            if let Some(slot) = failed
                .id
                .parse::<usize>()
                .ok()
                .and_then(|n| results.get_mut(n))
            {
                *slot = Err(refusal);
            }
        }
        results
    }

    /// `queue`'s URL; not found, it is the queue's refusal, whatever the error.
    async fn queue_url(&self, queue: &str) -> Result<String, Refusal> {
        if let Some(url) = self.urls.lock().await.get(queue) {
            return Ok(url.clone());
        }
        let url = self
            .client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| {
                Refusal::Queue(format!("GetQueueUrl {queue}: {}", DisplayErrorContext(e)))
            })?
            .queue_url
            .ok_or_else(|| {
                Refusal::Queue(format!("GetQueueUrl {queue}: no URL in the response"))
            })?;
        self.urls.lock().await.insert(queue.to_owned(), url.clone());
        Ok(url)
    }
}

/// Why a letter cannot be replayed, whatever its body: its replay could apply another job, or
/// this one twice. One rule for the one-letter route and for bulk replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReplayable {
    /// A copy that arrived after its job's fence could have expired: whether the job committed
    /// cannot be known.
    Unsettled,
    /// A poison message without a readable job id: a replay could not be deduplicated.
    NoJobId,
    /// Another job committed under the letter's job id.
    AnotherJob,
}

impl NotReplayable {
    /// What the operator is told, with what to do instead.
    pub fn why(self) -> &'static str {
        match self {
            Self::Unsettled => {
                "this copy arrived after its job's fence could have expired, so whether the job \
                 committed cannot be known and a replay could apply it twice; check the effect by \
                 hand, then discard the letter with a reason"
            }
            Self::NoJobId => {
                "this letter is a poison message without a readable job_id, so a replay could not \
                 be deduplicated; fix and republish it by hand, then discard it with a reason"
            }
            Self::AnotherJob => {
                "another job committed under this letter's job_id (its fence keeps another \
                 payload's digest): this job never ran, and a replay would be taken for the other; \
                 send it under a new job_id, then discard this letter with a reason"
            }
        }
    }
}

/// The letter's job id, unless a replay could apply another job or this one twice.
/// `fence_of_another_job`: its job's fence keeps another payload's digest
/// ([`crate::dead_letter::fence_is_another_job`]). Another job under the id is what the fence
/// says, not what the letter's kind said when it was written: a conflict letter of a body of the
/// committed job's family of edits (a copy that raced the edit's commit) is the job's, done, and
/// a replay sends nothing. Only a conflict letter without a digest is taken at its word.
pub fn replayable(
    letter: &DeadLetter,
    fence_of_another_job: bool,
) -> Result<crate::ids::JobId, NotReplayable> {
    if letter.error_kind == ErrorKind::Unsettled {
        return Err(NotReplayable::Unsettled);
    }
    let Some(job_id) = letter.job_id else {
        return Err(NotReplayable::NoJobId);
    };
    let another_job = match (letter.error_kind, &letter.job_digest) {
        (ErrorKind::Conflict, None) => true,
        _ => fence_of_another_job,
    };
    if another_job {
        return Err(NotReplayable::AnotherJob);
    }
    Ok(job_id)
}

/// The message attributes a replay carries: `extra` (its [`REPLAY_OF_ATTRIBUTE`]), and the
/// letter's trace context as [`TRACEPARENT_ATTRIBUTE`] (none if it kept none). The whole map:
/// the SDK's `set_message_attributes` replaces whatever was added before it.
fn with_trace(
    letter: &DeadLetter,
    extra: Option<HashMap<String, MessageAttributeValue>>,
) -> Option<HashMap<String, MessageAttributeValue>> {
    let mut attributes = extra.unwrap_or_default();
    if let Some(trace) = sent_trace(letter)
        && let Ok(value) = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(trace)
            .build()
    {
        attributes.insert(TRACEPARENT_ATTRIBUTE.to_owned(), value);
    }
    (!attributes.is_empty()).then_some(attributes)
}

/// The letter's trace context, if its replay sends it: only where the message stays within
/// [`MAX_MESSAGE_BYTES`] with it (a trace never makes a replay unsendable: [`refused_by_sqs`]
/// does not count it).
fn sent_trace(letter: &DeadLetter) -> Option<&str> {
    let trace = letter.trace_parent.as_deref()?;
    let with_it = letter_body(letter).len()
        + REPLAY_OF_ATTRIBUTE.len()
        + "String".len()
        + letter.id.to_string().len()
        + trace_attribute_bytes(trace);
    (with_it <= MAX_MESSAGE_BYTES).then_some(trace)
}

/// The bytes SQS counts for `trace` as the [`TRACEPARENT_ATTRIBUTE`].
fn trace_attribute_bytes(trace: &str) -> usize {
    TRACEPARENT_ATTRIBUTE.len() + "String".len() + trace.len()
}

/// `letters` cut into `SendMessageBatch` calls: indexes of one queue's letters, in order, at most
/// ten and [`MAX_MESSAGE_BYTES`] of bodies and attributes a call.
fn batches(letters: &[&DeadLetter]) -> Vec<Vec<usize>> {
    let mut batches: Vec<(String, usize, Vec<usize>)> = Vec::new();
    for (i, letter) in letters.iter().enumerate() {
        let size = letter_body(letter).len()
            + REPLAY_OF_ATTRIBUTE.len()
            + "String".len()
            + 36
            + sent_trace(letter).map_or(0, trace_attribute_bytes);
        let fits = |(queue, bytes, batch): &&mut (String, usize, Vec<usize>)| {
            *queue == letter.queue && batch.len() < 10 && bytes + size <= MAX_MESSAGE_BYTES
        };
        match batches.iter_mut().rev().find(|b| fits(b)) {
            Some((_, bytes, batch)) => {
                *bytes += size;
                batch.push(i);
            }
            None => batches.push((letter.queue.clone(), size, vec![i])),
        }
    }
    batches.into_iter().map(|(_, _, batch)| batch).collect()
}

/// For a letter of a FIFO queue (its name ends in `.fifo`, as SQS requires), what its replay is
/// sent with: the group of the message it was written from (so it waits behind what its group
/// holds; a letter that kept none groups by its job, else by itself), and a deduplication id of
/// its own, the letter's id. Never the original send's: SQS would drop the replay as a copy of
/// it within its 5-minute deduplication interval. A resend of the same replay (the scheduled
/// run's) carries the same id, so SQS drops it if the first send got through; past those 5
/// minutes the job's fence answers for it, as for any copy.
pub fn fifo_ids(letter: &DeadLetter) -> Option<(String, String)> {
    if !letter.queue.ends_with(".fifo") {
        return None;
    }
    let group = match (&letter.message_group, letter.job_id) {
        (Some(group), _) => group.clone(),
        (None, Some(job)) => job.to_string(),
        (None, None) => letter.id.to_string(),
    };
    Some((group, letter.id.to_string()))
}

/// The most bytes SQS takes in one message: its body and each attribute's name, type and value.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Why SQS would refuse `body` sent as a replay of `letter` (with its [`REPLAY_OF_ATTRIBUTE`]),
/// if it would: a character SQS does not take in a message (it takes #x9, #xA, #xD, #x20 to
/// #xD7FF, #xE000 to #xFFFD and #x10000 to #x10FFFF), or a message past [`MAX_MESSAGE_BYTES`]
/// with its attribute. Asked before a replay is recorded, so that no replay is queued that no
/// send could ever deliver: such a letter stays pending, to be edited or discarded.
pub fn refused_by_sqs(letter: &crate::ids::DeadLetterId, body: &str) -> Option<String> {
    let refused = |c: char| {
        !matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
            && c < '\u{10000}'
    };
    if let Some((at, c)) = body.char_indices().find(|&(_, c)| refused(c)) {
        return Some(format!(
            "the body holds U+{:04X} at byte {at}, a character SQS refuses in a message \
             (InvalidMessageContents)",
            u32::from(c)
        ));
    }
    let attribute = REPLAY_OF_ATTRIBUTE.len() + "String".len() + letter.to_string().len();
    let size = body.len() + attribute;
    (size > MAX_MESSAGE_BYTES).then(|| {
        format!(
            "the body is {} bytes, {size} with its {REPLAY_OF_ATTRIBUTE} attribute: SQS takes at \
             most {MAX_MESSAGE_BYTES} in one message",
            body.len()
        )
    })
}

/// The message body a letter's replay sends: the edited envelope of an edited replay, else the
/// body the letter was written from, exactly as received (for a letter older than the stored
/// body, rebuilt from its payload: [`original_body`]).
pub fn letter_body(letter: &DeadLetter) -> String {
    match (&letter.replay_body, &letter.body) {
        (Some(edited), _) => edited.clone(),
        (None, Some(body)) => body.clone(),
        (None, None) => original_body(&letter.payload),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_error_about_the_message_leaves_its_queue_to_the_others() {
        for code in [
            "InvalidMessageContents",
            "InvalidParameterValue",
            "InvalidParameterValueException",
            "InvalidAttributeValue",
            "InvalidAttributeName",
            "MissingParameter",
        ] {
            assert!(refuses_the_message(Some(code)), "{code}");
        }
        for code in [
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
            "AccessDenied",
            "AccessDeniedException",
            "RequestThrottled",
            "ThrottlingException",
            "KMS.ThrottlingException",
            "KMS.AccessDeniedException",
            "InvalidSecurity",
            "InvalidAddress",
            "InternalError",
            "ServiceUnavailable",
            "SomethingNew",
        ] {
            assert!(!refuses_the_message(Some(code)), "{code}");
        }
        assert!(
            !refuses_the_message(None),
            "no code: not known to be the message's"
        );
    }

    #[test]
    fn what_sqs_refuses_is_named_before_anything_is_queued() {
        let id = crate::ids::DeadLetterId(uuid::Uuid::nil());
        for body in [
            "{}",
            "\t\n\r é \u{D7FF} \u{E000} \u{FFFD} \u{10000} \u{10FFFF}",
        ] {
            assert_eq!(refused_by_sqs(&id, body), None, "{body:?}");
        }
        for (body, names) in [
            ("{\"a\":\"\u{FFFF}\"}", "U+FFFF at byte 6"),
            ("\u{FFFE}", "U+FFFE"),
            ("a\u{1}", "U+0001"),
            ("\u{B}", "U+000B"),
        ] {
            let why = refused_by_sqs(&id, body).expect(body);
            assert!(why.contains(names), "{why}");
        }
        // The attribute counts: a body SQS took alone is refused with it.
        let full = "x".repeat(MAX_MESSAGE_BYTES);
        assert!(
            refused_by_sqs(&id, &full)
                .unwrap()
                .contains("with its replay_of")
        );
        let fits = "x".repeat(MAX_MESSAGE_BYTES - 51);
        assert_eq!(refused_by_sqs(&id, &fits), None);
    }

    #[test]
    fn a_refusal_reads_as_its_error() {
        let refusal = Refusal::Message("too long".into());
        assert!(!refusal.queue_level());
        assert_eq!(refusal.to_string(), "too long");
        assert!(Refusal::Queue("gone".into()).queue_level());
    }
}
