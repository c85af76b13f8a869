//! What goes into the harness and what comes out: one delivery, and the outcome the transport
//! turns into an ack or a delayed redelivery.

use crate::dead_letter::{ErrorKind, Recorded};
use crate::ids::DeadLetterId;
use crate::metrics::Metric;
use crate::telemetry::otel::MessageTrace;
use std::time::Duration;

/// One delivery of a queue message, independent of the transport.
#[derive(Debug, Clone)]
pub struct IncomingMessage {
    /// The transport's message id (SQS `messageId`); stable across redeliveries.
    pub message_id: String,
    /// The queue it came from (SQS queue name).
    pub queue: String,
    /// The raw body: the envelope as JSON, if well-formed.
    pub body: String,
    /// Which delivery this is, from 1 (SQS `ApproximateReceiveCount`). Only a hint: 1 means no
    /// earlier delivery can have run the job; attempts are counted in the execution ledger.
    pub receive_count: u32,
    /// The dead letter whose replay produced this message, if any.
    pub replay_of: Option<DeadLetterId>,
    /// The message's group on a FIFO queue (SQS `MessageGroupId`); `None` on a standard queue.
    /// A batch with groups keeps their order ([`crate::harness`]'s FIFO path).
    pub message_group: Option<String>,
    /// The trace contexts it carried, which its job's span links to and its letter keeps.
    pub trace: MessageTrace,
}

impl IncomingMessage {
    /// What its job's span says of it.
    pub fn delivery(&self) -> crate::telemetry::otel::Delivery<'_> {
        crate::telemetry::otel::Delivery {
            queue: &self.queue,
            message_id: &self.message_id,
            trace: &self.trace,
        }
    }
}

/// What became of one message; the transport turns it into an ack or a delayed redelivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The work and its fence committed.
    Processed,
    /// The job was already processed by this consumer; skipped.
    Duplicate,
    /// A concurrent copy holds the fence; redeliver after `retry_after` to find out how it ended.
    Contended {
        /// Short delay before redelivery.
        retry_after: Duration,
    },
    /// A transient failure; redeliver after the backoff delay.
    Retry {
        /// The attempt that failed.
        attempt: u32,
        /// The backoff delay.
        after: Duration,
        /// What went wrong.
        error: String,
    },
    /// A dead letter is committed (or already was, for a redelivered message).
    DeadLettered {
        /// Why.
        kind: ErrorKind,
        /// The letter.
        letter: Recorded,
        /// What went wrong.
        error: String,
    },
    /// Nothing ran and no execution was charged (the database was unavailable, or a settle of
    /// the fence could not finish): redeliver after `retry_after`.
    HandedBack {
        /// Delay before redelivery.
        retry_after: Duration,
        /// Why.
        error: String,
    },
    /// Not run: an earlier message of its FIFO group in the same batch was not done (it failed,
    /// was handed back or not started), and SQS requires the rest of the group back unprocessed,
    /// uncharged. Made visible again at once: the earlier message, still hidden, holds the
    /// group back until it returns, and then the group comes back in order behind it.
    HeldBack,
    /// The dead letter could not be written: do not ack; the message comes back after
    /// `retry_after` and, past the attempt budget, is dead-lettered as `crashed`.
    DeadLetterFailed {
        /// Delay before redelivery.
        retry_after: Duration,
        /// The write's error.
        error: String,
    },
}

impl RecordOutcome {
    /// Whether the message may be deleted from the queue.
    pub fn is_ack(&self) -> bool {
        matches!(
            self,
            Self::Processed | Self::Duplicate | Self::DeadLettered { .. }
        )
    }

    /// The kind of the dead letter this outcome committed (or found), if it is one.
    pub fn dead_letter_kind(&self) -> Option<ErrorKind> {
        match self {
            Self::DeadLettered { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// For an outcome that is not an ack: how long to hide the message before redelivery.
    pub fn redeliver_after(&self) -> Option<Duration> {
        match self {
            Self::Contended { retry_after }
            | Self::HandedBack { retry_after, .. }
            | Self::DeadLetterFailed { retry_after, .. } => Some(*retry_after),
            Self::Retry { after, .. } => Some(*after),
            Self::HeldBack => Some(Duration::ZERO),
            Self::Processed | Self::Duplicate | Self::DeadLettered { .. } => None,
        }
    }

    /// The outcome of another record of the same job in the same SQS batch, once this one
    /// has run: a job that committed, or has its letter, makes the copy a duplicate (acked);
    /// anything else hands the copy back with the same delay, uncharged.
    pub(super) fn of_a_copy(&self) -> Self {
        match self.redeliver_after() {
            None => Self::Duplicate,
            Some(retry_after) => Self::HandedBack {
                retry_after,
                error: "another record of the same job in this batch ran it".into(),
            },
        }
    }

    /// Its name, as a job's span and its lines give it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Duplicate => "duplicate",
            Self::Contended { .. } => "contended",
            Self::Retry { .. } => "retry",
            Self::DeadLettered { .. } => "dead_lettered",
            Self::DeadLetterFailed { .. } => "dead_letter_failed",
            Self::HandedBack { .. } => "handed_back",
            Self::HeldBack => "held_back",
        }
    }

    /// Whether the job failed for good here: its span's status is an error.
    pub fn failed(&self) -> bool {
        matches!(
            self,
            Self::DeadLettered { .. } | Self::DeadLetterFailed { .. }
        )
    }

    pub(super) fn metric(&self) -> Metric {
        match self {
            Self::Processed => Metric::Processed,
            Self::Duplicate => Metric::DuplicateSkipped,
            Self::Contended { .. } => Metric::FenceContended,
            Self::Retry { .. } => Metric::Retried,
            Self::DeadLettered { kind, .. } => Metric::DeadLettered(*kind),
            Self::DeadLetterFailed { .. } => Metric::DeadLetterWriteFailed,
            Self::HandedBack { .. } | Self::HeldBack => Metric::HandedBack,
        }
    }
}
