//! What tests hand the harness and the store: envelopes, messages, batches and letters, built
//! the one way the kit builds them.

use serde_json::{Value, json};
use shared::dead_letter::{ErrorKind, NewDeadLetter};
use shared::harness::IncomingMessage;
use shared::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use uuid::Uuid;

/// The queue the kit's messages come from.
pub const QUEUE: &str = "testkit-jobs";

/// The tenant of every [`job`].
pub const TENANT: TenantId = TenantId(Uuid::from_u128(7));

/// The body of a well-formed envelope (`job_id`, `tenant_id`, `correlation_id`, `payload`).
pub fn envelope(
    job_id: JobId,
    tenant_id: TenantId,
    correlation_id: &str,
    payload: Value,
) -> String {
    json!({
        "job_id": job_id,
        "tenant_id": tenant_id,
        "correlation_id": correlation_id,
        "payload": payload,
    })
    .to_string()
}

/// A new job of [`TENANT`] carrying `payload`, correlated as `corr-<job id>`: its id and the
/// body of its envelope.
pub fn job(payload: Value) -> (JobId, String) {
    let job_id = JobId(Uuid::new_v4());
    (
        job_id,
        envelope(job_id, TENANT, &format!("corr-{job_id}"), payload),
    )
}

/// A new message (its own message id) on [`QUEUE`] carrying `body`, on its `receive_count`th
/// delivery.
pub fn message(body: &str, receive_count: u32) -> IncomingMessage {
    message_on(QUEUE, body, receive_count)
}

/// [`message`] from `queue`.
pub fn message_on(queue: &str, body: &str, receive_count: u32) -> IncomingMessage {
    IncomingMessage {
        message_id: Uuid::new_v4().to_string(),
        queue: queue.into(),
        body: body.into(),
        receive_count,
        replay_of: None,
        message_group: None,
        trace: Default::default(),
    }
}

/// `body`'s envelope with its payload replaced by `payload`: the same job id and tenant, so
/// another job under the id, or an edit of the job.
pub fn with_payload(body: &str, payload: Value) -> String {
    let mut envelope: Value = serde_json::from_str(body).expect("an envelope");
    envelope["payload"] = payload;
    envelope.to_string()
}

/// `msg` in the FIFO message group `group`, as from a FIFO queue (`jobs.fifo`).
pub fn in_group(group: &str, msg: IncomingMessage) -> IncomingMessage {
    IncomingMessage {
        message_group: Some(group.into()),
        queue: "jobs.fifo".into(),
        ..msg
    }
}

/// A first delivery of each body, as one SQS batch.
pub fn batch(bodies: &[String]) -> Vec<IncomingMessage> {
    bodies.iter().map(|body| message(body, 1)).collect()
}

/// A dead letter a test writes by hand, owning its fields: by default of no tenant, with a
/// message id of its own, written on its fifth attempt as `exhausted` after a `timeout`. Change
/// what a test needs with `TestLetter { kind, ..TestLetter::new(..) }`.
#[derive(Debug, Clone)]
pub struct TestLetter {
    /// The job, unless the message was too broken to carry one.
    pub job_id: Option<JobId>,
    /// The tenant.
    pub tenant_id: Option<TenantId>,
    /// The consumer that gave up.
    pub consumer: ConsumerName,
    /// The queue the message came from.
    pub queue: String,
    /// The SQS message id.
    pub message_id: String,
    /// The body as received.
    pub body: String,
    /// The attempt on which the letter was written.
    pub attempts: u32,
    /// Why.
    pub kind: ErrorKind,
    /// The last error.
    pub last_error: String,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// The letter whose replay produced this message.
    pub replay_of: Option<DeadLetterId>,
    /// The message's FIFO group.
    pub message_group: Option<String>,
}

impl TestLetter {
    /// A letter of `job_id` for `consumer`, of a message from `queue` carrying `body`.
    pub fn new(job_id: Option<JobId>, consumer: &ConsumerName, queue: &str, body: &str) -> Self {
        Self {
            job_id,
            tenant_id: None,
            consumer: consumer.clone(),
            queue: queue.to_owned(),
            message_id: Uuid::new_v4().to_string(),
            body: body.to_owned(),
            attempts: 5,
            kind: ErrorKind::Exhausted,
            last_error: "timeout".to_owned(),
            correlation_id: None,
            replay_of: None,
            message_group: None,
        }
    }

    /// The letter as the store takes it.
    pub fn as_new(&self) -> NewDeadLetter<'_> {
        NewDeadLetter {
            job_id: self.job_id,
            tenant_id: self.tenant_id,
            consumer: &self.consumer,
            queue: &self.queue,
            message_id: &self.message_id,
            body: &self.body,
            attempts: self.attempts,
            kind: self.kind,
            last_error: &self.last_error,
            correlation_id: self.correlation_id.as_deref(),
            replay_of: self.replay_of,
            message_group: self.message_group.as_deref(),
            digest_fields: &[],
            trace: None,
            nul_replaced: false,
        }
    }
}
