#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes, as `cargo test` would run them one after another.

Reads cargo's JSON messages (`cargo test --no-run --message-format=json`) on stdin, and runs
each test executable from its package's directory (as cargo does), `--lanes` at a time, the
slowest known first. Most of the suite waits on PostgreSQL, the SQS API and the processes it
starts rather than on the CPU, so two binaries side by side take about the time of one.

Each binary's output is printed whole when it ends (never interleaved), under cargo's own
"Running" line, so the suite's summary reads it as it reads cargo's. Exits 1 if any binary
failed (every binary runs: cargo's --no-fail-fast), naming them.

Usage: cargo test --workspace --no-run --message-format=json | python3 run_tests.py LANES
       python3 run_tests.py LANES MESSAGES_FILE
"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from threading import Lock

# Measured in CI (seconds, 2026-12-07): the long binaries start first, so the last one to end
# is a short one.
SLOW_FIRST = [
    "fifo", "soak", "operations_attacks", "demo_check", "consumers_guide", "sqs_path", "faults",
    "record_letters_fast_path_attacks", "traces_attacks", "intake_attacks", "operator_tool",
    "paging_attacks", "scheduled",
]


def binaries(messages):
    """(name, executable, package directory) of each test executable cargo built."""
    found = []
    for line in messages:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        found.append((target["name"], message["executable"],
                      os.path.dirname(message["manifest_path"]),
                      os.path.relpath(target["src_path"], os.path.dirname(message["manifest_path"]))))
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    return sorted(found, key=lambda b: rank.get(b[0], len(SLOW_FIRST)))


def main():
    lanes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    if len(sys.argv) > 2:
        with open(sys.argv[2], encoding="utf-8") as messages:
            tests = binaries(messages)
    else:
        tests = binaries(sys.stdin)
    if not tests:
        print("no test executables in cargo's messages", file=sys.stderr)
        return 1
    printing, failed = Lock(), []

    def run(test):
        name, executable, directory, source = test
        started = time.monotonic()
        env = dict(os.environ, CARGO_MANIFEST_DIR=directory)
        done = subprocess.run([executable], cwd=directory, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with printing:
            print(f"     Running {source} ({os.path.relpath(executable)}, "
                  f"{time.monotonic() - started:.0f} s in a lane of {lanes})", flush=True)
            sys.stdout.buffer.write(done.stdout)
            sys.stdout.flush()
            if done.returncode != 0:
                failed.append(f"{source} (exit {done.returncode})")

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        list(pool.map(run, tests))
    if failed:
        print("\ntest binaries that failed: " + ", ".join(failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
