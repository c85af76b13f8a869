//! Issue 22, item 7: every number and reason `dlq` takes is checked by clap before anything is
//! asked of the API, with a message naming the flag; `--rate 1e-20` used to pass the check and
//! panic when the run started (`Duration::from_secs_f64(1e20)`).

use clap::Parser;
use dlq::args::{Cli, Command, MAX_RATE};

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("dlq").chain(args.iter().copied()))
}

/// The refusal of `args`: a usage error (exit 2) whose message names `flag`.
fn refused(args: &[&str], flag: &str) -> String {
    let err = match parse(args) {
        Ok(cli) => panic!("{args:?} was accepted: {:?}", cli.command),
        Err(e) => e,
    };
    assert_eq!(err.exit_code(), 2, "{args:?}: a usage error");
    let message = err.to_string();
    assert!(message.contains(flag), "{args:?}: names {flag}: {message}");
    message
}

fn rate_of(args: &[&str]) -> f64 {
    match parse(args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .command
    {
        Command::Replay { bulk, .. } | Command::Discard { bulk, .. } => bulk.rate,
        other => panic!("{other:?}"),
    }
}

#[test]
fn dlq_rejects_a_rate_that_is_not_a_positive_finite_number() {
    for verb in ["replay", "discard"] {
        for rate in [
            "1e-20", "0", "-0", "-1", "-5", "NaN", "nan", "inf", "-inf", "infinity", "1e309",
            "0x10", "", " ", "five", "5/s", "1e-4", "0.0009",
        ] {
            let flag = format!("--rate={rate}");
            let message = refused(&[verb, "--group", "1", "--reason", "r", &flag], "--rate");
            assert!(!message.contains("panicked"), "{message}");
        }
        // A negative number after a space is taken for a flag: still a usage error.
        refused(&[verb, "--group", "1", "--rate", "-1"], "-1");
    }
}

#[test]
fn dlq_rejects_a_rate_above_the_api_throttle() {
    for rate in ["20.000001", "21", "100", "1e6", "1.7976931348623157e308"] {
        let message = refused(&["replay", "--group", "1", "--rate", rate], "--rate");
        assert!(message.contains("20"), "says the throttle: {message}");
    }
    assert_eq!(
        rate_of(&["replay", "--group", "1", "--rate", "20"]),
        MAX_RATE
    );
    assert_eq!(
        rate_of(&["discard", "--group", "1", "--rate", "0.001"]),
        0.001
    );
    assert_eq!(rate_of(&["replay", "--group", "1"]), 5.0, "the default");
}

#[test]
fn dlq_rejects_limits_and_group_ids_outside_what_the_api_takes() {
    for limit in [
        "0",
        "-1",
        "10001",
        "18446744073709551616",
        "1e3",
        "ten",
        "2.5",
        "",
    ] {
        refused(
            &["list", "--queue", "q", &format!("--limit={limit}")],
            "--limit",
        );
    }
    for limit in ["0", "201", "99999999999999999999", "-3"] {
        refused(&["groups", &format!("--limit={limit}")], "--limit");
    }
    for id in ["0", "-1", "9223372036854775808", "1e3", "x", ""] {
        refused(&["list", &format!("--group={id}")], "--group");
        refused(
            &["replay", &format!("--group={id}"), "--dry-run"],
            "--group",
        );
        refused(&["group", "--", id], "ID");
    }
    for time in [
        "yesterday",
        "2026-13-01T00:00:00Z",
        "+275760-09-13T00:00:00Z",
        "2026-11-30",
    ] {
        refused(
            &["replay", "--queue", "q", &format!("--before={time}")],
            "--before",
        );
        refused(&["list", &format!("--from={time}")], "--from");
    }
    assert!(parse(&["list", "--limit", "10000"]).is_ok());
    assert!(parse(&["groups", "--limit", "200"]).is_ok());
    assert!(parse(&["group", "9223372036854775807"]).is_ok());
    assert!(parse(&["list", "--from", "2026-11-30T08:00:00+01:00"]).is_ok());
}

#[test]
fn dlq_rejects_a_reason_the_api_would_refuse_before_it_asks() {
    let long = "x".repeat(1001);
    for reason in [
        "\u{1}\u{2}\u{3}\u{7}",
        "   ",
        "",
        "a\u{0}b",
        "ok \u{1b}[2J",
        long.as_str(),
    ] {
        for verb in ["replay", "discard"] {
            refused(&[verb, "--group", "1", "--reason", reason], "--reason");
        }
    }
    match parse(&["discard", "--group", "1", "--reason", "  fixed by hand\n"])
        .unwrap()
        .command
    {
        Command::Discard { reason, .. } => assert_eq!(reason.as_deref(), Some("fixed by hand")),
        other => panic!("{other:?}"),
    }
}
