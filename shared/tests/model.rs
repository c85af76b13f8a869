//! Issue 34's class check: a model-based test of the harness. Generated short histories of
//! deliveries (batches of first and repeat deliveries, standard or FIFO, in either commit
//! mode; exact copies, the same job in other spellings, another job under the id, a body that
//! writes `job_id` twice, a number written otherwise (`1001.0`, `1.001e3`, `10010e-1`: the same
//! job by its digest, poison to the payload type's `i64`), bodies that are not JSON or not the
//! payload, a producer's changing `note` beside a consumer that names its job fields), failures
//! (a flaky account, poison, a crash after the work and before `COMMIT`, a lost delete, a
//! redrive to the DLQ past `maxReceiveCount` with the real ingester, FIFO groups re-received
//! whole round after round, counted as SQS counts them), operator actions (replay, edit &
//! replay, a replay whose send SQS refuses so it stays `queued` and is sent later or withdrawn
//! back to review, discard, through the library calls the API makes; a bulk replay or discard of
//! a tenant's pending letters, its worker killed mid-work and the next one going on, its replays
//! through the local SQS API back into the queue) and time (past the TTL, a
//! sweep, once no copy can still arrive) run against the real harness and the reference
//! consumer on a real,
//! migrated database. After every step a checker reads the database and asserts the promises
//! (`model/check.rs` lists them). A failure shrinks to a minimal history, printed step by step
//! with what each step did.
//!
//! `MODEL_CASES` (default 24) histories per run; `MODEL_SEED` (or `PROPTEST_RNG_SEED`) picks
//! them (default: a fixed seed, so the test command is the same every run; the soak,
//! `bash scripts/soak.sh model [cases] [seed]`, runs many more with an unseen seed).
//! `DATABASE_URL` names the server (a database of the run's own is made and dropped).
//! `MODEL_LENIENT` tolerates a hole the model found and that is fixed (a letter of a copy that
//! never ran wiping its job's execution ledger: `tests/model_findings.rs`), to look past it on an
//! older tree.

#[path = "model/bodies.rs"]
mod bodies;
#[path = "model/check.rs"]
mod check;
#[path = "model/probe.rs"]
mod probe;
#[path = "model/world.rs"]
mod world;

use bodies::{Payload, Spelling};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngSeed, TestError, TestRunner};
use proptest_state_machine::ReferenceStateMachine;
use shared::harness::CommitMode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a history is set in: the commit mode, the queue type, and each job id's two payloads.
#[derive(Clone, Debug)]
pub struct Config {
    /// One transaction per job, or per batch.
    pub mode: CommitMode,
    /// A FIFO queue (every message in a group: slots 0 and 2 in `g0`, slot 1 in `g1`).
    pub fifo: bool,
    /// Per job id (slot): its two payloads (two jobs under one id).
    pub slots: Vec<[Payload; 2]>,
    /// The producer adds a `note` that changes on every send, and the consumer names its job
    /// fields (`account_id`, `points`): copies differing in the note are one job.
    pub noted: bool,
    /// The process's pool has one connection (`DATABASE_POOL_SIZE=1`, a batch's records one at
    /// a time), where every writer and its fall back must still finish on that connection (an
    /// outside attack found a settle's fall back waiting on a second one).
    pub pool_of_one: bool,
    /// The consumer and its DLQ ingester settle letters with the due as deployed
    /// (`LETTER_SETTLE_DUE_MS`, `SETTLE_DUE`): a writer that finds a letter of its consumer
    /// written less than the due ago (by the world's clock) acks its failures with their rows
    /// received, for a later writer, the scheduled run or a `Settle` step.
    pub settle_due: bool,
}

/// One step of a history.
#[derive(Clone, Debug)]
pub enum Step {
    /// A producer sends job `slot` with its `variant`th payload, written in `spelling`.
    Send {
        slot: u8,
        variant: u8,
        spelling: Spelling,
    },
    /// A producer sends a body that is not JSON.
    SendGarbage,
    /// The queue hands over a batch: on a standard queue the `picks`th queued messages, on a
    /// FIFO queue the next message of the `pick`th group for each pick (at most
    /// `world::FIFO_BATCH` of them).
    Deliver { picks: Vec<u8> },
    /// `times` batches of the same shape, one after another, each visibility timeout passing
    /// (the promises are checked after each).
    Rounds { picks: Vec<u8>, times: u8 },
    /// The `pick`th queued message's process dies after the work, before `COMMIT`.
    Crash { pick: u8 },
    /// The `pick`th acked message comes back: its delete was lost.
    LostDelete { pick: u8 },
    /// The flaky account works again.
    Heal,
    /// The operator replays the `pick`th pending letter.
    Replay { pick: u8 },
    /// The operator edits the `pick`th pending letter's payload and replays it.
    EditReplay { pick: u8 },
    /// The operator replays (or edits and replays) the `pick`th pending letter; SQS refuses the
    /// send, so the replay stays `queued`.
    ReplayRefused { pick: u8, edit: bool },
    /// The `pick`th queued replay reaches the queue after all (the scheduled run's send, or a
    /// send in flight as it was withdrawn).
    SendQueued { pick: u8 },
    /// The operator withdraws the `pick`th queued replay (or, if none, a sent one: refused).
    Withdraw { pick: u8 },
    /// The operator discards the `pick`th pending letter, with a reason.
    Discard { pick: u8 },
    /// The operator replays (or discards) in one bulk operation the pending letters of job
    /// `slot`'s tenant; its worker is killed after `cut` polls, if given, and the next goes on
    /// (an even `cut`: the operator first withdraws a replay the dead worker left unsent).
    Bulk {
        slot: u8,
        replay: bool,
        cut: Option<u8>,
    },
    /// Time passes the TTL and the scheduled run settles the intake, then sweeps (only if no
    /// copy is in the queue).
    SweepPastTtl,
    /// A batch handed over while another settler of the consumer is at work (the settle lock
    /// held): its poison is acked as received and stays in the letters' intake.
    DeliverWhileSettling { picks: Vec<u8> },
    /// The scheduled run settles the letters' intake.
    Settle,
    /// A copy of job (`slot`, `variant`) sent longer ago than its fence is trusted to live (a
    /// DLQ kept longer than the functions were told) reaches the DLQ ingester, once no other
    /// copy of its id can: `unsettled`, unless its fence is still there, its own job's (no
    /// letter) or another job's under its id (a `conflict` letter; an outside attack found it
    /// acked without one).
    RedriveOld { slot: u8, variant: u8 },
}

struct Model;

/// Batches after which the flaky account's job has likely spent its attempts.
const MAX_ATTEMPTS_HINT: u32 = world::MAX_ATTEMPTS;

/// The reference state: the history's setting, and what the steps so far make possible (so an
/// operator's step on a queued replay comes after a replay, not in the void).
#[derive(Clone, Debug)]
pub struct Plan {
    pub cfg: Config,
    /// Sends that fail (poison as written, or the flaky account's) not yet handed over.
    pub failing_sent: u32,
    /// Batches handed over since the flaky account's first send.
    pub flaky_rounds: u32,
    /// A letter is likely to exist (a failing send handed over; the flaky account's a few
    /// times).
    pub delivered: bool,
    /// A replay has been refused (a replay may be queued).
    pub refused: bool,
}

impl ReferenceStateMachine for Model {
    type State = Plan;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Plan> {
        let payload = prop_oneof![
            5 => Just(Payload::Good),
            2 => Just(Payload::Flaky),
            1 => Just(Payload::BadPoints),
            1 => Just(Payload::WrongShape),
        ];
        (
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec([payload.clone(), payload], 3),
            proptest::bool::weighted(0.25),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.5),
        )
            .prop_map(
                |(batch, fifo, slots, noted, pool_of_one, settle_due)| Config {
                    mode: if batch {
                        CommitMode::Batch
                    } else {
                        CommitMode::PerJob
                    },
                    fifo,
                    slots,
                    noted,
                    pool_of_one,
                    settle_due,
                },
            )
            .prop_map(|cfg| Plan {
                cfg,
                failing_sent: 0,
                flaky_rounds: 0,
                delivered: false,
                refused: false,
            })
            .boxed()
    }

    fn transitions(plan: &Plan) -> BoxedStrategy<Step> {
        let spelling = prop_oneof![
            8 => Just(Spelling::Exact),
            1 => Just(Spelling::UpperIds),
            1 => Just(Spelling::NoDashes),
            1 => Just(Spelling::Reordered),
            1 => Just(Spelling::Spaced),
            1 => Just(Spelling::JobIdTwice),
            1 => Just(Spelling::PointsDecimal),
            1 => Just(Spelling::PointsExponent),
            1 => Just(Spelling::PointsNegExponent),
        ];
        let rounds = if plan.cfg.fifo { 4 } else { 1 };
        // An operator's steps once a letter may exist; a queued replay's once one may be queued.
        let review = if plan.delivered { 3 } else { 0 };
        let queued = if plan.refused { 4 } else { 0 };
        let variant = prop_oneof![3 => Just(0u8), 1 => Just(1u8)];
        let steps: Vec<(u32, BoxedStrategy<Step>)> = vec![
            (
                8,
                (0..3u8, variant, spelling)
                    .prop_map(|(slot, variant, spelling)| Step::Send {
                        slot,
                        variant,
                        spelling,
                    })
                    .boxed(),
            ),
            (1, Just(Step::SendGarbage).boxed()),
            (
                10,
                proptest::collection::vec(0..8u8, 1..=4)
                    .prop_map(|picks| Step::Deliver { picks })
                    .boxed(),
            ),
            (
                rounds,
                (proptest::collection::vec(0..8u8, 1..=4), 2..=6u8)
                    .prop_map(|(picks, times)| Step::Rounds { picks, times })
                    .boxed(),
            ),
            (2, (0..8u8).prop_map(|pick| Step::Crash { pick }).boxed()),
            (
                1,
                (0..8u8).prop_map(|pick| Step::LostDelete { pick }).boxed(),
            ),
            (1, Just(Step::Heal).boxed()),
            (
                review,
                (0..4u8).prop_map(|pick| Step::Replay { pick }).boxed(),
            ),
            (
                review,
                (0..4u8).prop_map(|pick| Step::EditReplay { pick }).boxed(),
            ),
            (
                2 * review,
                (0..4u8, any::<bool>())
                    .prop_map(|(pick, edit)| Step::ReplayRefused { pick, edit })
                    .boxed(),
            ),
            (
                queued,
                (0..4u8).prop_map(|pick| Step::SendQueued { pick }).boxed(),
            ),
            (
                queued,
                (0..4u8).prop_map(|pick| Step::Withdraw { pick }).boxed(),
            ),
            (
                review / 2,
                (0..4u8).prop_map(|pick| Step::Discard { pick }).boxed(),
            ),
            (
                review,
                (0..3u8, any::<bool>(), proptest::option::of(1..40u8))
                    .prop_map(|(slot, replay, cut)| Step::Bulk { slot, replay, cut })
                    .boxed(),
            ),
            (1, Just(Step::SweepPastTtl).boxed()),
            (
                3,
                proptest::collection::vec(0..8u8, 2..=4)
                    .prop_map(|picks| Step::DeliverWhileSettling { picks })
                    .boxed(),
            ),
            (2, Just(Step::Settle).boxed()),
            (
                1,
                (0..3u8, 0..2u8)
                    .prop_map(|(slot, variant)| Step::RedriveOld { slot, variant })
                    .boxed(),
            ),
        ];
        proptest::strategy::Union::new_weighted(steps.into_iter().filter(|(w, _)| *w > 0).collect())
            .boxed()
    }

    fn apply(mut plan: Plan, step: &Step) -> Plan {
        let handed = match step {
            Step::Send {
                slot,
                variant,
                spelling,
            } => {
                let kind = plan.cfg.slots[usize::from(*slot)][usize::from(*variant)];
                if kind == Payload::Flaky && *spelling == Spelling::Exact {
                    plan.flaky_rounds = plan.flaky_rounds.max(1);
                }
                if kind != Payload::Good || *spelling != Spelling::Exact {
                    plan.failing_sent += 1;
                }
                0
            }
            Step::SendGarbage => {
                plan.failing_sent += 1;
                0
            }
            Step::Deliver { .. } | Step::DeliverWhileSettling { .. } | Step::Crash { .. } => 1,
            Step::Rounds { times, .. } => u32::from(*times),
            Step::ReplayRefused { .. } => {
                plan.refused = true;
                0
            }
            // Its letter may exist at once (an operator's steps may follow).
            Step::RedriveOld { .. } => {
                plan.delivered = true;
                0
            }
            _ => 0,
        };
        if handed > 0 {
            if plan.failing_sent > 0 {
                plan.delivered = true;
            }
            if plan.flaky_rounds > 0 {
                plan.flaky_rounds += handed;
                plan.delivered |= plan.flaky_rounds > MAX_ATTEMPTS_HINT;
            }
        }
        plan
    }
}

/// The run's own database on the server `DATABASE_URL` names, migrated, with the flaky
/// account's refusal: a trigger on the reference consumer's effect table refusing every
/// account listed in `public.model_refused` (a statement that fails, transiently).
struct Database {
    admin: PgConnectOptions,
    name: String,
    connect: PgConnectOptions,
    pool: PgPool,
}

impl Database {
    async fn create() -> Self {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let admin = PgConnectOptions::from_str(&url)
            .expect("DATABASE_URL")
            .log_statements(tracing::log::LevelFilter::Off);
        let name = format!("model_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin.connect().await.expect("connecting to DATABASE_URL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("creating the run's database");
        let connect = admin.clone().database(&name);
        // Named, so the checker finds its connections (`check::WORLD_POOL`).
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(connect.clone().application_name(check::WORLD_POOL))
            .await
            .expect("connecting to the run's database");
        consumer::MIGRATOR_WITH_CORE
            .run(&pool)
            .await
            .expect("migrating");
        sqlx::raw_sql(
            "CREATE TABLE public.model_refused (account text PRIMARY KEY);
             CREATE FUNCTION public.model_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM public.model_refused WHERE account = NEW.account_id) THEN
                     RAISE EXCEPTION 'ledger refused account %', NEW.account_id;
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER model_refuse BEFORE INSERT ON reference.point_awards
                 FOR EACH ROW EXECUTE FUNCTION public.model_refuse();",
        )
        .execute(&pool)
        .await
        .expect("the flaky account's trigger");
        Self {
            admin,
            name,
            connect,
            pool,
        }
    }

    async fn drop_it(self) {
        self.pool.close().await;
        if let Ok(mut conn) = self.admin.connect().await {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
        }
    }
}

/// Runs one history, checking after every step; the first broken promises, with the history
/// so far.
async fn run_history(
    db: &Database,
    cfg: Config,
    steps: &[Step],
    seen: Option<&AtomicUsize>,
) -> Result<(), String> {
    let mut world = world::World::new(db.pool.clone(), db.connect.clone(), cfg).await;
    let mut memory = check::Memory::default();
    for (n, step) in steps.iter().enumerate() {
        if let Some(seen) = seen {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        // A step of rounds is checked after each round; every other step after it.
        let rounds = match step {
            Step::Rounds { times, .. } => (*times).max(1),
            _ => 1,
        };
        for round in 0..rounds {
            if round > 0 && world.queue_is_empty() {
                break;
            }
            world.delivered.clear();
            world.redriven.clear();
            world.refused_as_another_job.clear();
            world.withdrawals.clear();
            world.swept_now = false;
            let logged = world.log.len();
            match step {
                Step::Send {
                    slot,
                    variant,
                    spelling,
                } => world.send(*slot, *variant, *spelling),
                Step::SendGarbage => world.send_garbage(),
                Step::Deliver { picks } | Step::Rounds { picks, .. } => world.deliver(picks).await,
                Step::Crash { pick } => world.crash(*pick).await,
                Step::LostDelete { pick } => world.lost_delete(*pick),
                Step::Heal => world.heal().await,
                Step::Replay { pick } => world.replay(*pick, false, false).await,
                Step::EditReplay { pick } => world.replay(*pick, true, false).await,
                Step::ReplayRefused { pick, edit } => world.replay(*pick, *edit, true).await,
                Step::SendQueued { pick } => world.send_queued(*pick).await,
                Step::Withdraw { pick } => world.withdraw(*pick).await,
                Step::Discard { pick } => world.discard(*pick).await,
                Step::Bulk { slot, replay, cut } => world.bulk(*slot, *replay, *cut).await,
                Step::SweepPastTtl => world.sweep().await,
                Step::DeliverWhileSettling { picks } => world.deliver_while_settling(picks).await,
                Step::Settle => world.settle_intake().await,
                Step::RedriveOld { slot, variant } => world.redrive_old(*slot, *variant).await,
            }
            let did: Vec<String> = world.log[logged..].to_vec();
            world.log.truncate(logged);
            let heading = if round == 0 {
                format!("{:>2}. {step:?}\n      ", n + 1)
            } else {
                "      ".to_owned()
            };
            let label = if rounds > 1 {
                format!("round {}: ", round + 1)
            } else {
                String::new()
            };
            world
                .log
                .push(format!("{heading}{label}{}", did.join("\n      ")));
            let broken = check::check(&world, &mut memory).await;
            if !broken.is_empty() {
                let history = world.log.join("\n");
                let cfg = world.cfg.clone();
                world.close().await;
                return Err(format!(
                    "broken after step {}:\n  {}\nin {cfg:?}, history:\n{history}",
                    n + 1,
                    broken.join("\n  ")
                ));
            }
        }
    }
    if std::env::var_os("MODEL_VERBOSE").is_some() {
        let letters: Vec<String> = world
            .letters()
            .await
            .iter()
            .map(|(l, i)| format!("  {l:?} of {:?}", i.map(|i| &world.msgs[i].name)))
            .collect();
        eprintln!(
            "{:?}\n{}\nletters:\n{}\n",
            world.cfg,
            world.log.join("\n"),
            letters.join("\n")
        );
    }
    world.close().await;
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seed of the test command's histories, unless `MODEL_SEED` says another.
const DEFAULT_SEED: u64 = 34;

/// The two tests run one after the other: their bulk steps share the local SQS API's queue
/// (each drains it of earlier histories' replays), and side by side one's operation was seen
/// to go missing from the other's world (1 run in 5, once the intake's steps made the generated
/// histories run as long as the hand-written ones). Not understood yet; see docs/tests.md.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn model_histories_keep_the_promises() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cases = env_u64("MODEL_CASES").unwrap_or(24);
    let seed = env_u64("MODEL_SEED")
        .or_else(|| env_u64("PROPTEST_RNG_SEED"))
        .unwrap_or(DEFAULT_SEED);
    eprintln!("model: {cases} histories, seed {seed} (MODEL_CASES, MODEL_SEED)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let db = runtime.block_on(Database::create());
    let config = RunnerConfig {
        cases: u32::try_from(cases).unwrap_or(u32::MAX),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 2048,
        max_shrink_time: 180_000,
        ..RunnerConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = Model::sequential_strategy(3..=14);
    let runs = AtomicUsize::new(0);
    let result = runner.run(&strategy, |(plan, steps, seen)| {
        runs.fetch_add(1, Ordering::SeqCst);
        let seen: Option<Arc<AtomicUsize>> = seen;
        runtime
            .block_on(run_history(&db, plan.cfg, &steps, seen.as_deref()))
            .map_err(TestCaseError::fail)
    });
    runtime.block_on(db.drop_it());
    match result {
        Ok(()) => eprintln!("model: {} histories, every promise kept", runs.into_inner()),
        Err(TestError::Fail(reason, (Plan { cfg, .. }, steps, _))) => {
            let steps: Vec<String> = steps
                .iter()
                .enumerate()
                .map(|(n, s)| format!("  {:>2}. {s:?}", n + 1))
                .collect();
            panic!(
                "a history broke a promise (seed {seed}; {} histories run, shrinking included).\n\
                 Minimal history, in {cfg:?}:\n{}\n\nWhat it did and what broke:\n{reason}",
                runs.into_inner(),
                steps.join("\n")
            );
        }
        Err(TestError::Abort(reason)) => panic!("the model test aborted: {reason}"),
    }
}

/// Issue 34's examples as histories of the model, through the same world and checker: each
/// must keep every promise (they are the histories the random ones should find first).
#[test]
fn model_hand_written_histories_keep_the_promises() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use Payload::{BadPoints, Flaky, Good};
    use Step::{Deliver, EditReplay, ReplayRefused, Rounds, Send, SendQueued, Withdraw};
    let send = |slot, variant, spelling| Send {
        slot,
        variant,
        spelling,
    };
    let good = vec![[Good, Good]; 3];
    let examples: Vec<(&str, Config, Vec<Step>)> = vec![
        (
            "old copies past the fence's horizon, of the committed job and of another job under \
             its id, then of a job that never committed, with the settle due (the outside attack \
             on the DLQ ingester's batch path)",
            Config {
                mode: CommitMode::Batch,
                fifo: false,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: true,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                Step::RedriveOld {
                    slot: 0,
                    variant: 0,
                },
                Step::RedriveOld {
                    slot: 0,
                    variant: 1,
                },
                Step::RedriveOld {
                    slot: 1,
                    variant: 0,
                },
                Step::Settle,
            ],
        ),
        (
            "a pool of one connection: two poison records beside two jobs in one batch while a \
             settler is at work, then settled, batch mode (an outside attack on the settle)",
            Config {
                mode: CommitMode::Batch,
                fifo: false,
                slots: good.clone(),
                noted: false,
                pool_of_one: true,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Step::SendGarbage,
                send(1, 0, Spelling::Exact),
                Step::SendGarbage,
                Step::DeliverWhileSettling {
                    picks: vec![0, 1, 2, 3],
                },
                Step::Settle,
                Deliver { picks: vec![0, 1] },
                Step::SweepPastTtl,
            ],
        ),
        (
            "another job under the id in one FIFO batch, batch mode (item 1)",
            Config {
                mode: CommitMode::Batch,
                fifo: true,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 1, Spelling::Exact),
                Deliver { picks: vec![0, 0] },
            ],
        ),
        (
            "a body writing job_id twice beside its job, standard batch, batch mode (item 1)",
            Config {
                mode: CommitMode::Batch,
                fifo: false,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 1, Spelling::JobIdTwice),
                Deliver { picks: vec![0, 1] },
            ],
        ),
        (
            "an edited job leaves its sibling letter pending (item 2)",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[Flaky, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                EditReplay { pick: 0 },
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "a bulk replay of a tenant's letters, its worker killed mid-work, FIFO, batch mode",
            Config {
                mode: CommitMode::Batch,
                fifo: true,
                slots: vec![[Flaky, Good], [Good, Good], [BadPoints, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 0, Spelling::UpperIds),
                send(2, 0, Spelling::Exact),
                Rounds {
                    picks: vec![0, 1, 2],
                    times: 6,
                },
                Step::Bulk {
                    slot: 0,
                    replay: true,
                    cut: Some(6),
                },
                Step::Bulk {
                    slot: 2,
                    replay: true,
                    cut: None,
                },
                Rounds {
                    picks: vec![0, 1],
                    times: 3,
                },
            ],
        ),
        (
            "a bulk discard, its worker killed at its first await, then a replay of nothing left",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[BadPoints, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0, 1] },
                Step::Bulk {
                    slot: 0,
                    replay: false,
                    cut: Some(1),
                },
                Step::Bulk {
                    slot: 0,
                    replay: true,
                    cut: None,
                },
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "found by the model: a replay in one batch with a redelivery of the message it \
             replays is acked unrun",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[Flaky, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Deliver { picks: vec![0] },
                Step::LostDelete { pick: 0 },
                Step::Heal,
                Step::Replay { pick: 0 },
                Deliver { picks: vec![0, 1] },
            ],
        ),
        (
            "the same job in upper case is not another job (item 6)",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                send(0, 0, Spelling::UpperIds),
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "a replay SQS refuses stays queued; withdrawn, the job is back to review; edited, it \
             commits (nothing stays stuck)",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[BadPoints, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                ReplayRefused {
                    pick: 0,
                    edit: false,
                },
                Withdraw { pick: 0 },
                EditReplay { pick: 0 },
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "a withdrawal racing its send, the replay failing again: two pending letters, never \
             none, then one effect",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[Flaky, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Rounds {
                    picks: vec![0],
                    times: 3,
                },
                ReplayRefused {
                    pick: 0,
                    edit: false,
                },
                Withdraw { pick: 0 },
                SendQueued { pick: 0 },
                Rounds {
                    picks: vec![0],
                    times: 3,
                },
                Step::Heal,
                Step::Replay { pick: 0 },
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "a queued replay of a job another copy committed: withdrawn as already processed",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[Flaky, Good], [Good, Good], [Good, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                Rounds {
                    picks: vec![0],
                    times: 3,
                },
                ReplayRefused {
                    pick: 0,
                    edit: false,
                },
                Step::Heal,
                send(0, 0, Spelling::Spaced),
                Deliver { picks: vec![0] },
                Withdraw { pick: 0 },
                SendQueued { pick: 0 },
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "points written 1.001e3 first in a batch: poison, never acking the valid copy unrun",
            Config {
                mode: CommitMode::Batch,
                fifo: false,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(1, 0, Spelling::PointsExponent),
                send(1, 0, Spelling::Exact),
                send(1, 0, Spelling::PointsDecimal),
                Deliver {
                    picks: vec![0, 1, 2],
                },
                send(1, 0, Spelling::PointsNegExponent),
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "the same, one FIFO group, per job",
            Config {
                mode: CommitMode::PerJob,
                fifo: true,
                slots: good.clone(),
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::PointsDecimal),
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0, 0] },
                Deliver { picks: vec![0, 0] },
            ],
        ),
        (
            "copies differing in a note the consumer's job fields leave out are one job",
            Config {
                mode: CommitMode::Batch,
                fifo: false,
                slots: good.clone(),
                noted: true,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 0, Spelling::Reordered),
                Deliver { picks: vec![0, 1] },
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
            ],
        ),
        (
            "FIFO: a healthy job behind three failing ones in its batch runs, never redriven \
             unrun (item 3; with attempts + 2 as the FIFO redrive it is `crashed` unrun)",
            Config {
                mode: CommitMode::PerJob,
                fifo: true,
                slots: vec![[Flaky, Flaky], [Good, Good], [Flaky, Good]],
                noted: false,
                pool_of_one: false,
                settle_due: false,
            },
            vec![
                send(0, 0, Spelling::Exact),
                send(0, 1, Spelling::Exact),
                send(2, 0, Spelling::Exact),
                send(2, 1, Spelling::Exact),
                Rounds {
                    picks: vec![0, 0, 0, 0],
                    times: 6,
                },
                Rounds {
                    picks: vec![0, 0, 0, 0],
                    times: 6,
                },
            ],
        ),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let db = runtime.block_on(Database::create());
    let mut broken = Vec::new();
    for (name, cfg, steps) in examples {
        if let Err(e) = runtime.block_on(run_history(&db, cfg, &steps, None)) {
            broken.push(format!("{name}:\n{e}"));
        }
    }
    runtime.block_on(db.drop_it());
    assert!(broken.is_empty(), "\n{}", broken.join("\n\n"));
}
