//! The system under test for one history: the real harness (one "process" at a time, killed
//! and started again on a crash) on a real database, a queue emulated as SQS behaves (standard:
//! any message any time; FIFO: each group in order, re-received whole), its redrive to a DLQ
//! and the real ingester behind it, and an operator using the library calls the API makes.
//!
//! Invariant: the emulation decides nothing the harness decides. A message leaves the queue
//! only when the harness acks it (or SQS redrives it past `maxReceiveCount`); every receive
//! raises its receive count; what the operator does goes through `shared::dead_letter`'s
//! lock-check-mark-commit as `functions/dead-letter-api` does.

#[path = "bulk.rs"]
mod bulk;

use super::Config;
use super::bodies::{Family, Ids, Payload, Spelling, envelope, payload, spelled_payload};
use super::probe::{Probe, ProbeState};
use aws_lambda_events::event::sqs::SqsMessage;
use chrono::{DateTime, Utc};
use serde_json::json;
use shared::clock::{Clock, ManualClock};
use shared::config::least_receive_count;
use shared::dead_letter::{
    ErrorKind, ReplayOutcome, ReviewStatus, Verdict, Withdrawal, lock_letter, record_replay_sent,
    withdraw_replay,
};
use shared::dlq_ingester::DlqIngester;
use shared::harness::{CommitMode, Harness, HarnessSettings, IncomingMessage, RecordOutcome};
use shared::ids::{DeadLetterId, JobId, TenantId};
use shared::retry::RetryPolicy;
use shared_testkit::reference::reference_name;
use shared_testkit::{CONCURRENCY, FENCE_TTL, SWEEP, harness_on, run_batch_at, settings, t0};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The attempt budget of the model's consumer: small, so histories reach it.
pub const MAX_ATTEMPTS: u32 = 3;
/// The most records the queue hands over in one FIFO batch (the event source's `BatchSize`):
/// small, so a FIFO redrive (`BatchSize` x (attempts + 2) receives) is within a history's reach.
pub const FIFO_BATCH: usize = 4;
/// The most records in one standard batch (a `Deliver`'s picks).
pub const STANDARD_BATCH: usize = 4;

/// The queue's redrive `maxReceiveCount`, as the functions require it
/// (`shared::config::least_receive_count`): attempts + 2 on a standard queue; on a FIFO queue
/// `BatchSize` x (attempts + 2), since every receive of a group's head also receives (and
/// counts on) the records behind it in the batch.
pub fn max_receive(fifo: bool) -> u32 {
    let batch = if fifo { FIFO_BATCH } else { STANDARD_BATCH };
    least_receive_count(fifo, u32::try_from(batch).unwrap_or(1), MAX_ATTEMPTS)
}

/// The message attribute a replay carries (`shared::dead_letter::REPLAY_OF_ATTRIBUTE`, which
/// the crate keeps to itself).
const REPLAY_OF_ATTRIBUTE: &str = "replay_of";
/// Who the model's operator is (`reviewed_by`).
pub const OPERATOR: &str = "model-operator";

/// One message the queue has held.
#[derive(Debug, Clone)]
pub struct Msg {
    /// Send order (a FIFO group's order).
    pub seq: usize,
    /// SQS message id.
    pub id: String,
    /// The body.
    pub body: String,
    /// Its job, if it is one (not for a body that is no job: not JSON, `job_id` twice).
    pub family: Option<Family>,
    /// Its job, written so that the consumer's payload type refuses it (a number spelling the
    /// digest reads as the job's value): poison as written, the same job by its digest.
    pub unreadable: bool,
    /// An operator's edit (its body is valid).
    pub edited: bool,
    /// The slot of the job id it names, if any.
    pub slot: Option<u8>,
    /// Its FIFO group.
    pub group: Option<String>,
    /// Receives so far.
    pub receives: u32,
    /// The letter whose replay it is.
    pub replay_of: Option<DeadLetterId>,
    /// Deleted from the queue (acked, or redriven to the DLQ).
    pub gone: bool,
    /// Deleted because the harness acked it (a lost delete can bring it back).
    pub acked: bool,
    /// Sent before the TTL sweep.
    pub pre_sweep: bool,
    /// When it was sent (its `SentTimestamp`).
    pub sent_at: DateTime<Utc>,
    /// How the log names it.
    pub name: String,
}

/// A letter as the checker reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LetterRow {
    pub id: Uuid,
    pub job_id: Option<Uuid>,
    pub message_id: String,
    pub status: String,
    pub error_kind: String,
    pub attempts: i32,
    pub reviewed_by: Option<String>,
    pub replay_outcome: Option<String>,
}

/// A replay recorded `queued` whose send SQS refused: the scheduled run sends it later (or a
/// send in flight as the operator withdrew it lands after all).
#[derive(Debug, Clone)]
pub struct Unsent {
    /// The letter replayed.
    pub letter: DeadLetterId,
    /// The message the send carries.
    pub body: String,
    pub family: Option<Family>,
    pub slot: Option<u8>,
    pub group: Option<String>,
    /// How the log names the message once sent.
    pub label: String,
    /// The operator withdrew it (a send of it may still land: one in flight at the time).
    pub withdrawn: bool,
    /// The message the letter was written from (its family), for the checker.
    pub of: Option<usize>,
    /// Its body is an operator's edit.
    pub edited: bool,
    /// Its body is the letter's, in a spelling the payload type refuses.
    pub unreadable: bool,
}

/// One history's world.
pub struct World {
    pub cfg: Config,
    pub pool: PgPool,
    connect: PgConnectOptions,
    pub clock: Arc<ManualClock>,
    pub probe: Arc<ProbeState>,
    harness: Arc<Harness<Probe>>,
    harness_pool: PgPool,
    pub jobs: Vec<(JobId, TenantId)>,
    case: String,
    pub msgs: Vec<Msg>,
    pub log: Vec<String>,
    edits: BTreeMap<Family, u32>,
    swept: bool,
    /// Runs of each job id the ledger never charges: a crash on a first delivery.
    pub uncharged: BTreeMap<JobId, u32>,
    /// Per step: the outcomes of its deliveries (message index, outcome, which batch of the
    /// history), for the checker.
    pub delivered: Vec<(usize, RecordOutcome, u32)>,
    /// Batches handed over so far.
    batches: u32,
    /// Per step: messages redriven to the DLQ and ingested.
    pub redriven: Vec<usize>,
    /// Per step: a replay the operator was refused as "another job committed under the id",
    /// with the letter's message index.
    pub refused_as_another_job: Vec<usize>,
    /// The step swept fences (the ledger's rows may go with them).
    pub swept_now: bool,
    /// Replays recorded `queued` whose send has not reached the queue.
    pub unsent: Vec<Unsent>,
    /// Per step: the withdrawals (the letter's message index, whether the model had its replay
    /// queued, what `withdraw_replay` answered).
    pub withdrawals: Vec<(Option<usize>, bool, Withdrawal)>,
    /// Sends so far (each one's `note`, when the producer adds one).
    sends: u32,
}

fn queue_name(fifo: bool) -> &'static str {
    if fifo {
        "model-jobs.fifo"
    } else {
        "model-jobs"
    }
}

fn harness_settings(mode: CommitMode, due: Duration) -> HarnessSettings {
    HarnessSettings {
        settle_due: due,
        policy: RetryPolicy::new(
            MAX_ATTEMPTS,
            Duration::from_secs(30),
            Duration::from_secs(3600),
        )
        .expect("the model's retry policy"),
        commit: mode,
        ..settings()
    }
}

/// The settle due of the history's consumer and ingester: as deployed, or none.
fn settle_due(cfg: &Config) -> Duration {
    match cfg.settle_due {
        true => shared::dead_letter::SETTLE_DUE,
        false => Duration::ZERO,
    }
}

/// `batch` through `harness` as one SQS batch, as many records at once as the process's pool
/// has connections (as `shared::run` deploys it): one for a pool of one.
async fn run_batch(
    harness: &Harness<Probe>,
    batch: &[IncomingMessage],
    pool_of_one: bool,
) -> Vec<RecordOutcome> {
    run_batch_at(harness, batch, if pool_of_one { 1 } else { CONCURRENCY }).await
}

/// A process's pool: one connection, or eight.
async fn process_pool(connect: &PgConnectOptions, pool_of_one: bool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(if pool_of_one { 1 } else { 8 })
        .connect_with(connect.clone())
        .await
        .expect("a process's pool")
}

impl World {
    /// A world for `cfg` on the database `connect` names (observed through `pool`).
    pub async fn new(pool: PgPool, connect: PgConnectOptions, cfg: Config) -> Self {
        let case = Uuid::new_v4().simple().to_string()[..8].to_owned();
        let clock = Arc::new(ManualClock::new(t0()));
        let probe = Arc::new(ProbeState::default());
        let harness_pool = process_pool(&connect, cfg.pool_of_one).await;
        let harness = Arc::new(harness_on(
            &harness_pool,
            Probe::new(reference_name(), cfg.noted, probe.clone()),
            harness_settings(cfg.mode, settle_due(&cfg)),
            clock.clone(),
        ));
        let jobs = (0..cfg.slots.len())
            .map(|_| (JobId(Uuid::new_v4()), TenantId(Uuid::new_v4())))
            .collect();
        let world = Self {
            cfg,
            pool,
            connect,
            clock,
            probe,
            harness,
            harness_pool,
            jobs,
            case,
            msgs: Vec::new(),
            log: Vec::new(),
            edits: BTreeMap::new(),
            swept: false,
            uncharged: BTreeMap::new(),
            delivered: Vec::new(),
            batches: 0,
            redriven: Vec::new(),
            refused_as_another_job: Vec::new(),
            swept_now: false,
            unsent: Vec::new(),
            withdrawals: Vec::new(),
            sends: 0,
        };
        sqlx::query("INSERT INTO public.model_refused (account) VALUES ($1)")
            .bind(world.flaky_account())
            .execute(&world.pool)
            .await
            .expect("refusing the flaky account");
        world
    }

    /// Closes the process's pool.
    pub async fn close(self) {
        self.harness_pool.close().await;
    }

    fn flaky_account(&self) -> String {
        format!("model-{}-flaky", self.case)
    }

    fn account(&self, slot: u8, kind: Payload) -> String {
        match kind {
            Payload::Flaky => self.flaky_account(),
            _ => format!("model-{}-s{slot}", self.case),
        }
    }

    fn group_of(&self, slot: Option<u8>) -> Option<String> {
        self.cfg
            .fifo
            .then(|| format!("g{}", slot.map_or(9, |s| s % 2)))
    }

    fn push(
        &mut self,
        body: String,
        family: Option<Family>,
        slot: Option<u8>,
        what: String,
    ) -> usize {
        let seq = self.msgs.len();
        let group = self.group_of(slot);
        self.msgs.push(Msg {
            seq,
            id: Uuid::new_v4().to_string(),
            body,
            family,
            unreadable: false,
            edited: false,
            slot,
            group,
            receives: 0,
            replay_of: None,
            gone: false,
            acked: false,
            pre_sweep: false,
            sent_at: self.clock.now(),
            name: format!("m{seq}({what})"),
        });
        seq
    }

    /// A producer sends job (`slot`, `variant`) written in `spelling`.
    pub fn send(&mut self, slot: u8, variant: u8, spelling: Spelling) {
        if self.swept
            && self
                .msgs
                .iter()
                .any(|m| m.slot == Some(slot) && m.pre_sweep)
        {
            self.log.push(format!(
                "send job{slot}: skipped, its id was sent before the sweep"
            ));
            return;
        }
        let family = Family { slot, variant };
        let kind = self.cfg.slots[usize::from(slot)][usize::from(variant)];
        let (job_id, tenant_id) = self.jobs[usize::from(slot)];
        let (job, tenant) = (job_id.to_string(), tenant_id.to_string());
        let ids = Ids {
            job_id: &job,
            tenant_id: &tenant,
            correlation_id: &format!("corr-{slot}"),
        };
        let reordered = spelling == Spelling::Reordered;
        self.sends += 1;
        let note = self.cfg.noted.then(|| format!("send {}", self.sends));
        let payload = spelled_payload(
            kind,
            &self.account(slot, kind),
            family.points(),
            reordered,
            spelling,
            note.as_deref(),
        );
        let other = Uuid::new_v4().to_string();
        let body = envelope(&ids, &payload, spelling, &other);
        let job_family = (spelling != Spelling::JobIdTwice).then_some(family);
        let i = self.push(
            body,
            job_family,
            Some(slot),
            format!("{family:?} {kind:?} {spelling:?}"),
        );
        self.msgs[i].unreadable = spelling.unreadable();
        self.log.push(format!("send {}", self.msgs[i].name));
    }

    /// A copy of job (`slot`, `variant`) sent longer ago than its fence is trusted to live
    /// (the TTL and a day) reaches the DLQ ingester: only once no other copy of its id is
    /// queued or may still be sent (a replay not yet sent), and never for an id sent before a
    /// sweep (the model's premise: the fence outlives every copy the queues keep, and this one
    /// stands for a DLQ kept longer than the functions were told).
    pub async fn redrive_old(&mut self, slot: u8, variant: u8) {
        let pre_sweep = self
            .msgs
            .iter()
            .any(|m| m.slot == Some(slot) && m.pre_sweep);
        let queued = (self.queued().into_iter()).any(|i| self.msgs[i].slot == Some(slot));
        let unsent = self.unsent.iter().any(|u| u.slot == Some(slot));
        if queued || unsent || (self.swept && pre_sweep) {
            self.log.push(format!(
                "old copy of job{slot}: skipped, a copy may still arrive or the id was swept"
            ));
            return;
        }
        self.send(slot, variant, Spelling::Exact);
        let i = self.msgs.len() - 1;
        let old = FENCE_TTL + Duration::from_secs(86_400);
        self.msgs[i].sent_at = self.clock.now() - chrono::Duration::from_std(old).unwrap();
        self.msgs[i].receives = max_receive(self.cfg.fifo);
        self.redrive(&[i]).await;
    }

    /// A producer sends a body that is not JSON.
    pub fn send_garbage(&mut self) {
        let body = format!("not json {}", Uuid::new_v4());
        let i = self.push(body, None, None, "not-JSON".into());
        self.log.push(format!("send {}", self.msgs[i].name));
    }

    /// Whether message `i`'s body can never run as written: no job, a poison payload, or a
    /// spelling the payload type refuses. (An edit's body is always valid.)
    pub fn cannot_run(&self, i: usize) -> bool {
        let m = &self.msgs[i];
        let Some(f) = m.family else { return true };
        m.unreadable
            || (!m.edited
                && matches!(
                    self.cfg.slots[usize::from(f.slot)][usize::from(f.variant)],
                    Payload::BadPoints | Payload::WrongShape
                ))
    }

    /// The messages in the queue, in send order.
    fn queued(&self) -> Vec<usize> {
        (0..self.msgs.len())
            .filter(|&i| !self.msgs[i].gone)
            .collect()
    }

    /// A batch as the queue hands it over for `picks`: on a standard queue any messages; on a
    /// FIFO queue, each pick takes the next message of a group, so a group comes in order
    /// from its head.
    fn choose(&self, picks: &[u8]) -> Vec<usize> {
        let queued = self.queued();
        if queued.is_empty() {
            return Vec::new();
        }
        let mut batch: Vec<usize> = Vec::new();
        if self.cfg.fifo {
            let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &i in &queued {
                let g = self.msgs[i]
                    .group
                    .clone()
                    .expect("a FIFO message has its group");
                groups.entry(g).or_default().push(i);
            }
            let names: Vec<String> = groups.keys().cloned().collect();
            let mut taken: BTreeMap<String, usize> = BTreeMap::new();
            for &p in picks {
                if batch.len() == FIFO_BATCH {
                    break;
                }
                let g = &names[usize::from(p) % names.len()];
                let n = taken.entry(g.clone()).or_default();
                if let Some(&i) = groups[g].get(*n) {
                    batch.push(i);
                    *n += 1;
                }
            }
        } else {
            for &p in picks {
                let i = queued[usize::from(p) % queued.len()];
                if !batch.contains(&i) {
                    batch.push(i);
                }
            }
        }
        batch
    }

    fn incoming(&self, i: usize) -> IncomingMessage {
        let m = &self.msgs[i];
        IncomingMessage {
            message_id: m.id.clone(),
            queue: queue_name(self.cfg.fifo).into(),
            body: m.body.clone(),
            receive_count: m.receives,
            replay_of: m.replay_of,
            message_group: m.group.clone(),
            trace: Default::default(),
        }
    }

    /// The queue hands the harness a batch (`picks`); a message past `maxReceiveCount` is
    /// redriven to the DLQ instead, where the ingester takes it.
    pub async fn deliver(&mut self, picks: &[u8]) {
        let chosen = self.choose(picks);
        if chosen.is_empty() {
            self.log.push("deliver: the queue is empty".into());
            return;
        }
        let (redrive, batch): (Vec<usize>, Vec<usize>) = chosen
            .into_iter()
            .partition(|&i| self.msgs[i].receives >= max_receive(self.cfg.fifo));
        if !redrive.is_empty() {
            self.redrive(&redrive).await;
        }
        if batch.is_empty() {
            return;
        }
        for &i in &batch {
            self.msgs[i].receives += 1;
        }
        let records: Vec<IncomingMessage> = batch.iter().map(|&i| self.incoming(i)).collect();
        let outcomes = run_batch(&self.harness, &records, self.cfg.pool_of_one).await;
        self.settle(&batch, outcomes, "deliver");
    }

    /// [`deliver`](Self::deliver) while another settler of the consumer is at work: its
    /// settle lock held by a transaction of the world's, released after the batch.
    pub async fn deliver_while_settling(&mut self, picks: &[u8]) {
        // A connection of its own: the pool's are the harness's.
        let options = (*self.pool.connect_options()).clone();
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&options)
            .await
            .expect("a settler's connection");
        let mut settler = sqlx::Connection::begin(&mut conn)
            .await
            .expect("a settler's transaction");
        shared::dead_letter::take_settle_lock(&mut settler, &reference_name())
            .await
            .expect("the settle lock");
        self.log.push("a settler is at work".into());
        self.deliver(picks).await;
        settler.rollback().await.expect("the settler lets go");
        let _ = sqlx::Connection::close(conn).await;
    }

    /// The scheduled run's first step: the letters' intake settled.
    pub async fn settle_intake(&mut self) {
        let settling = shared::dead_letter::settle_behind(
            &self.pool,
            &reference_name(),
            self.clock.now(),
            Duration::from_secs(5),
            usize::MAX,
        )
        .await
        .expect("settling the intake");
        self.log.push(format!(
            "settle: {} rows, {} new letters",
            settling.settled.len(),
            settling.new_letters
        ));
    }

    /// The message ids of the records received in the letters' intake and not yet settled.
    pub async fn received(&self) -> BTreeSet<String> {
        let message_ids: Vec<String> = self.msgs.iter().map(|m| m.id.clone()).collect();
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT message_id FROM core.letter_intake WHERE consumer = $1 AND message_id = ANY($2)",
        )
        .bind(reference_name().as_str())
        .bind(&message_ids)
        .fetch_all(&self.pool)
        .await
        .expect("reading the intake");
        rows.into_iter().collect()
    }

    /// Whether the queue holds no message.
    pub fn queue_is_empty(&self) -> bool {
        self.queued().is_empty()
    }

    fn settle(&mut self, batch: &[usize], outcomes: Vec<RecordOutcome>, what: &str) {
        self.batches += 1;
        let mut shown = Vec::new();
        for (&i, outcome) in batch.iter().zip(outcomes) {
            let m = &mut self.msgs[i];
            shown.push(format!("{}#{} -> {}", m.name, m.receives, short(&outcome)));
            if outcome.is_ack() {
                m.gone = true;
                m.acked = true;
            }
            self.delivered.push((i, outcome, self.batches));
        }
        self.log.push(format!("{what} [{}]", shown.join(", ")));
    }

    /// SQS moves `redrive` to the DLQ; the ingester writes their letters.
    async fn redrive(&mut self, redrive: &[usize]) {
        let arn = format!(
            "arn:aws:sqs:eu-west-1:123456789012:{}",
            queue_name(self.cfg.fifo).replace(".fifo", "-dlq.fifo")
        );
        let records: Vec<SqsMessage> = redrive
            .iter()
            .map(|&i| {
                let m = &self.msgs[i];
                let mut attributes = json!({
                    "ApproximateReceiveCount": m.receives.to_string(),
                    "SentTimestamp": m.sent_at.timestamp_millis().to_string(),
                });
                if let Some(group) = &m.group {
                    attributes["MessageGroupId"] = json!(group);
                }
                let mut record = json!({
                    "messageId": m.id,
                    "body": m.body,
                    "attributes": attributes,
                    "messageAttributes": {},
                    "eventSourceARN": arn,
                    "eventSource": "aws:sqs",
                });
                if let Some(of) = m.replay_of {
                    record["messageAttributes"][REPLAY_OF_ATTRIBUTE] =
                        json!({"stringValue": of.0.to_string(), "dataType": "String"});
                }
                serde_json::from_value(record).expect("an SQS record")
            })
            .collect();
        let ingester = DlqIngester {
            pool: self.pool.clone(),
            consumer: reference_name(),
            job_queue: queue_name(self.cfg.fifo).into(),
            max_receive_count: max_receive(self.cfg.fifo),
            max_attempts: MAX_ATTEMPTS,
            settle_wait: Duration::from_secs(5),
            fence_ttl: FENCE_TTL,
            queue_retention: std::time::Duration::from_secs(4 * 86_400),
            job_fields: super::probe::job_fields(self.cfg.noted)
                .iter()
                .map(|f| (*f).to_owned())
                .collect(),
            settle_due: settle_due(&self.cfg),
            clock: self.clock.clone(),
            metrics: Default::default(),
            alerter: None,
        };
        let response = ingester.ingest(records).await;
        assert!(
            response.batch_item_failures.is_empty(),
            "the ingester failed: {response:?}"
        );
        let mut names = Vec::new();
        for &i in redrive {
            self.msgs[i].gone = true;
            self.redriven.push(i);
            names.push(format!("{}#{}", self.msgs[i].name, self.msgs[i].receives));
        }
        self.log.push(format!(
            "redrive to the DLQ, ingested [{}]",
            names.join(", ")
        ));
    }

    /// The process running a message (`pick`) dies after the work, before its commit: a
    /// batch of that one message, whose outcome is never recorded.
    pub async fn crash(&mut self, pick: u8) {
        let Some(&i) = self.choose(&[pick]).first() else {
            self.log.push("crash: the queue is empty".into());
            return;
        };
        if self.msgs[i].receives >= max_receive(self.cfg.fifo) {
            return self.redrive(&[i]).await;
        }
        let Some(slot) = self.msgs[i].slot else {
            return self.deliver_one(i, "deliver (no job to crash)").await;
        };
        self.msgs[i].receives += 1;
        let job = self.jobs[usize::from(slot)].0;
        self.probe.crash_next(job);
        let harness = self.harness.clone();
        let record = self.incoming(i);
        let one = self.cfg.pool_of_one;
        let mut task =
            tokio::spawn(
                async move { run_batch(&harness, std::slice::from_ref(&record), one).await },
            );
        tokio::select! {
            finished = &mut task => {
                self.probe.disarm();
                let outcomes = finished.expect("the process's batch");
                self.settle(&[i], outcomes, "crash armed, did not fire: deliver");
            }
            () = self.probe.crashed.notified() => {
                task.abort();
                let _ = task.await;
                let alone = self.probe.crashed_alone.load(std::sync::atomic::Ordering::SeqCst);
                if alone && self.msgs[i].receives == 1 {
                    *self.uncharged.entry(job).or_default() += 1;
                }
                self.restart().await;
                self.log.push(format!(
                    "crash {}#{}: the process died after the work, before COMMIT",
                    self.msgs[i].name, self.msgs[i].receives
                ));
            }
        }
    }

    async fn deliver_one(&mut self, i: usize, what: &str) {
        self.msgs[i].receives += 1;
        let outcomes = run_batch(&self.harness, &[self.incoming(i)], self.cfg.pool_of_one).await;
        self.settle(&[i], outcomes, what);
    }

    /// A new process: a new pool and harness; the dead one's connections close.
    async fn restart(&mut self) {
        let pool = process_pool(&self.connect, self.cfg.pool_of_one).await;
        let harness = Arc::new(harness_on(
            &pool,
            Probe::new(reference_name(), self.cfg.noted, self.probe.clone()),
            harness_settings(self.cfg.mode, settle_due(&self.cfg)),
            self.clock.clone(),
        ));
        self.harness = harness;
        let dead = std::mem::replace(&mut self.harness_pool, pool);
        let _ = tokio::time::timeout(Duration::from_secs(5), dead.close()).await;
    }

    /// A message the harness acked comes back (its delete was lost).
    pub fn lost_delete(&mut self, pick: u8) {
        let acked: Vec<usize> = (0..self.msgs.len())
            .filter(|&i| self.msgs[i].acked && self.msgs[i].gone && !self.msgs[i].pre_sweep)
            .collect();
        if acked.is_empty() {
            self.log.push("lost delete: no acked message".into());
            return;
        }
        let i = acked[usize::from(pick) % acked.len()];
        self.msgs[i].gone = false;
        self.log.push(format!(
            "lost delete: {} is back in the queue",
            self.msgs[i].name
        ));
    }

    /// The flaky account works again.
    pub async fn heal(&mut self) {
        sqlx::query("DELETE FROM public.model_refused WHERE account = $1")
            .bind(self.flaky_account())
            .execute(&self.pool)
            .await
            .expect("healing");
        self.log.push("heal: the flaky account works".into());
    }

    /// The history's letters, each with the index of the message it was written from.
    pub async fn letters(&self) -> Vec<(LetterRow, Option<usize>)> {
        let job_ids: Vec<Uuid> = self.jobs.iter().map(|(j, _)| j.0).collect();
        let message_ids: Vec<String> = self.msgs.iter().map(|m| m.id.clone()).collect();
        let rows: Vec<LetterRow> = sqlx::query_as(
            "SELECT id, job_id, message_id, status, error_kind, attempts, reviewed_by,
                    replay_outcome
             FROM core.dead_letters
             WHERE consumer = $1 AND (job_id = ANY($2) OR message_id = ANY($3))
             ORDER BY created_at, id",
        )
        .bind(reference_name().as_str())
        .bind(&job_ids)
        .bind(&message_ids)
        .fetch_all(&self.pool)
        .await
        .expect("reading the letters");
        // A withdrawal's letter (`withdrawn:<letter>`) is of the message of the letter whose
        // replay it withdrew (a chain: that letter may be a withdrawal's too; the manual clock
        // gives them one `created_at`, so the chain is followed, not the order).
        let by_id: BTreeMap<Uuid, String> =
            rows.iter().map(|r| (r.id, r.message_id.clone())).collect();
        let mut letters: Vec<(LetterRow, Option<usize>)> = rows
            .into_iter()
            .map(|row| {
                let mut message_id = row.message_id.clone();
                for _ in 0..=by_id.len() {
                    let Some(of) = message_id.strip_prefix("withdrawn:") else {
                        break;
                    };
                    let Some(next) = Uuid::parse_str(of).ok().and_then(|of| by_id.get(&of)) else {
                        break;
                    };
                    message_id = next.clone();
                }
                let i = self.msgs.iter().position(|m| m.id == message_id);
                (row, i)
            })
            .collect();
        letters.sort_by_key(|(_, i)| *i);
        letters
    }

    async fn pending_letter(&self, pick: u8) -> Option<(Uuid, Option<usize>)> {
        let pending: Vec<(Uuid, Option<usize>)> = self
            .letters()
            .await
            .into_iter()
            .filter(|(l, _)| l.status == ReviewStatus::PendingReview.as_str())
            .map(|(l, i)| (l.id, i))
            .collect();
        (!pending.is_empty()).then(|| pending[usize::from(pick) % pending.len()])
    }

    fn letter_name(&self, i: Option<usize>) -> String {
        i.map_or_else(
            || "a letter".into(),
            |i| format!("the letter of {}", self.msgs[i].name),
        )
    }

    /// The operator replays the `pick`th pending letter, as received or edited, as the API's
    /// replay and edit routes do.
    pub async fn replay(&mut self, pick: u8, edit: bool, refused: bool) {
        let what = match (edit, refused) {
            (false, false) => "replay",
            (true, false) => "edit & replay",
            (false, true) => "replay (SQS refuses the send)",
            (true, true) => "edit & replay (SQS refuses the send)",
        };
        let Some((id, i)) = self.pending_letter(pick).await else {
            self.log.push(format!("{what}: no pending letter"));
            return;
        };
        let name = self.letter_name(i);
        let mut locked = lock_letter(&self.pool, DeadLetterId(id), Duration::from_secs(5))
            .await
            .expect("locking the letter")
            .expect("the letter exists");
        if locked.status() != ReviewStatus::PendingReview {
            self.log.push(format!("{what} {name}: 409 not pending"));
            return;
        }
        if locked.letter.error_kind == ErrorKind::Unsettled {
            self.log.push(format!("{what} {name}: 409 unsettled"));
            return;
        }
        let Some(job_id) = locked.letter.job_id else {
            self.log.push(format!("{what} {name}: 409 no job id"));
            return;
        };
        if locked.letter.error_kind == ErrorKind::Conflict
            || locked.fence_is_another_job().await.expect("the fence")
        {
            self.log.push(format!(
                "{what} {name}: 409 another job committed under the id (send it under a new id)"
            ));
            if let Some(i) = i {
                self.refused_as_another_job.push(i);
            }
            return;
        }
        let family = i.and_then(|i| self.msgs[i].family);
        let slot = i.and_then(|i| self.msgs[i].slot);
        let edited = match (edit, family) {
            (false, _) => None,
            (true, None) => {
                self.log
                    .push(format!("{what} {name}: not a job the model can edit"));
                return;
            }
            (true, Some(family)) => {
                let n = {
                    let n = self.edits.entry(family).or_default();
                    *n += 1;
                    *n
                };
                let tenant = self.jobs[usize::from(family.slot)].1.to_string();
                let job = job_id.to_string();
                let ids = Ids {
                    job_id: &job,
                    tenant_id: &tenant,
                    correlation_id: &format!("corr-{}", family.slot),
                };
                let account = self.account(family.slot, Payload::Good);
                let points = family.edit_points(n);
                let body = payload(Payload::Good, &account, points, false);
                Some(envelope(&ids, &body, Spelling::Exact, ""))
            }
        };
        let fence = locked
            .fence_exists()
            .await
            .expect("the fence")
            .unwrap_or(false);
        let outcome = if fence {
            ReplayOutcome::AlreadyProcessed
        } else {
            ReplayOutcome::Queued
        };
        let verdict = Verdict::Replayed {
            outcome,
            reason: edited
                .as_ref()
                .map(|_| "model: the operator corrects the payload".into()),
            body: edited.clone(),
        };
        locked
            .mark(&verdict, OPERATOR, self.clock.now())
            .await
            .expect("marking the replay");
        let letter = locked.commit().await.expect("committing the review");
        if fence {
            self.log
                .push(format!("{what} {name}: already processed, nothing sent"));
            return;
        }
        let body = shared::replay::letter_body(&letter);
        let label = match family {
            Some(f) if edited.is_some() => format!("{f:?} edit {}", self.edits[&f]),
            Some(f) => format!("{f:?} replay"),
            None => "replay of a non-job".into(),
        };
        let group = shared::replay::fifo_ids(&letter).map(|(g, _)| g);
        let unreadable = edited.is_none() && i.is_some_and(|i| self.msgs[i].unreadable);
        if refused {
            self.unsent.push(Unsent {
                letter: letter.id,
                body,
                family,
                slot,
                group,
                label,
                withdrawn: false,
                of: i,
                edited: edited.is_some(),
                unreadable,
            });
            self.log.push(format!(
                "{what} {name}: the send is refused, the replay stays queued"
            ));
            return;
        }
        let r = self.push(body, family, slot, label);
        let m = &mut self.msgs[r];
        m.edited = edited.is_some();
        m.unreadable = unreadable;
        m.replay_of = Some(letter.id);
        if self.cfg.fifo {
            m.group = group;
        }
        let message_id = m.id.clone();
        record_replay_sent(&self.pool, letter.id, &message_id, self.clock.now())
            .await
            .expect("recording the send");
        self.log
            .push(format!("{what} {name}: sent as {}", self.msgs[r].name));
    }

    /// The `pick`th replay recorded `queued` reaches the queue after all: the scheduled run's
    /// send gets through, or a send in flight as the operator withdrew it lands (it finds the
    /// replay withdrawn, and records nothing).
    pub async fn send_queued(&mut self, pick: u8) {
        if self.unsent.is_empty() {
            self.log.push("send a queued replay: none is queued".into());
            return;
        }
        let u = self.unsent.remove(usize::from(pick) % self.unsent.len());
        let r = self.push(u.body, u.family, u.slot, u.label);
        let m = &mut self.msgs[r];
        m.edited = u.edited;
        m.unreadable = u.unreadable;
        m.replay_of = Some(u.letter);
        if self.cfg.fifo {
            m.group = u.group;
        }
        let message_id = m.id.clone();
        let recorded = record_replay_sent(&self.pool, u.letter, &message_id, self.clock.now())
            .await
            .expect("recording the send");
        let name = self.letter_name(u.of);
        self.log.push(format!(
            "the queued replay of {name} is sent as {}{}",
            self.msgs[r].name,
            match (recorded.is_some(), u.withdrawn) {
                (true, _) => ", recorded sent".to_owned(),
                (false, true) => " (it was in flight as it was withdrawn: nothing recorded)".into(),
                (false, false) => " (NOT recorded: the replay was no longer queued)".into(),
            }
        ));
    }

    /// The operator withdraws the `pick`th replay of the history still recorded `queued` (or,
    /// when there is none, one already sent), as the API's withdraw route does.
    pub async fn withdraw(&mut self, pick: u8) {
        let letters = self.letters().await;
        let mut candidates: Vec<(Uuid, Option<usize>)> = letters
            .iter()
            .filter(|(l, _)| l.replay_outcome.as_deref() == Some("queued"))
            .map(|(l, i)| (l.id, *i))
            .collect();
        if candidates.is_empty() {
            candidates = letters
                .iter()
                .filter(|(l, _)| l.replay_outcome.as_deref() == Some("sent"))
                .map(|(l, i)| (l.id, *i))
                .collect();
        }
        if candidates.is_empty() {
            self.log.push("withdraw: no replay to withdraw".into());
            return;
        }
        let (id, i) = candidates[usize::from(pick) % candidates.len()];
        let name = self.letter_name(i);
        let queued = self.unsent.iter().any(|u| u.letter.0 == id && !u.withdrawn);
        let answer = withdraw_replay(
            &self.pool,
            DeadLetterId(id),
            OPERATOR,
            "model: the queue refuses it",
            self.clock.now(),
        )
        .await
        .expect("withdrawing");
        if matches!(
            answer,
            Withdrawal::Withdrawn(_) | Withdrawal::AlreadyProcessed
        ) {
            for u in &mut self.unsent {
                if u.letter.0 == id {
                    u.withdrawn = true;
                }
            }
        }
        self.withdrawals.push((i, queued, answer));
        self.log
            .push(format!("withdraw the replay of {name}: {answer:?}"));
    }

    /// The operator discards the `pick`th pending letter with a reason.
    pub async fn discard(&mut self, pick: u8) {
        let Some((id, i)) = self.pending_letter(pick).await else {
            self.log.push("discard: no pending letter".into());
            return;
        };
        let name = self.letter_name(i);
        let mut locked = lock_letter(&self.pool, DeadLetterId(id), Duration::from_secs(5))
            .await
            .expect("locking the letter")
            .expect("the letter exists");
        let reason = Verdict::Discarded {
            reason: "model: the operator discards it".into(),
        };
        locked
            .mark(&reason, OPERATOR, self.clock.now())
            .await
            .expect("discarding");
        locked.commit().await.expect("committing the discard");
        self.log.push(format!("discard {name}"));
    }

    /// Past the TTL, the sweeper runs: only once no copy of any job can still arrive (the
    /// queue is empty; after it, no job id sent before is sent again and no delete is lost).
    pub async fn sweep(&mut self) {
        if !self.queued().is_empty() {
            self.log
                .push("sweep: skipped, copies are still in the queue".into());
            return;
        }
        // A send in flight as its replay was withdrawn has landed or failed long before the TTL;
        // a replay still queued may be sent at any time (the sweeper keeps its job's fence).
        self.unsent.retain(|u| !u.withdrawn);
        self.clock
            .advance(chrono::Duration::from_std(FENCE_TTL).unwrap() + chrono::Duration::days(1));
        // The scheduled run settles the intake before it sweeps.
        self.settle_intake().await;
        let report = shared::upkeep::sweep::sweep(&self.pool, self.clock.as_ref(), SWEEP, None)
            .await
            .expect("the sweep");
        self.swept = true;
        self.swept_now = true;
        for m in &mut self.msgs {
            m.pre_sweep = true;
        }
        self.log.push(format!(
            "past the TTL, sweep: {} fences deleted (all cases)",
            report.deleted
        ));
    }
}

/// An outcome in a few words.
pub fn short(outcome: &RecordOutcome) -> String {
    match outcome {
        RecordOutcome::Processed => "Processed".into(),
        RecordOutcome::Duplicate => "Duplicate".into(),
        RecordOutcome::Contended { .. } => "Contended".into(),
        RecordOutcome::Retry { attempt, .. } => format!("Retry(attempt {attempt})"),
        RecordOutcome::DeadLettered { kind, .. } => format!("Letter({kind})"),
        RecordOutcome::HandedBack { error, .. } => format!("HandedBack({error})"),
        RecordOutcome::HeldBack => "HeldBack".into(),
        RecordOutcome::DeadLetterFailed { error, .. } => format!("LetterFailed({error})"),
    }
}
