//! The DLQ ingester (the backstop): messages the harness never saw finish (timeouts, out-of-memory, crash loops)
//! are moved by the queue's redrive policy to an SQS DLQ, and become dead letters here.
//!
//! Invariants: a letter is a true record. A redriven job whose effect committed (its batch kept
//! failing after it) gets no letter, only the `RedrivenAlreadyProcessed` metric, settled
//! through the fence ([`record_unless_processed`]). A body that is no envelope is `poison`; any
//! other redriven job is `crashed`, or `exhausted` when its executions ran out on a recorded
//! failure. One letter per message (its id survives the redrive), so a DLQ message delivered
//! twice, or one the harness had already dead-lettered, yields one row. A record is reported
//! as failed (left in the DLQ) unless its outcome is committed.

use crate::clock::Clock;
use crate::dead_letter::{
    ErrorKind, NewDeadLetter, Recorded, Settled, conflict_error, receive_and_settle,
    record_unless_processed, record_without_settling,
};
use crate::envelope::{Envelope, JobDigest, PartialIds, Poison};
use crate::fence::{FenceError, fenced_job, settle_horizon};
use crate::harness::IncomingMessage;
use crate::ids::{ConsumerName, JobId};
use crate::ledger::{Ledger, ledgers_of};
use crate::metrics::{Metric, Metrics};
use crate::sqs::{batch_response, incoming, sent_at};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Writes dead letters for the messages of one consumer's DLQ.
pub struct DlqIngester {
    /// The database.
    pub pool: PgPool,
    /// The consumer whose queue redrives into this DLQ.
    pub consumer: ConsumerName,
    /// The job queue the messages came from, where a replay sends them.
    pub job_queue: String,
    /// The job queue's redrive `maxReceiveCount`: how often each message was delivered.
    pub max_receive_count: u32,
    /// The consumer's attempt budget (executions).
    pub max_attempts: u32,
    /// How long settling a job's fence may wait for a copy still inside its transaction.
    pub settle_wait: Duration,
    /// The fences' lifetime: a copy older than [`settle_horizon`] of it (by its own send time)
    /// cannot be settled through its fence.
    pub fence_ttl: Duration,
    /// The payload fields that make up a job, as its consumer names them (`JOB_FIELDS`): the
    /// ingester digests each letter's job with them, as the harness does, so a letter is never
    /// taken for another job under its id (nor another job for it).
    pub job_fields: Vec<String>,
    /// The job queue's retention: how much older than its `SentTimestamp` says a message of a
    /// FIFO DLQ may be (a FIFO DLQ resets the enqueue time when it moves a message in).
    pub queue_retention: Duration,
    /// How long the batch's letters may wait in the letters' intake before a writer settles
    /// them (`LETTER_SETTLE_DUE_MS`, as the consumer's; zero: this batch settles behind its own
    /// rows at once). See [`crate::dead_letter::SETTLE_DUE`].
    pub settle_due: Duration,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// `DeadLettered*`, `RedrivenAlreadyProcessed` and `DeadLetterWriteFailed` counts.
    pub metrics: Metrics,
    /// Pages BetterStack after the batch's letters are committed, if configured.
    pub alerter: Option<crate::paging::Alerter>,
}

impl DlqIngester {
    /// Records a letter for each record whose job did not commit; returns the records whose
    /// outcome could not be committed. Each record is read and judged in its own span; the
    /// letters that settle through their fence then go together through the letters' intake
    /// (one statement received, settled behind it in bulk), as a consumer's poison does; a
    /// letter too old for its fence, or a batch whose intake failed, is written alone.
    pub async fn ingest(&self, records: Vec<SqsMessage>) -> SqsBatchResponse {
        let msgs: Vec<IncomingMessage> = records.iter().map(incoming).collect();
        let now = self.clock.now();
        let fields: Vec<&str> = self.job_fields.iter().map(String::as_str).collect();
        let parsed: Vec<(tracing::Span, Parsed)> = (msgs.iter().zip(&records))
            .map(|(msg, record)| {
                // Its lines carry the ids its body has, as the consumer's do (filled once parsed).
                let span = crate::telemetry::record_span(
                    self.consumer.as_str(),
                    &msg.message_id,
                    &Default::default(),
                );
                crate::telemetry::otel::describe_job(&span, msg.delivery());
                let parsed = span.in_scope(|| self.parse(msg, &fields, sent_at(record), now));
                (span, parsed)
            })
            .collect();
        // Every redriven job's ledger in one read: what judges it exhausted or crashed.
        let jobs: Vec<JobId> = (parsed.iter())
            .filter_map(|(_, p)| p.envelope.as_ref().ok().map(|e| e.job_id))
            .collect();
        let ledgers = match jobs.is_empty() {
            true => Ok(HashMap::new()),
            false => ledgers_of(&self.pool, &self.consumer, &jobs).await,
        };
        let judged: Vec<(tracing::Span, Result<Read, String>)> = (parsed.into_iter())
            .map(|(span, parsed)| {
                let read = match (&ledgers, parsed.envelope.as_ref().map(|e| e.job_id)) {
                    (Err(e), Ok(_)) => Err(format!("reading the job's ledger: {e}")),
                    (Ok(ledgers), Ok(job)) => Ok(self.judge(parsed, ledgers.get(&job))),
                    (_, Err(_)) => Ok(self.judge(parsed, None)),
                };
                (span, read)
            })
            .collect();
        let together: Vec<usize> = (judged.iter().enumerate())
            .filter(|(_, (_, j))| matches!(j, Ok(r) if r.judged.kind != ErrorKind::Unsettled))
            .map(|(i, _)| i)
            .collect();
        let mut written: Vec<Option<Settled>> = vec![None; msgs.len()];
        let mut new_letters = 0;
        if together.len() > 1 {
            let letters: Vec<(NewDeadLetter<'_>, Option<&JobDigest>)> = (together.iter())
                .filter_map(|&i| match &judged[i].1 {
                    Ok(read) => Some((read.letter(self, &msgs[i], &fields), read.digest.as_ref())),
                    Err(_) => None,
                })
                .collect();
            // Settled behind their receipt at once, or with a due when the letters' newest is.
            let (wait, due) = (self.settle_wait, self.settle_due);
            match receive_and_settle(&self.pool, &letters, now, wait, due).await {
                Ok(received) => {
                    new_letters = received.new_letters;
                    for (&i, settled) in together.iter().zip(received.settled) {
                        written[i] = Some(settled);
                    }
                }
                Err(e) => tracing::warn!(error = %e, records = letters.len(),
                    "the batch's letters could not be received together; each goes alone"),
            }
        }
        let mut failed = Vec::new();
        for (i, (span, read)) in judged.into_iter().enumerate() {
            let msg = &msgs[i];
            let ingested = match (read, written[i].take()) {
                (Err(e), _) => Err(e),
                (Ok(read), Some(settled)) => Ok((settled, read.judged.kind)),
                (Ok(read), None) => {
                    let letter = read.letter(self, msg, &fields);
                    let write = self.write(&letter, read.digest.as_ref(), now);
                    let settled = write.instrument(span.clone()).await;
                    if matches!(settled, Ok(Settled::Recorded(Recorded::New(_)))) {
                        new_letters += 1;
                    }
                    (settled.map(|s| (s, read.judged.kind))).map_err(|e| e.to_string())
                }
            };
            // A backstop record ends recorded (its letter, or none needed) or left in the DLQ.
            let (outcome, left_in_the_dlq) = match &ingested {
                Ok(_) => ("ingested", false),
                Err(_) => ("dead_letter_failed", true),
            };
            crate::telemetry::otel::conclude_job(&span, outcome, left_in_the_dlq);
            let _in_its_span = span.entered();
            match ingested {
                Ok((settled, kind)) => self.count(settled, kind),
                Err(e) => {
                    self.metrics.increment(Metric::DeadLetterWriteFailed);
                    tracing::error!(error = %e, "backstop letter not written; left in the DLQ");
                    failed.push(msg.message_id.clone());
                }
            }
        }
        self.page(new_letters).await;
        batch_response(failed)
    }

    /// Paging rounds for the batch's new letters: at least one, then as many as their groups
    /// need.
    async fn page(&self, new_letters: usize) {
        if let Some(alerter) = &self.alerter {
            let (rounds_for, per_round) = (new_letters.max(1), crate::harness::ALERTS_PER_ROUND);
            alerter
                .page_new_letters(rounds_for, per_round, &self.metrics)
                .await;
        }
    }

    /// One DLQ message read with the job's `fields`: its envelope (or why it is poison), its
    /// job's digest, and how long ago it was first sent.
    fn parse(
        &self,
        msg: &IncomingMessage,
        fields: &[&str],
        sent_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Parsed {
        let parsed = Envelope::<serde_json::Value>::parse_job(&msg.body, fields);
        let digest = match &parsed {
            Ok((_, digest)) => Some(*digest),
            Err(poison) => poison.digest.as_deref().copied(),
        };
        let envelope = parsed.map(|(envelope, _)| envelope);
        let carried = match &envelope {
            Ok(envelope) => envelope.ids(),
            Err(poison) => poison.ids.clone(),
        };
        crate::telemetry::record_ids(&tracing::Span::current(), &carried);
        Parsed {
            envelope,
            digest,
            age: self.age(msg, sent_at, now),
        }
    }

    /// How long ago the message was first sent. A FIFO message's time in its job queue before
    /// the move may not be in its send time: counted as the longest it can have been.
    fn age(
        &self,
        msg: &IncomingMessage,
        sent_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<Duration> {
        let before_the_move = match msg.message_group {
            Some(_) => self.queue_retention,
            None => Duration::ZERO,
        };
        sent_at.and_then(|sent| (now - sent).to_std().ok().map(|a| a + before_the_move))
    }

    /// What the letter says (its ids, kind, attempts and error), by its job's `ledger` (none:
    /// no execution charged, or poison, which has no job to read one for).
    fn judge(&self, parsed: Parsed, ledger: Option<&Ledger>) -> Read {
        let redriven = format!(
            "redriven to the dead-letter queue after {} deliveries",
            self.max_receive_count
        );
        let horizon = settle_horizon(self.fence_ttl);
        let ledger = ledger.cloned().unwrap_or_default();
        let (age, digest) = (parsed.age, parsed.digest);
        let judged = match parsed.envelope {
            // Poison is never attempted: its letter says 1, however often crashes of its
            // batch redelivered it.
            Err(poison) => Judged {
                error: format!("{}; {redriven}", poison.reason),
                ids: poison.ids,
                kind: ErrorKind::Poison,
                attempts: 1,
            },
            // Too old for its fence to be known still there: a committed job's fence may be
            // swept, so the claim would find none and call it never committed.
            Ok(envelope) if age.is_some_and(|a| a > horizon) => Judged {
                ids: envelope.ids(),
                kind: ErrorKind::Unsettled,
                attempts: ledger.executions.max(1),
                error: unsettled(&redriven, age.unwrap_or_default(), horizon),
            },
            Ok(envelope) => {
                let (kind, error) = ledger.verdict(self.max_attempts, &redriven);
                Judged {
                    ids: envelope.ids(),
                    kind,
                    attempts: ledger.executions,
                    error,
                }
            }
        };
        Read { judged, digest }
    }

    /// Writes the letter through the job's fence: none if the job committed.
    async fn write(
        &self,
        letter: &NewDeadLetter<'_>,
        digest: Option<&JobDigest>,
        now: DateTime<Utc>,
    ) -> Result<Settled, FenceError> {
        if letter.kind != ErrorKind::Unsettled {
            // With the job's digest, as the harness takes it: another job committed under the
            // id makes this a conflict, never a letter closed by that job's commit.
            let wait = self.settle_wait;
            return record_unless_processed(&self.pool, letter, digest, now, wait).await;
        }
        // A fence still there says the job committed, or, with another digest, that another
        // job did under its id (this one did not run: its `conflict` letter); its absence says
        // nothing any more.
        let job = letter.job_id.expect("an envelope has a job id");
        match fenced_job(&self.pool, job, &self.consumer, digest).await? {
            Some(true) => Ok(Settled::AlreadyProcessed),
            Some(false) => {
                let error = conflict_error(letter.last_error);
                let conflict = NewDeadLetter {
                    kind: ErrorKind::Conflict,
                    last_error: &error,
                    ..letter.clone()
                };
                let recorded = record_without_settling(&self.pool, &conflict, digest, now);
                Ok(Settled::Conflict(recorded.await?))
            }
            None => {
                let recorded = record_without_settling(&self.pool, letter, digest, now);
                Ok(Settled::Recorded(recorded.await?))
            }
        }
    }

    fn count(&self, settled: Settled, kind: ErrorKind) {
        match settled {
            Settled::AlreadyProcessed => {
                self.metrics.increment(Metric::RedrivenAlreadyProcessed);
                tracing::info!("redriven message of a job that committed: no letter");
            }
            Settled::Recorded(recorded) => {
                self.metrics.increment(Metric::DeadLettered(kind));
                tracing::warn!(letter = %recorded, %kind, "backstop dead letter");
            }
            Settled::Conflict(recorded) => {
                let kind = ErrorKind::Conflict;
                self.metrics.increment(Metric::DeadLettered(kind));
                tracing::warn!(letter = %recorded, %kind, "backstop dead letter of another job under a committed id");
            }
        }
    }
}

/// Why a copy too old for its fence is not replayable.
fn unsettled(redriven: &str, age: Duration, horizon: Duration) -> String {
    format!(
        "{redriven}, {} s after it was sent, past the {} s within which its fence settles \
         whether the job committed (FENCE_TTL_SECONDS less a day): not replayable; check the \
         effect by hand, then discard this letter",
        age.as_secs(),
        horizon.as_secs()
    )
}

/// A DLQ message as parsed, before its job's ledger is read.
struct Parsed {
    envelope: Result<Envelope<serde_json::Value>, Poison>,
    digest: Option<JobDigest>,
    age: Option<Duration>,
}

/// A DLQ message as read: its judgement and its job's digest.
struct Read {
    judged: Judged,
    digest: Option<JobDigest>,
}

impl Read {
    /// The letter it is written as.
    fn letter<'a>(
        &'a self,
        ingester: &'a DlqIngester,
        msg: &'a IncomingMessage,
        fields: &'a [&'a str],
    ) -> NewDeadLetter<'a> {
        let judged = &self.judged;
        NewDeadLetter {
            job_id: judged.ids.job_id,
            tenant_id: judged.ids.tenant_id,
            consumer: &ingester.consumer,
            queue: &ingester.job_queue,
            message_id: &msg.message_id,
            body: &msg.body,
            attempts: judged.attempts,
            kind: judged.kind,
            last_error: &judged.error,
            correlation_id: judged.ids.correlation_id.as_deref(),
            replay_of: msg.replay_of,
            message_group: msg.message_group.as_deref(),
            digest_fields: fields,
            trace: msg.trace.original(),
            nul_replaced: false,
        }
    }
}

/// What a DLQ message's letter says.
struct Judged {
    ids: PartialIds,
    kind: ErrorKind,
    attempts: u32,
    error: String,
}
