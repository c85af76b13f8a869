//! Issue 34's class check: a model-based test of the harness. Generated short histories of
//! deliveries (batches of first and repeat deliveries, standard or FIFO, in either commit
//! mode; exact copies, the same job in other spellings, another job under the id, a body that
//! writes `job_id` twice, bodies that are not JSON or not the payload), failures (a flaky
//! account, poison, a crash after the work and before `COMMIT`, a lost delete, a redrive to the
//! DLQ past `maxReceiveCount` with the real ingester), operator actions (replay, edit & replay,
//! discard, through the library calls the API makes) and time (past the TTL, a sweep, once no
//! copy can still arrive) run against the real harness and the reference consumer on a real,
//! migrated database. After every step a checker reads the database and asserts the promises
//! (`model/check.rs` lists them). A failure shrinks to a minimal history, printed step by step
//! with what each step did.
//!
//! `MODEL_CASES` (default 24) histories per run; `MODEL_SEED` (or `PROPTEST_RNG_SEED`) picks
//! them (default: a fixed seed, so the test command is the same every run; the soak,
//! `bash scripts/soak.sh model [cases] [seed]`, runs many more with an unseen seed).
//! `DATABASE_URL` names the server (a database of the run's own is made and dropped).

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
    /// FIFO queue the next message of the `pick`th group for each pick.
    Deliver { picks: Vec<u8> },
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
    /// The operator discards the `pick`th pending letter, with a reason.
    Discard { pick: u8 },
    /// Time passes the TTL and the sweeper runs (only if no copy is in the queue).
    SweepPastTtl,
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = Config;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Config> {
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
        )
            .prop_map(|(batch, fifo, slots)| Config {
                mode: if batch {
                    CommitMode::Batch
                } else {
                    CommitMode::PerJob
                },
                fifo,
                slots,
            })
            .boxed()
    }

    fn transitions(_: &Config) -> BoxedStrategy<Step> {
        let spelling = prop_oneof![
            8 => Just(Spelling::Exact),
            1 => Just(Spelling::UpperIds),
            1 => Just(Spelling::NoDashes),
            1 => Just(Spelling::Reordered),
            1 => Just(Spelling::Spaced),
            1 => Just(Spelling::JobIdTwice),
        ];
        let variant = prop_oneof![3 => Just(0u8), 1 => Just(1u8)];
        prop_oneof![
            8 => (0..3u8, variant, spelling).prop_map(|(slot, variant, spelling)| Step::Send {
                slot,
                variant,
                spelling
            }),
            1 => Just(Step::SendGarbage),
            10 => proptest::collection::vec(0..8u8, 1..=4).prop_map(|picks| Step::Deliver { picks }),
            2 => (0..8u8).prop_map(|pick| Step::Crash { pick }),
            1 => (0..8u8).prop_map(|pick| Step::LostDelete { pick }),
            1 => Just(Step::Heal),
            2 => (0..4u8).prop_map(|pick| Step::Replay { pick }),
            2 => (0..4u8).prop_map(|pick| Step::EditReplay { pick }),
            1 => (0..4u8).prop_map(|pick| Step::Discard { pick }),
            1 => Just(Step::SweepPastTtl),
        ]
        .boxed()
    }

    fn apply(state: Config, _: &Step) -> Config {
        state
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
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(connect.clone())
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
        world.delivered.clear();
        world.redriven.clear();
        world.refused_as_another_job.clear();
        world.swept_now = false;
        let logged = world.log.len();
        match step {
            Step::Send {
                slot,
                variant,
                spelling,
            } => world.send(*slot, *variant, *spelling),
            Step::SendGarbage => world.send_garbage(),
            Step::Deliver { picks } => world.deliver(picks).await,
            Step::Crash { pick } => world.crash(*pick).await,
            Step::LostDelete { pick } => world.lost_delete(*pick),
            Step::Heal => world.heal().await,
            Step::Replay { pick } => world.replay(*pick, false).await,
            Step::EditReplay { pick } => world.replay(*pick, true).await,
            Step::Discard { pick } => world.discard(*pick).await,
            Step::SweepPastTtl => world.sweep().await,
        }
        let did: Vec<String> = world.log[logged..].to_vec();
        world.log.truncate(logged);
        world.log.push(format!(
            "{:>2}. {step:?}\n      {}",
            n + 1,
            did.join("\n      ")
        ));
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

#[test]
fn model_histories_keep_the_promises() {
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
    let strategy = Model::sequential_strategy(3..=12);
    let runs = AtomicUsize::new(0);
    let result = runner.run(&strategy, |(cfg, steps, seen)| {
        runs.fetch_add(1, Ordering::SeqCst);
        let seen: Option<Arc<AtomicUsize>> = seen;
        runtime
            .block_on(run_history(&db, cfg, &steps, seen.as_deref()))
            .map_err(TestCaseError::fail)
    });
    runtime.block_on(db.drop_it());
    match result {
        Ok(()) => eprintln!("model: {} histories, every promise kept", runs.into_inner()),
        Err(TestError::Fail(reason, (cfg, steps, _))) => {
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
fn model_issue_34_examples_keep_the_promises() {
    use Payload::{Flaky, Good};
    use Step::{Deliver, EditReplay, Send};
    let send = |slot, variant, spelling| Send {
        slot,
        variant,
        spelling,
    };
    let good = vec![[Good, Good]; 3];
    let examples: Vec<(&str, Config, Vec<Step>)> = vec![
        (
            "another job under the id in one FIFO batch, batch mode (item 1)",
            Config {
                mode: CommitMode::Batch,
                fifo: true,
                slots: good.clone(),
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
            "found by the model: a replay in one batch with a redelivery of the message it \
             replays is acked unrun",
            Config {
                mode: CommitMode::PerJob,
                fifo: false,
                slots: vec![[Flaky, Good], [Good, Good], [Good, Good]],
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
            },
            vec![
                send(0, 0, Spelling::Exact),
                Deliver { picks: vec![0] },
                send(0, 0, Spelling::UpperIds),
                Deliver { picks: vec![0] },
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
