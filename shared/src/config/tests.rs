use super::*;
use crate::retry::RetryPolicy;

const BASE: [(&str, &str); 3] = [
    (DATABASE_URL, "postgres://localhost/db"),
    (CONSUMER_NAME, "award-points"),
    (BETTERSTACK_API_TOKEN, "t0ken"),
];

fn load(extra: &[(&'static str, &'static str)]) -> Result<ConsumerConfig, ConfigError> {
    let pairs: Vec<_> = BASE.iter().chain(extra).copied().collect();
    ConsumerConfig::from_env(&Env::from_pairs(&pairs))
}

#[test]
fn defaults_are_the_platform_policy() {
    let c = load(&[]).unwrap();
    assert_eq!(c.fence.policy, RetryPolicy::default());
    assert_eq!(c.fence.ttl, Duration::from_secs(14 * 86_400));
    assert_eq!(c.fence.dlq_retention, Duration::from_secs(5 * 86_400));
    assert_eq!(c.database.pool_size, 5);
    assert_eq!(c.consumer_name.as_str(), "award-points");
}

#[test]
fn the_harness_default_is_what_an_unconfigured_function_runs_with() {
    let configured = crate::run::harness_settings(&load(&[]).unwrap());
    let default = crate::harness::HarnessSettings::default();
    assert_eq!(format!("{configured:?}"), format!("{default:?}"));
}

#[test]
fn a_ttl_under_the_floor_is_rejected_naming_the_variable() {
    let err = load(&[(FENCE_TTL_SECONDS, "86400")]).unwrap_err();
    assert_eq!(err.variable, FENCE_TTL_SECONDS);
    assert!(
        err.to_string()
            .starts_with("FENCE_TTL_SECONDS: 86400 s is below the safe floor"),
        "{err}"
    );
    // Raising a retention raises the floor too.
    let err = load(&[
        (QUEUE_RETENTION_SECONDS, "1209600"),
        (DLQ_RETENTION_SECONDS, "1209600"),
    ])
    .unwrap_err();
    assert_eq!(err.variable, FENCE_TTL_SECONDS, "{err}");
    assert!(
        load(&[
            (QUEUE_RETENTION_SECONDS, "1209600"),
            (DLQ_RETENTION_SECONDS, "1209600"),
            (FENCE_TTL_SECONDS, "2600000")
        ])
        .is_ok()
    );
}

/// Issue 22, hole 2: the DLQ kept a message 14 days from its original send while the fence
/// lived 7, and the floor counted only the job queue: a committed job's copy reaching the
/// ingester (or redriven back to its queue) after the sweep was applied twice. The floor now
/// counts the DLQ's retention and a redrive back to the source, and every function that
/// touches fences refuses a TTL under it, naming the variable.
#[test]
fn the_ttl_floor_counts_the_dlq_retention_and_a_redrive_back_to_the_source() {
    // The old defaults: the DLQ at 14 days, the fence at 7.
    let err = load(&[
        (DLQ_RETENTION_SECONDS, "1209600"),
        (FENCE_TTL_SECONDS, "604800"),
    ])
    .unwrap_err();
    assert_eq!(err.variable, FENCE_TTL_SECONDS, "{err}");
    assert!(
        err.to_string().contains("DLQ_RETENTION_SECONDS 1209600 s"),
        "{err}"
    );
    // Fourteen days of DLQ: a copy redriven back at the DLQ's last moment, failing again into
    // the DLQ, can still arrive 28 days after its first send.
    for too_short in ["1555200", "1728000", "2500000"] {
        let err = load(&[
            (DLQ_RETENTION_SECONDS, "1209600"),
            (FENCE_TTL_SECONDS, too_short),
        ])
        .unwrap_err();
        assert_eq!(err.variable, FENCE_TTL_SECONDS, "{too_short}: {err}");
    }
    assert!(
        load(&[
            (DLQ_RETENTION_SECONDS, "1209600"),
            (FENCE_TTL_SECONDS, "2507000")
        ])
        .is_ok()
    );
    let old_defaults = [
        (DATABASE_URL, "postgres://h/d"),
        (ALERTING_DISABLED, "true"),
        (CONSUMER_NAME, "award-points"),
        (JOB_QUEUE_NAME, "jobs"),
        (DLQ_RETENTION_SECONDS, "1209600"),
        (FENCE_TTL_SECONDS, "604800"),
    ];
    let env = Env::from_pairs(&old_defaults);
    let scheduled = ScheduledConfig::from_env(&env).map(drop).unwrap_err();
    let ingester = DlqIngesterConfig::from_env(&env).map(drop).unwrap_err();
    assert_eq!(
        (scheduled.variable, ingester.variable),
        (FENCE_TTL_SECONDS, FENCE_TTL_SECONDS)
    );
}

#[test]
fn a_dlq_that_keeps_messages_shorter_than_its_queue_is_rejected_naming_the_variable() {
    let err = load(&[(DLQ_RETENTION_SECONDS, "86400")]).unwrap_err();
    assert_eq!(err.variable, DLQ_RETENTION_SECONDS, "{err}");
    assert!(err.to_string().contains("original send"), "{err}");
}

#[test]
fn a_policy_override_without_rationale_is_rejected_naming_the_variable() {
    let err = load(&[(RETRY_MAX_ATTEMPTS, "8")]).unwrap_err();
    assert_eq!(err.variable, RETRY_OVERRIDE_RATIONALE);
    assert!(
        err.to_string().contains("overrides the platform default"),
        "{err}"
    );
    let ok = load(&[
        (RETRY_MAX_ATTEMPTS, "8"),
        (RETRY_OVERRIDE_RATIONALE, "provider outages last hours"),
    ])
    .unwrap();
    assert_eq!(ok.fence.policy.max_attempts(), 8);
    // Stating the default explicitly is not an override.
    assert!(load(&[(RETRY_BASE_SECONDS, "30")]).is_ok());
}

#[test]
fn alerting_needs_a_token_unless_explicitly_disabled() {
    let pairs = [(DATABASE_URL, "postgres://h/d"), (CONSUMER_NAME, "c")];
    let err = ConsumerConfig::from_env(&Env::from_pairs(&pairs)).unwrap_err();
    assert_eq!(err.variable, BETTERSTACK_API_TOKEN);
    assert!(err.to_string().contains("ALERTING_DISABLED=true"), "{err}");
    let disabled = [pairs[0], pairs[1], (ALERTING_DISABLED, "true")];
    assert!(
        ConsumerConfig::from_env(&Env::from_pairs(&disabled))
            .unwrap()
            .alerts
            .is_none()
    );
    let on = load(&[]).unwrap().alerts.expect("alerting on");
    assert_eq!(on.base_url, "https://uptime.betterstack.com");
    assert!(
        !format!("{on:?}").contains("t0ken"),
        "the token never shows in Debug"
    );
    assert_eq!(
        load(&[(BETTERSTACK_BASE_URL, "ftp://x")])
            .unwrap_err()
            .variable,
        BETTERSTACK_BASE_URL
    );
}

#[test]
fn the_sweeper_refuses_a_ttl_under_the_floor_naming_the_variable() {
    let pairs = [
        (DATABASE_URL, "postgres://h/d"),
        (ALERTING_DISABLED, "true"),
        (FENCE_TTL_SECONDS, "86400"),
    ];
    let err = ScheduledConfig::from_env(&Env::from_pairs(&pairs)).unwrap_err();
    assert_eq!(err.variable, FENCE_TTL_SECONDS);
    assert!(
        err.to_string().contains("would apply its effect twice"),
        "{err}"
    );
    let ok = ScheduledConfig::from_env(&Env::from_pairs(&pairs[..2])).unwrap();
    assert_eq!(
        (ok.sweep.batch_size, ok.escalate_after),
        (5_000, Duration::from_secs(3 * 86_400))
    );
    let bad = [pairs[0], pairs[1], (ESCALATE_AFTER_DAYS, "0")];
    assert_eq!(
        ScheduledConfig::from_env(&Env::from_pairs(&bad))
            .unwrap_err()
            .variable,
        ESCALATE_AFTER_DAYS
    );
}

#[test]
fn the_redrive_count_must_exceed_the_attempts() {
    let base = [
        (DATABASE_URL, "postgres://h/d"),
        (CONSUMER_NAME, "award-points"),
        (JOB_QUEUE_NAME, "jobs"),
        (ALERTING_DISABLED, "true"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let pairs: Vec<_> = base.iter().chain(extra).copied().collect();
        DlqIngesterConfig::from_env(&Env::from_pairs(&pairs))
    };
    assert_eq!(with(&[]).unwrap().fence.max_receive_count, 7);
    assert_eq!(
        with(&[(REDRIVE_MAX_RECEIVE_COUNT, "5")])
            .unwrap_err()
            .variable,
        REDRIVE_MAX_RECEIVE_COUNT
    );
    let no_queue =
        DlqIngesterConfig::from_env(&Env::from_pairs(&[base[0], base[1], base[3]])).unwrap_err();
    assert_eq!(no_queue.variable, JOB_QUEUE_NAME);
}

#[test]
fn the_commit_mode_is_per_job_unless_a_consumer_opts_into_batches() {
    use super::CommitMode;
    assert_eq!(load(&[]).unwrap().commit, CommitMode::PerJob);
    let batch = load(&[(COMMIT_MODE, "batch")]).unwrap();
    assert_eq!(
        crate::run::harness_settings(&batch).commit,
        CommitMode::Batch
    );
    assert_eq!(
        load(&[(COMMIT_MODE, "batched")]).unwrap_err().variable,
        COMMIT_MODE
    );
}

#[test]
fn the_letters_settle_due_is_zero_unless_set_and_at_most_a_minute() {
    use std::time::Duration;
    assert_eq!(load(&[]).unwrap().settle_due, Duration::ZERO);
    let due = load(&[(LETTER_SETTLE_DUE_MS, "1000")]).unwrap();
    assert_eq!(
        crate::run::harness_settings(&due).settle_due,
        Duration::from_secs(1)
    );
    // The DLQ ingester reads the same variable, with the same bounds.
    let ingester = |due: Option<&'static str>| {
        let mut pairs = vec![
            (DATABASE_URL, "postgres://h/d"),
            (CONSUMER_NAME, "award-points"),
            (JOB_QUEUE_NAME, "jobs"),
            (ALERTING_DISABLED, "true"),
        ];
        pairs.extend(due.map(|d| (LETTER_SETTLE_DUE_MS, d)));
        DlqIngesterConfig::from_env(&Env::from_pairs(&pairs))
    };
    assert_eq!(ingester(None).unwrap().settle_due, Duration::ZERO);
    assert_eq!(
        ingester(Some("1000")).unwrap().settle_due,
        Duration::from_secs(1)
    );
    for bad in ["60001", "-1", "1s"] {
        assert_eq!(
            load(&[(LETTER_SETTLE_DUE_MS, bad)]).unwrap_err().variable,
            LETTER_SETTLE_DUE_MS,
            "{bad}"
        );
        assert_eq!(
            ingester(Some(bad)).unwrap_err().variable,
            LETTER_SETTLE_DUE_MS,
            "{bad}"
        );
    }
}

#[test]
fn missing_and_malformed_variables_name_themselves() {
    let err = ConsumerConfig::from_env(&Env::from_pairs(&[(CONSUMER_NAME, "x")])).unwrap_err();
    assert!(
        err.to_string().starts_with("DATABASE_URL: is not set"),
        "{err}"
    );
    assert_eq!(
        load(&[(DEADLINE_MARGIN_MS, "1000")]).unwrap_err().variable,
        DEADLINE_MARGIN_MS,
        "a margin the SQS call's own timeout does not fit in"
    );
    assert_eq!(
        load(&[(BETTERSTACK_TOKEN_SECRET_ARN, "arn:aws:secretsmanager:x")])
            .unwrap_err()
            .variable,
        BETTERSTACK_TOKEN_SECRET_ARN,
        "a token given twice"
    );
    let err = ConsumerConfig::from_env(&Env::from_pairs(&[(DATABASE_URL, "postgres://h/d")]))
        .unwrap_err();
    assert_eq!(err.variable, CONSUMER_NAME);
    assert_eq!(
        load(&[(RETRY_BASE_SECONDS, "soon")]).unwrap_err().variable,
        RETRY_BASE_SECONDS
    );
    assert_eq!(
        load(&[
            (RETRY_CAP_SECONDS, "99999999"),
            (RETRY_OVERRIDE_RATIONALE, "r")
        ])
        .unwrap_err()
        .variable,
        RETRY_CAP_SECONDS
    );
    assert_eq!(
        load(&[(DATABASE_POOL_SIZE, "0")]).unwrap_err().variable,
        DATABASE_POOL_SIZE
    );
    assert_eq!(
        load(&[(QUEUE_RETENTION_SECONDS, "5")])
            .unwrap_err()
            .variable,
        QUEUE_RETENTION_SECONDS
    );
    let bad_url = ConsumerConfig::from_env(&Env::from_pairs(&[
        (CONSUMER_NAME, "x"),
        (DATABASE_URL, "mysql://x"),
    ]));
    assert_eq!(bad_url.unwrap_err().variable, DATABASE_URL);
}

/// Issue 13, hole 4: settings that would lose messages stop every function that reads them.
#[test]
fn a_redrive_count_not_above_the_attempts_stops_the_consumer_and_the_sweeper_too() {
    let consumer = load(&[(REDRIVE_MAX_RECEIVE_COUNT, "5")]).unwrap_err();
    assert_eq!(consumer.variable, REDRIVE_MAX_RECEIVE_COUNT);
    assert!(consumer.problem.contains("must exceed"), "{consumer}");
    let sweeper = ScheduledConfig::from_env(&Env::from_pairs(&[
        (DATABASE_URL, "postgres://h/d"),
        (ALERTING_DISABLED, "true"),
        (REDRIVE_MAX_RECEIVE_COUNT, "3"),
    ]))
    .unwrap_err();
    assert_eq!(sweeper.variable, REDRIVE_MAX_RECEIVE_COUNT);
    assert_eq!(
        load(&[(REDRIVE_MAX_RECEIVE_COUNT, "6")])
            .unwrap()
            .fence
            .max_receive_count,
        6
    );
}

/// Issue 13, hole 4: SQS deletes a message at the end of its retention whatever its retries,
/// and an expired message is never redriven: a retention inside the retry window loses it.
#[test]
fn a_queue_retention_shorter_than_the_retry_window_stops_the_consumer() {
    // The default policy waits up to 675 s between its attempts; + 1 h margin = 4275 s.
    let short = load(&[
        (QUEUE_RETENTION_SECONDS, "4000"),
        (FENCE_TTL_SECONDS, "604800"),
    ])
    .unwrap_err();
    assert_eq!(short.variable, QUEUE_RETENTION_SECONDS);
    assert!(short.problem.contains("retry window 675 s"), "{short}");
    assert!(load(&[(QUEUE_RETENTION_SECONDS, "4275")]).is_ok());
    let backstop = DlqIngesterConfig::from_env(&Env::from_pairs(&[
        (DATABASE_URL, "postgres://h/d"),
        (CONSUMER_NAME, "award-points"),
        (JOB_QUEUE_NAME, "jobs"),
        (ALERTING_DISABLED, "true"),
        (QUEUE_RETENTION_SECONDS, "600"),
    ]))
    .unwrap_err();
    assert_eq!(backstop.variable, QUEUE_RETENTION_SECONDS);
}

#[test]
fn the_unsent_replay_bound_is_checked_naming_the_variable() {
    let base = [
        (DATABASE_URL, "postgres://h/d"),
        (ALERTING_DISABLED, "true"),
    ];
    let with = |v: &'static str| {
        let mut pairs = base.to_vec();
        pairs.push((REPLAY_UNSENT_ALERT_SECONDS, v));
        ScheduledConfig::from_env(&Env::from_pairs(&pairs))
    };
    assert_eq!(
        ScheduledConfig::from_env(&Env::from_pairs(&base))
            .unwrap()
            .replay_alert_after,
        Duration::from_secs(3600)
    );
    for bad in ["60", "604801", "soon"] {
        assert_eq!(
            with(bad).unwrap_err().variable,
            REPLAY_UNSENT_ALERT_SECONDS,
            "{bad}"
        );
    }
    assert_eq!(
        with("7200").unwrap().replay_alert_after,
        Duration::from_secs(7200)
    );
}

/// Issue 34, item 4: a FIFO DLQ resets a message's enqueue time on the move, so a TTL that
/// holds for a standard queue (the default 14 days) lets a committed job's copy, moved to the
/// FIFO DLQ and back, arrive after its fence is swept. The FIFO floor counts each stay from the
/// move; the functions refuse a TTL under it, naming the variable, and default above it.
#[test]
fn a_fifo_queue_counts_each_dlq_stay_from_the_move() {
    let fifo = [(QUEUE_FIFO, "true")];
    let err = load(&[fifo[0], (FENCE_TTL_SECONDS, "1209600")]).unwrap_err();
    assert_eq!(err.variable, FENCE_TTL_SECONDS, "{err}");
    assert!(
        err.to_string()
            .contains("counts its retention from the move"),
        "{err}"
    );
    assert!(load(&[(FENCE_TTL_SECONDS, "1209600")]).is_ok(), "standard");
    let c = load(&fifo).unwrap();
    assert!(c.fence.fifo);
    assert_eq!(c.fence.ttl, Duration::from_secs(21 * 86_400));
    // Floor + one second passes; at the floor - 1 it does not.
    let floor = crate::fence::ttl_floor(
        c.fence.queue_retention,
        c.fence.dlq_retention,
        &c.fence.policy,
        true,
    )
    .as_secs();
    let (under, over) = ((floor - 1).to_string(), (floor + 1).to_string());
    let env = |ttl: &str| {
        let pairs: Vec<(&str, &str)> = BASE
            .iter()
            .copied()
            .chain([(QUEUE_FIFO, "true"), (FENCE_TTL_SECONDS, ttl)])
            .collect();
        ConsumerConfig::from_env(&Env::from_pairs(&pairs))
    };
    assert_eq!(env(&under).unwrap_err().variable, FENCE_TTL_SECONDS);
    assert!(env(&over).is_ok());
}

/// Issue 34, item 3: on a FIFO queue every receive of a group's failing head receives the
/// records behind it in its batch, held back; with a redrive of the attempts + 2 a healthy
/// record two failing jobs back was redriven without ever running. The redrive must be the
/// batch size times that, whatever the group's depth; the functions refuse less.
#[test]
fn a_fifo_redrive_covers_every_record_held_back_in_a_batch() {
    let err = load(&[(QUEUE_FIFO, "true"), (REDRIVE_MAX_RECEIVE_COUNT, "7")]).unwrap_err();
    assert_eq!(err.variable, REDRIVE_MAX_RECEIVE_COUNT, "{err}");
    assert!(err.to_string().contains("without ever running"), "{err}");
    let c = load(&[(QUEUE_FIFO, "true")]).unwrap();
    assert_eq!(
        c.fence.max_receive_count, 70,
        "10 records x (5 attempts + 2)"
    );
    assert!(
        load(&[
            (QUEUE_FIFO, "true"),
            (CONSUMER_BATCH_SIZE, "1"),
            (REDRIVE_MAX_RECEIVE_COUNT, "7")
        ])
        .is_ok()
    );
    assert_eq!(load(&[]).unwrap().fence.max_receive_count, 7, "standard");
    assert_eq!(
        load(&[(QUEUE_FIFO, "yes")]).unwrap_err().variable,
        QUEUE_FIFO
    );
}

/// Issue 34 (the outside attack): the DLQ ingester digests its letters with `JOB_FIELDS`; a
/// consumer whose code names other fields would have its letters taken for another job (or
/// another job's for its own), so it refuses to start, naming the variable.
#[test]
fn a_consumer_and_its_ingester_agree_on_the_job_fields() {
    let c = load(&[(JOB_FIELDS, " amount,account_id,amount ")]).unwrap();
    assert_eq!(c.fence.job_fields, ["account_id", "amount"]);
    assert!(
        c.fence
            .agree_on_job_fields(&["amount", "account_id"])
            .is_ok()
    );
    let err = c.fence.agree_on_job_fields(&["amount"]).unwrap_err();
    assert_eq!(err.variable, JOB_FIELDS, "{err}");
    assert!(err.to_string().contains("JobFields"), "{err}");
    let whole = load(&[]).unwrap();
    assert!(whole.fence.job_fields.is_empty());
    assert!(whole.fence.agree_on_job_fields(&[]).is_ok());
    assert_eq!(
        whole
            .fence
            .agree_on_job_fields(&["amount"])
            .unwrap_err()
            .variable,
        JOB_FIELDS
    );
    assert_eq!(
        load(&[(JOB_FIELDS, "a b")]).unwrap_err().variable,
        JOB_FIELDS
    );
}
