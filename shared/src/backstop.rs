//! The backstop: messages the harness never saw finish (timeouts, out-of-memory, crash loops)
//! are moved by the queue's redrive policy to an SQS DLQ, and become `crashed` dead letters here.
//!
//! Invariant: one letter per message (its id survives the redrive), so a DLQ message delivered
//! twice, or one the harness had already dead-lettered, yields one row. A record is reported
//! as failed (left in the DLQ) unless its letter is committed.

use crate::clock::Clock;
use crate::dead_letter::{ErrorKind, NewDeadLetter, record_dead_letter_in};
use crate::envelope::body_as_json;
use crate::ids::ConsumerName;
use crate::metrics::{Metric, Metrics};
use crate::sqs::{batch_response, incoming, record_ids};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use sqlx::PgPool;
use std::sync::Arc;

/// Writes dead letters for the messages of one consumer's DLQ.
pub struct Backstop {
    /// The database.
    pub pool: PgPool,
    /// The consumer whose queue redrives into this DLQ.
    pub consumer: ConsumerName,
    /// The job queue the messages came from, where a replay sends them.
    pub job_queue: String,
    /// The job queue's redrive `maxReceiveCount`: how often each message was delivered.
    pub max_receive_count: u32,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// `DeadLetteredCrashed` and `DeadLetterWriteFailed` counts.
    pub metrics: Metrics,
    /// Pages BetterStack after the batch's letters are committed, if configured.
    pub alerter: Option<crate::alerting::Alerter>,
}

impl Backstop {
    /// Records a `crashed` letter for each record; returns the records whose letter failed.
    pub async fn ingest(&self, records: Vec<SqsMessage>) -> SqsBatchResponse {
        let mut failed = Vec::new();
        for record in &records {
            let msg = incoming(record);
            let ids = record_ids(record);
            let payload = body_as_json(&msg.body);
            let error = format!(
                "redriven to the dead-letter queue after {} deliveries without a recorded outcome \
                 (timeout, crash or out of memory); see the function's logs for job {}",
                self.max_receive_count,
                ids.job_id
                    .map(|j| j.to_string())
                    .unwrap_or_else(|| "without an id".into())
            );
            // A body too broken to carry a job id can only be poison, and poison is never
            // attempted: its letter says 1, however often crashes of its batch redelivered it.
            let kind = if ids.job_id.is_some() {
                ErrorKind::Crashed
            } else {
                ErrorKind::Poison
            };
            let letter = NewDeadLetter {
                job_id: ids.job_id,
                tenant_id: ids.tenant_id,
                consumer: &self.consumer,
                queue: &self.job_queue,
                message_id: &msg.message_id,
                payload: &payload,
                attempts: if kind == ErrorKind::Poison {
                    1
                } else {
                    self.max_receive_count
                },
                kind,
                last_error: &error,
                correlation_id: ids.correlation_id.as_deref(),
                replay_of: msg.replay_of,
            };
            match record_dead_letter_in(&self.pool, &letter, self.clock.now()).await {
                Ok(recorded) => {
                    self.metrics.increment(Metric::DeadLettered(letter.kind));
                    tracing::warn!(message_id = %msg.message_id, letter = %recorded.id(), kind = %letter.kind, "backstop dead letter");
                }
                Err(e) => {
                    self.metrics.increment(Metric::DeadLetterWriteFailed);
                    tracing::error!(message_id = %msg.message_id, error = %e, "backstop letter not written; left in the DLQ");
                    failed.push(msg.message_id);
                }
            }
        }
        if let Some(alerter) = &self.alerter {
            alerter
                .deliver_pending(crate::harness::ALERTS_PER_ROUND)
                .await;
        }
        batch_response(failed)
    }
}
