//! The letters' intake (`core.letter_intake`, migration 0030): a storm's records received in one
//! narrow statement, then settled into letters in bulk, one settler at a time per consumer.
//!
//! Invariants:
//! - a received row is a record: committed before its message is acked, and deleted only after
//!   its letter is committed (or its job was found committed: no letter);
//! - settling is idempotent per message (one letter per consumer and message id, each through
//!   its job's fence): a row settled twice (a settler that died between the letter and the
//!   delete, a fallback beside a round) finds the letter it has;
//! - nothing is left behind by the lock: with a due of zero (the default), a writer that finds a
//!   settler at work leaves its rows to it, and a settler goes on until a round of its own, begun
//!   after it last let go of the lock, finds nothing (or its rounds run out: the next writer, or
//!   the scheduled function, takes over);
//! - nothing waits long: with a due ([`SETTLE_DUE`], `LETTER_SETTLE_DUE_MS`), a writer settles
//!   behind its rows when no letter of its consumer was written for that long (it is alone: its
//!   letters are written before it acks; or its stream's rows are due), and goes on while each
//!   round takes a full one, for at most the due; otherwise, or if it finds a settler at work, it
//!   leaves its rows for the next round. Rows left are taken by the next writer that finds them
//!   due, or within a minute by the scheduled function's settle (its bulk operations'
//!   invocation), whichever comes first.

use super::record::{Recorded, settled_of, storable_parts};
use super::settle::{CONFLICT_ERROR, Settled, record_with_fallback_on, refused_for_its_content};
use super::{ErrorKind, MAX_ERROR_BYTES, NewDeadLetter};
use crate::envelope::JobDigest;
use crate::fence::{FenceError, lock_wait};
use crate::ids::{ConsumerName, DeadLetterId, JobId, TenantId};
use crate::telemetry::otel::TraceParent;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::time::Duration;

/// The most rows one settle round takes.
pub const SETTLE_ROUND: i64 = 500;

/// The most body bytes one settle round takes (at least one row): a round holds each body
/// several times over (the row, the letter's text and parsed payload, their encodings), and
/// must fit the smallest function that settles (256 MB), whatever the bodies' size.
pub const SETTLE_ROUND_BYTES: i64 = 4 << 20;

/// The settle due measured for a storm (`LETTER_SETTLE_DUE_MS=1000`, docs/performance.md): a
/// writer that receives rows settles behind them only if its consumer's newest letter is at
/// least this old. One that finds no letter written for as long settles at once: alone, its
/// letters are written before it acks; in a stream, it takes the rows received since the last
/// round with its own. One that finds a letter written less long ago leaves its rows for the
/// next round: the writer that finds them due, or the scheduled function's settle. In a storm,
/// rounds then take what writers received over this long, not one batch's rows each. With a
/// due of zero (the default) every writer settles behind its own rows at once.
pub const SETTLE_DUE: Duration = Duration::from_millis(1_000);

/// The longest a writer with a due goes on settling behind its receipt (the due itself, when
/// shorter): a due of up to a minute must not keep an invocation settling past its function's
/// timeout (the DLQ ingester's is 30 s). What it leaves waits for the next writer that finds it
/// due, or the scheduled function.
pub const SETTLE_BUDGET: Duration = Duration::from_secs(5);

/// The most settle rounds a writer that settles at once (a due of zero) runs behind its own
/// rows: in a storm, the invocation holding the settle lock settles for others too, within this
/// bound; the next writer (or the scheduled run) goes on.
pub const SETTLE_ROUNDS: usize = 4;

/// A received row's key in the intake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IntakeSeq(pub i64);

/// Receives `letters` (of one consumer) in one statement, as they would be written: the
/// answers, in `letters`' order, are their rows' keys. Any failure receives none of them.
pub async fn receive_letters(
    pool: &sqlx::PgPool,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<IntakeSeq>> {
    Ok(receive_letters_noting(pool, letters, now, false)
        .await?
        .seqs)
}

/// Rows just received: their keys, in their letters' order, and how long ago their consumer's
/// newest letter was written as they were received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The rows' keys.
    pub seqs: Vec<IntakeSeq>,
    /// How long ago the consumer's newest letter was written, in milliseconds by the
    /// receiver's clock (`None`: it has none).
    pub lettered_ms: Option<i64>,
}

impl Receipt {
    /// Whether the receiver settles behind its rows now: no letter of the consumer was written
    /// for `due` ([`SETTLE_DUE`] as deployed; the rows are alone, and their letters are written before the
    /// receiver acks; or they are a stream's, and the rows received since its last round are
    /// due). Otherwise a round has just run: the rows wait for the next. A letter written later
    /// than the receiver's clock says it is now (another process's clock ahead of this one's)
    /// tells nothing: the receiver settles, as if alone.
    pub fn settles_now(&self, due: Duration) -> bool {
        let due = i64::try_from(due.as_millis()).unwrap_or(i64::MAX);
        self.lettered_ms.is_none_or(|ms| ms < 0 || ms >= due)
    }
}

/// [`receive_letters`], with how long ago the consumer's newest letter was written if `probe`
/// (a writer with a settle due; without one nothing reads it, and the probe is not run).
async fn receive_letters_noting(
    pool: &sqlx::PgPool,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    probe: bool,
) -> sqlx::Result<Receipt> {
    let Some((first, _)) = letters.first() else {
        return Ok(Receipt {
            seqs: Vec::new(),
            lettered_ms: None,
        });
    };
    let consumer = first.consumer;
    assert!(
        letters.iter().all(|(l, _)| l.consumer == consumer),
        "one consumer receives a call's letters"
    );
    let c = IntakeColumns::of(letters);
    // The newest letter: one probe of the consumer's index by creation (the intake's own oldest
    // row would be a walk over the index entries of the rows settled and not yet vacuumed).
    let rows = sqlx::query!(
        r#"WITH received AS (
             INSERT INTO core.letter_intake (consumer, received_at, job_id, tenant_id, queue,
                 message_id, body, attempts, error_kind, last_error, correlation_id, replay_of,
                 job_digest, digest_fields, message_group, trace_parent, nul_replaced)
             SELECT $1, $2, r.job_id, r.tenant_id, r.queue, r.message_id, r.body, r.attempts,
                    r.kind, r.error, r.correlation_id, r.replay_of, r.digest, r.fields::text[],
                    r.message_group, r.trace, r.nul_replaced
               FROM unnest($3::uuid[], $4::uuid[], $5::text[], $6::text[], $7::text[], $8::int[],
                           $9::text[], $10::text[], $11::text[], $12::uuid[], $13::bytea[],
                           $14::text[], $15::text[], $16::text[], $17::bool[]) WITH ORDINALITY
                    AS r (job_id, tenant_id, queue, message_id, body, attempts, kind, error,
                          correlation_id, replay_of, digest, fields, message_group, trace,
                          nul_replaced, o)
              ORDER BY r.o
             RETURNING seq)
         SELECT seq AS "seq!",
                CASE WHEN $18 THEN
                    (SELECT (extract(epoch FROM $2 - d.created_at) * 1000)::bigint
                       FROM core.dead_letters d
                      WHERE d.consumer = $1
                      ORDER BY d.created_at DESC LIMIT 1) END AS lettered_ms
           FROM received"#,
        consumer.as_str(),
        now,
        &c.job_ids as _,
        &c.tenant_ids as _,
        &c.queues,
        &c.message_ids,
        &c.bodies,
        &c.attempts,
        &c.kinds,
        &c.errors,
        &c.correlation_ids as _,
        &c.replay_ofs as _,
        &c.digests as _,
        &c.fields as _,
        &c.message_groups as _,
        &c.traces as _,
        &c.nul_replaced,
        probe,
    )
    .fetch_all(pool)
    .await?;
    let lettered_ms = rows.first().and_then(|r| r.lettered_ms);
    // An identity column counts up in the order the rows are inserted: sorted, the keys are in
    // `letters`' order.
    let mut seqs: Vec<i64> = rows.into_iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    Ok(Receipt {
        seqs: seqs.into_iter().map(IntakeSeq).collect(),
        lettered_ms,
    })
}

/// A text array's literal: `{"a","b"}`, each element quoted and escaped.
fn array_literal(items: &[&str]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

#[derive(Default)]
struct IntakeColumns {
    job_ids: Vec<Option<uuid::Uuid>>,
    tenant_ids: Vec<Option<uuid::Uuid>>,
    queues: Vec<String>,
    message_ids: Vec<String>,
    bodies: Vec<String>,
    attempts: Vec<i32>,
    kinds: Vec<String>,
    errors: Vec<String>,
    correlation_ids: Vec<Option<String>>,
    replay_ofs: Vec<Option<uuid::Uuid>>,
    digests: Vec<Option<Vec<u8>>>,
    fields: Vec<Option<String>>,
    message_groups: Vec<Option<String>>,
    traces: Vec<Option<String>>,
    nul_replaced: Vec<bool>,
}

impl IntakeColumns {
    /// The rows `letters` are received as, column by column, each value bounded as its letter
    /// will be.
    fn of(letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)]) -> Self {
        let mut c = IntakeColumns::default();
        for (letter, digest) in letters {
            let parts = storable_parts(letter);
            c.job_ids.push(letter.job_id.map(|j| j.0));
            c.tenant_ids.push(letter.tenant_id.map(|t| t.0));
            c.queues.push(parts.queue.into_owned());
            c.message_ids.push(parts.message_id.into_owned());
            c.bodies.push(parts.body.into_owned());
            c.attempts
                .push(i32::try_from(letter.attempts).unwrap_or(i32::MAX));
            c.kinds.push(letter.kind.as_str().to_owned());
            c.errors.push(parts.last_error.into_owned());
            c.correlation_ids
                .push(parts.correlation_id.map(|c| c.into_owned()));
            c.replay_ofs.push(letter.replay_of.map(|r| r.0));
            c.digests.push(digest.map(|d| d.0.to_vec()));
            // The fields a digest covers, as a text literal of an array (NULL: the whole
            // payload), kept for every row as its letter keeps them, with a digest or without.
            c.fields.push(
                (!letter.digest_fields.is_empty()).then(|| array_literal(letter.digest_fields)),
            );
            c.message_groups
                .push(parts.message_group.map(str::to_owned));
            c.traces.push(letter.trace.map(|t| t.to_w3c()));
            c.nul_replaced
                .push(letter.nul_replaced || letter.body.contains('\0'));
        }
        c
    }
}

/// [`receive_letters`]' statement with its values written in (`INSERT … VALUES … RETURNING
/// seq`), for a caller that sends it in one simple query with the statements of a transaction
/// it already holds (a commit group's: one commit for the batch's jobs and its poison's rows,
/// see `harness::batch`). Each value goes through [`crate::literal`], so none can change the
/// statement's meaning; its rows are `letters`' in order (an identity column counts up in the
/// order the `VALUES` are inserted), and its answers their keys.
pub fn receiving_statement(
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    probe: bool,
) -> Option<String> {
    use crate::literal::{bytea, opt_text, opt_uuid, text, timestamptz};
    let (first, _) = letters.first()?;
    let consumer = first.consumer;
    assert!(
        letters.iter().all(|(l, _)| l.consumer == consumer),
        "one consumer receives a call's letters"
    );
    let c = IntakeColumns::of(letters);
    let (consumer, now) = (text(consumer.as_str()), timestamptz(now));
    // The newest letter's age, as `receive_letters_noting` reads it, if `probe`.
    let lettered = if probe {
        format!(
            "(SELECT (extract(epoch FROM {now} - d.created_at) * 1000)::bigint
                FROM core.dead_letters d
               WHERE d.consumer = {consumer}
               ORDER BY d.created_at DESC LIMIT 1)"
        )
    } else {
        "NULL::bigint".to_owned()
    };
    let rows: Vec<String> = (0..letters.len())
        .map(|i| {
            let values = [
                consumer.clone(),
                now.clone(),
                opt_uuid(c.job_ids[i]),
                opt_uuid(c.tenant_ids[i]),
                text(&c.queues[i]),
                text(&c.message_ids[i]),
                text(&c.bodies[i]),
                format!("{}::int", c.attempts[i]),
                text(&c.kinds[i]),
                text(&c.errors[i]),
                opt_text(c.correlation_ids[i].as_deref()),
                opt_uuid(c.replay_ofs[i]),
                bytea(c.digests[i].as_deref()),
                format!("{}::text[]", opt_text(c.fields[i].as_deref())),
                opt_text(c.message_groups[i].as_deref()),
                opt_text(c.traces[i].as_deref()),
                c.nul_replaced[i].to_string(),
            ];
            format!("({})", values.join(", "))
        })
        .collect();
    Some(format!(
        "WITH received AS (
             INSERT INTO core.letter_intake (consumer, received_at, job_id, tenant_id, queue,
                 message_id, body, attempts, error_kind, last_error, correlation_id, replay_of,
                 job_digest, digest_fields, message_group, trace_parent, nul_replaced)
             VALUES {}
             RETURNING seq)
         SELECT seq, {lettered} FROM received",
        rows.join(",\n")
    ))
}

/// The [`Receipt`] of rows received by [`receiving_statement`], from the rows it answered.
pub fn receipt_of(rows: &[sqlx::postgres::PgRow]) -> sqlx::Result<Receipt> {
    use sqlx::Row;
    let mut seqs = Vec::with_capacity(rows.len());
    let mut lettered_ms = None;
    for row in rows {
        seqs.push(row.try_get::<i64, _>(0)?);
        lettered_ms = row.try_get::<Option<i64>, _>(1)?;
    }
    seqs.sort_unstable();
    Ok(Receipt {
        seqs: seqs.into_iter().map(IntakeSeq).collect(),
        lettered_ms,
    })
}

/// A received row, as a settler reads it back.
struct IntakeRow {
    seq: i64,
    job_id: Option<uuid::Uuid>,
    tenant_id: Option<uuid::Uuid>,
    queue: String,
    message_id: String,
    body: String,
    attempts: i32,
    error_kind: String,
    last_error: String,
    correlation_id: Option<String>,
    replay_of: Option<uuid::Uuid>,
    job_digest: Option<Vec<u8>>,
    digest_fields: Option<Vec<String>>,
    message_group: Option<String>,
    trace_parent: Option<String>,
    nul_replaced: bool,
}

/// The values of one row that a letter borrows.
struct Owned {
    digest: Option<JobDigest>,
    fields: Vec<String>,
}

/// What one settle round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Each row settled, with what became of it.
    pub settled: Vec<(IntakeSeq, Settled)>,
    /// Whether another settler held the lock: this round did nothing.
    pub busy: bool,
    /// Whether the rows could not be settled together and went one by one: a row left (a
    /// claim that waited out, a failure) waits for a later settler.
    pub fell_back: bool,
    /// The rows a fall back left ([`Round::fell_back`]).
    pub left: Vec<IntakeSeq>,
}

/// What [`settle_behind`] did: every row it settled (its own and others'), and whether it found
/// a settler at work.
#[derive(Debug, Default)]
pub struct Settling {
    /// Each row settled, with what became of it.
    pub settled: HashMap<IntakeSeq, Settled>,
    /// Letters written now (not found written).
    pub new_letters: usize,
    /// Whether a round found another settler at work (it settles what is left).
    pub busy: bool,
}

/// What [`receive_and_settle`] did with a writer's letters.
#[derive(Debug, Default)]
pub struct Received {
    /// Each letter's settlement, in the letters' order: its letter (or its job's commit), or
    /// [`Recorded::Received`] where the settler at work takes it.
    pub settled: Vec<Settled>,
    /// Letters written now by the settle (the writer's own and others').
    pub new_letters: usize,
}

/// A writer's letters (of one consumer) received in one statement ([`receive_letters`]), then
/// settled behind it ([`settle_received`], after `due`). Fails only if they could not be
/// received (none is, then); a settle that fails leaves them received, for the
/// next settler.
pub async fn receive_and_settle(
    pool: &sqlx::PgPool,
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    wait: Duration,
    due: Duration,
) -> sqlx::Result<Received> {
    let Some((first, _)) = letters.first() else {
        return Ok(Received::default());
    };
    let receipt = receive_letters_noting(pool, letters, now, !due.is_zero()).await?;
    Ok(settle_received(pool, first.consumer, receipt, now, wait, due).await)
}

/// Rows of `consumer` just received (committed), settled behind their receipt: with a `due` of
/// zero at once (up to [`SETTLE_ROUNDS`] rounds, until one finds nothing); else if the receipt
/// [`Receipt::settles_now`] after it (rounds while each takes a full [`SETTLE_ROUND`], for up to
/// `due`), or left received for the round that takes them with the rows received beside them.
/// What became of each, in the receipt's order. A settle that fails leaves them received, for
/// the next settler.
pub async fn settle_received(
    pool: &sqlx::PgPool,
    consumer: &ConsumerName,
    receipt: Receipt,
    now: DateTime<Utc>,
    wait: Duration,
    due: Duration,
) -> Received {
    let rounds = if due.is_zero() {
        Some((SETTLE_ROUNDS, Until::Empty))
    } else if receipt.settles_now(due) {
        let budget = due.min(SETTLE_BUDGET);
        Some((usize::MAX, Until::Partial { budget }))
    } else {
        None
    };
    let settling = match rounds {
        Some((rounds, until)) => settle_rounds(pool, consumer, now, wait, rounds, until)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "settling the received letters failed; they stay received");
                Settling::default()
            }),
        None => Settling::default(),
    };
    let settled = (receipt.seqs.into_iter())
        .map(|seq| {
            (settling.settled.get(&seq).copied())
                .unwrap_or(Settled::Recorded(Recorded::Received(seq)))
        })
        .collect();
    Received {
        settled,
        new_letters: settling.new_letters,
    }
}

/// Settles `consumer`'s received rows, oldest first, in rounds of up to [`SETTLE_ROUND`]: until a
/// round finds none, another settler at work, or `rounds` have run (a round that falls back to
/// rows one by one leaves the rows it could not settle to a later settler, and the rounds after
/// it pass them by). Each round is one
/// transaction under the consumer's settle lock ([`settle_round`]).
pub async fn settle_behind(
    pool: &sqlx::PgPool,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
    rounds: usize,
) -> Result<Settling, FenceError> {
    settle_rounds(pool, consumer, now, wait, rounds, Until::Empty).await
}

/// When a settler's rounds stop (besides a settler at work, or its rounds run out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// A round finds no row: the intake is drained (the scheduled run, tools).
    Empty,
    /// A round takes fewer rows than a full one (what it left came after it began, and waits
    /// for the writer that finds it due, or the scheduled run), or the rounds have taken
    /// `budget`, the due (a writer with a due: a stream's backlog of a due is settled within
    /// about as long, whatever the rate, and the next writer that finds it due goes on).
    Partial {
        /// How long the rounds may go on.
        budget: Duration,
    },
}

/// [`settle_behind`], its rounds stopping as `until` says.
async fn settle_rounds(
    pool: &sqlx::PgPool,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
    rounds: usize,
    until: Until,
) -> Result<Settling, FenceError> {
    let mut settling = Settling::default();
    // The rows a fall back left (their claims waited out, or they failed): a later settler's.
    let mut left: Vec<i64> = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        if let Until::Partial { budget } = until
            && started.elapsed() >= budget
        {
            break;
        }
        let round = settle_round_past(pool, consumer, now, wait, &left).await?;
        if round.busy {
            settling.busy = true;
            break;
        }
        let took = round.settled.len() + round.left.len();
        let done = match until {
            Until::Empty => took == 0,
            Until::Partial { .. } => !round.fell_back && took < SETTLE_ROUND as usize,
        };
        for (seq, settled) in round.settled {
            if matches!(
                settled,
                Settled::Recorded(Recorded::New(_)) | Settled::Conflict(Recorded::New(_))
            ) {
                settling.new_letters += 1;
            }
            settling.settled.insert(seq, settled);
        }
        // A round that fell back goes on past the rows it left: a writer that found this
        // settler at work meanwhile left its rows to it.
        left.extend(round.left.iter().map(|s| s.0));
        if done {
            break;
        }
    }
    Ok(settling)
}

/// One round: under the consumer's settle lock (a transaction-level advisory lock: another
/// settler at work makes this round [`Round::busy`] at once), its oldest rows written as letters
/// in one call of `core.record_letters` (each through its job's fence), and deleted: one
/// statement, `core.settle_intake` (migration 0038), so one round trip and one commit, and no
/// body crosses the wire. If it fails (a claim waited out, a value PostgreSQL refuses), nothing
/// of it is settled, and the round's rows go one by one instead ([`settle_one_by_one`]).
pub async fn settle_round(
    pool: &sqlx::PgPool,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
) -> Result<Round, FenceError> {
    settle_round_past(pool, consumer, now, wait, &[]).await
}

/// [`settle_round`], passing by the rows `skip` (ones a fall back of this settler left). Its
/// fall back runs on the connection the statement ran on: there the statement's transaction has
/// ended (its settle lock released) before the next one begins.
async fn settle_round_past(
    pool: &sqlx::PgPool,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
    skip: &[i64],
) -> Result<Round, FenceError> {
    let mut conn = crate::db::acquire(pool).await?;
    let round = settle_round_on(&mut conn, consumer, now, wait, skip).await;
    conn.give_back();
    round
}

/// [`settle_round_past`] on `conn`.
async fn settle_round_on(
    conn: &mut sqlx::PgConnection,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
    skip: &[i64],
) -> Result<Round, FenceError> {
    let rows = sqlx::query!(
        r#"SELECT seq, verdict, letter_id, fresh, busy AS "busy!"
             FROM core.settle_intake($1, $2, $3, $4, $5, $6, $7, $8)"#,
        consumer.as_str(),
        now,
        lock_wait(wait),
        SETTLE_ROUND as i32,
        SETTLE_ROUND_BYTES,
        CONFLICT_ERROR,
        (MAX_ERROR_BYTES / 2) as i32,
        skip,
    )
    .fetch_all(&mut *conn)
    .await;
    match rows {
        Ok(rows) if rows.first().is_some_and(|r| r.busy) => Ok(Round {
            busy: true,
            ..Round::default()
        }),
        Ok(rows) => {
            let settled = rows
                .into_iter()
                .map(|r| {
                    let seq = r.seq.expect("a settled row has its key");
                    let verdict = r.verdict.expect("a settled row has its verdict");
                    let fresh = r.fresh.unwrap_or(false);
                    (IntakeSeq(seq), settled_of(&verdict, r.letter_id, fresh))
                })
                .collect();
            Ok(Round {
                settled,
                ..Round::default()
            })
        }
        // PostgreSQL refused the round (a claim waited out, a value it refuses): nothing of it
        // is settled, and each row goes alone.
        Err(e) if refused_by_the_server(&e) => {
            tracing::warn!(error = %e,
                "the received letters could not be settled together; each goes alone");
            settle_one_by_one(conn, consumer, now, wait, skip).await
        }
        // The connection went (or the server, or the pool): the rows stay for a later settler.
        Err(e) => Err(e.into()),
    }
}

/// Whether `e` is PostgreSQL's answer to the statement, not the loss of its connection (class
/// 08) or of its session or server (57P01-57P05: a terminated backend, a shutdown).
fn refused_by_the_server(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| !code.starts_with("08") && !code.starts_with("57P"))
}

/// The round's rows, as [`settle_round`] takes them, under the settle lock again (busy if
/// another settler took it meanwhile), each written alone ([`each_alone`]), all on `conn`.
async fn settle_one_by_one(
    conn: &mut sqlx::PgConnection,
    consumer: &ConsumerName,
    now: DateTime<Utc>,
    wait: Duration,
    skip: &[i64],
) -> Result<Round, FenceError> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock(hashtextextended('core.letter_intake:' || $1, 0))
             AS "locked!""#,
        consumer.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    if !locked {
        tx.rollback().await?;
        return Ok(Round {
            busy: true,
            ..Round::default()
        });
    }
    let rows = sqlx::query_as!(
        IntakeRow,
        r#"SELECT seq AS "seq!", job_id, tenant_id, queue AS "queue!",
                message_id AS "message_id!", body AS "body!", attempts AS "attempts!",
                error_kind AS "error_kind!", last_error AS "last_error!", correlation_id,
                replay_of, job_digest, digest_fields, message_group, trace_parent,
                nul_replaced AS "nul_replaced!"
           FROM (SELECT *, sum(octet_length(body)) OVER (ORDER BY seq) AS upto
                   FROM core.letter_intake
                  WHERE consumer = $1 AND refused IS NULL AND NOT (seq = ANY ($4))
                  ORDER BY seq LIMIT $2) r
          WHERE upto - octet_length(body) < $3
          ORDER BY seq"#,
        consumer.as_str(),
        SETTLE_ROUND,
        SETTLE_ROUND_BYTES,
        skip,
    )
    .fetch_all(&mut *tx)
    .await?;
    let owned: Vec<Owned> = rows.iter().map(owned_of).collect();
    let fields: Vec<Vec<&str>> = owned
        .iter()
        .map(|o| o.fields.iter().map(String::as_str).collect())
        .collect();
    let letters: Vec<(NewDeadLetter<'_>, Option<&JobDigest>)> = rows
        .iter()
        .zip(&owned)
        .zip(&fields)
        .map(|((row, o), f)| (letter_of(row, consumer, f), o.digest.as_ref()))
        .collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let settled = each_alone(&mut tx, consumer, &seqs, &letters, now, wait).await?;
    tx.commit().await?;
    let done: std::collections::HashSet<i64> = settled.iter().map(|(s, _)| s.0).collect();
    let left = seqs
        .into_iter()
        .filter(|s| !done.contains(s))
        .map(IntakeSeq)
        .collect();
    Ok(Round {
        settled,
        fell_back: true,
        left,
        ..Round::default()
    })
}

/// A round's rows one by one, each in a savepoint of its own with the as-received fallback,
/// inside the round's transaction (`lock`), which keeps the settle lock: the rows whose letter
/// (or whose job's commit) is settled are deleted in it. The claims share one lock wait in all, as
/// the call's do: once it is spent, a row whose claim must wait is left for a later round. A
/// row PostgreSQL refuses even as received is set aside with why (its `refused` column): no
/// later round tries it again.
async fn each_alone(
    lock: &mut sqlx::PgConnection,
    consumer: &ConsumerName,
    seqs: &[i64],
    letters: &[(NewDeadLetter<'_>, Option<&JobDigest>)],
    now: DateTime<Utc>,
    wait: Duration,
) -> Result<Vec<(IntakeSeq, Settled)>, FenceError> {
    let until = std::time::Instant::now() + wait;
    let mut settled = Vec::new();
    let mut done = Vec::new();
    for (&seq, (letter, digest)) in seqs.iter().zip(letters) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let left = left.max(Duration::from_millis(10));
        match record_with_fallback_on(&mut *lock, letter, *digest, now, Some(left)).await {
            Ok(s) => {
                done.push(seq);
                settled.push((IntakeSeq(seq), s));
            }
            Err(e) if refused_for_its_content(&e) => {
                tracing::error!(error = %e, seq, message_id = letter.message_id,
                    "a received letter was refused even as received; set aside in the intake");
                sqlx::query!(
                    "UPDATE core.letter_intake SET refused = $3 WHERE consumer = $1 AND seq = $2",
                    consumer.as_str(),
                    seq,
                    e.to_string(),
                )
                .execute(&mut *lock)
                .await?;
            }
            Err(e) => tracing::warn!(error = %e, seq,
                "a received letter could not be settled; a later round tries again"),
        }
    }
    delete_rows(lock, consumer, &done).await?;
    Ok(settled)
}

async fn delete_rows(
    conn: &mut sqlx::PgConnection,
    consumer: &ConsumerName,
    seqs: &[i64],
) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM core.letter_intake WHERE consumer = $1 AND seq = ANY ($2)",
        consumer.as_str(),
        seqs,
    )
    .execute(conn)
    .await
    .map(drop)
}

fn owned_of(row: &IntakeRow) -> Owned {
    Owned {
        digest: row
            .job_digest
            .as_deref()
            .and_then(|d| <[u8; 32]>::try_from(d).ok())
            .map(JobDigest),
        fields: row.digest_fields.clone().unwrap_or_default(),
    }
}

fn letter_of<'a>(
    row: &'a IntakeRow,
    consumer: &'a ConsumerName,
    fields: &'a [&'a str],
) -> NewDeadLetter<'a> {
    NewDeadLetter {
        job_id: row.job_id.map(JobId),
        tenant_id: row.tenant_id.map(TenantId),
        consumer,
        queue: &row.queue,
        message_id: &row.message_id,
        body: &row.body,
        attempts: u32::try_from(row.attempts).unwrap_or(1),
        // Only this crate writes a row's kind: an unknown one is a bug, kept as poison.
        kind: ErrorKind::parse(&row.error_kind).unwrap_or(ErrorKind::Poison),
        last_error: &row.last_error,
        correlation_id: row.correlation_id.as_deref(),
        replay_of: row.replay_of.map(DeadLetterId),
        message_group: row.message_group.as_deref(),
        digest_fields: fields,
        trace: row.trace_parent.as_deref().and_then(TraceParent::from_w3c),
        nul_replaced: row.nul_replaced,
    }
}

/// When the oldest record still to settle was received (rows set aside as refused are never
/// settled, and count for nothing): each consumer's first row by its key, one index probe per
/// consumer. The sweep keeps the fences that expired after it: its settle goes through its
/// job's fence.
pub async fn oldest_received(conn: &mut sqlx::PgConnection) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!(
        "WITH RECURSIVE c (consumer) AS (
             (SELECT consumer FROM core.letter_intake ORDER BY consumer LIMIT 1)
             UNION ALL
             SELECT (SELECT i.consumer FROM core.letter_intake i
                      WHERE i.consumer > c.consumer ORDER BY i.consumer LIMIT 1)
               FROM c WHERE c.consumer IS NOT NULL)
         SELECT min((SELECT i.received_at FROM core.letter_intake i
                      WHERE i.consumer = c.consumer AND i.refused IS NULL
                      ORDER BY i.seq LIMIT 1))
           FROM c WHERE c.consumer IS NOT NULL"
    )
    .fetch_one(conn)
    .await
}

/// Takes `consumer`'s settle lock in the transaction `conn` is in, waiting for it: a settler at
/// work, as [`settle_round`] is while it holds the lock (for tests and tools that stand in for
/// one).
pub async fn take_settle_lock(
    conn: &mut sqlx::PgConnection,
    consumer: &ConsumerName,
) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('core.letter_intake:' || $1, 0))",
        consumer.as_str(),
    )
    .execute(conn)
    .await
    .map(drop)
}

/// The consumers with rows received and not yet settled, one index probe each (a skip scan of
/// the intake's key).
pub async fn consumers_with_received(pool: &sqlx::PgPool) -> sqlx::Result<Vec<ConsumerName>> {
    let names = sqlx::query_scalar!(
        r#"WITH RECURSIVE c (consumer) AS (
               (SELECT consumer FROM core.letter_intake ORDER BY consumer LIMIT 1)
               UNION ALL
               SELECT (SELECT i.consumer FROM core.letter_intake i
                        WHERE i.consumer > c.consumer ORDER BY i.consumer LIMIT 1)
                 FROM c WHERE c.consumer IS NOT NULL)
           SELECT consumer AS "consumer!" FROM c WHERE consumer IS NOT NULL"#
    )
    .fetch_all(pool)
    .await?;
    // Only a consumer wrote them, under its validated name.
    Ok(names
        .into_iter()
        .filter_map(|n| ConsumerName::new(n).ok())
        .collect())
}
