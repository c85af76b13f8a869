//! Issue 22, item 7: every number, id and reason `dlq` takes is checked by clap before anything
//! is asked of the API, with a message naming the flag (`--rate 1e-20` used to pass the check and
//! panic when a run started; bulk commands take no rate since they start one server-side
//! operation, and refuse the flag).

use clap::Parser;
use dlq::args::{Cli, Command, LetterId};

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

#[test]
fn bulk_commands_take_no_rate_and_name_operations_by_id_or_prefix() {
    for verb in ["replay", "discard"] {
        refused(&[verb, "--group", "1", "--rate", "5"], "--rate");
    }
    match parse(&["replay", "--group", "1", "--detach", "--progress", "lines"])
        .unwrap()
        .command
    {
        Command::Replay { bulk, .. } => assert!(bulk.detach && !bulk.dry_run),
        other => panic!("{other:?}"),
    }
    for id in ["", "x", "123", "not-an-id", "12345678-zzzz"] {
        refused(&["operation", "--", id], "operation id");
        refused(&["cancel", "--reason", "r", "--", id], "operation id");
    }
    refused(&["cancel", "481e82ee"], "--reason");
    match parse(&["operation", "481E82EE", "--follow"])
        .unwrap()
        .command
    {
        Command::Operation { id, follow, .. } => {
            assert_eq!(id, LetterId::Prefix("481e82ee".into()));
            assert!(follow);
        }
        other => panic!("{other:?}"),
    }
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
