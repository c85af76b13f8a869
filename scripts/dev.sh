#!/usr/bin/env bash
# The consumer author's dev loop (docs/consumers.md, section 6):
#
#   bash scripts/dev.sh <consumer>                 start PostgreSQL and the local SQS API if needed,
#                                                  migrate the dev database (core, then every
#                                                  consumer's schema), create the consumer's dev
#                                                  queue, and run it under `cargo lambda watch`
#                                                  (rebuilt on every save); Ctrl-C stops it
#   bash scripts/dev.sh send <consumer> [valid|duplicate|poison|failing|all] [--payload JSON]
#                                                  in a second terminal: send it jobs through its
#                                                  queue and show what became of each (fence,
#                                                  letter, rows added to its tables)
#
# <consumer> is its name (award-points), package or binary. The dev database is jobs_dev
# (DEV_DATABASE), kept between runs; cargo lambda watch listens on 127.0.0.1:9000 (DEV_PORT).
# The local SQS API this command starts stops with it (one already running is left alone).
# Builds go where cargo puts them (CARGO_TARGET_DIR). Logs written inside the checkout must match
# .gitignore (*.log), or cargo lambda watch rebuilds on every line they get.
source "$(dirname "$0")/lib.sh"

DEV_DATABASE=${DEV_DATABASE:-jobs_dev}
DEV_PORT=${DEV_PORT:-9000}

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

# PostgreSQL, the dev database, the local SQS API (left running for the other terminal) and the
# dev tool; exports DATABASE_URL and the AWS variables.
setup() {
  command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
  ensure_postgres
  DATABASE_URL=$(database_url_for "$DEV_DATABASE")
  export DATABASE_URL
  # Started here, stopped here: the other terminal's command finds it while this one runs.
  if sqs_api_up "http://127.0.0.1:$SQS_PORT"; then
    ensure_sqs_api detached
  else
    ensure_sqs_api detached
    on_exit 'kill "$(cat "$TOOLS/moto.pid")" 2>/dev/null && note "stopped the local SQS API it started"'
  fi
  step "Building the dev tool (cargo build -p e2e --bin dev)"
  cargo build --quiet -p e2e --bin dev || die "the dev tool did not build"
}

watch() {
  local consumer=$1 env
  setup
  step "Migrating $DEV_DATABASE and creating the dev queue of $consumer"
  env=$("$TARGET"/debug/dev prepare "$consumer") || die "could not prepare the dev loop for $consumer"
  eval "$env"
  note "queue: $DEV_QUEUE_URL"
  note "database: ${DATABASE_URL%%@*}@…/$DEV_DATABASE"
  ensure_cargo_lambda
  step "Running $consumer under cargo lambda watch on 127.0.0.1:$DEV_PORT (rebuilt on every save; Ctrl-C stops it)"
  note "send it jobs from another terminal: bash scripts/dev.sh send $consumer all"
  # Not exec'd: the SQS API this command started stops when the watch does.
  cargo lambda watch -A 127.0.0.1 -P "$DEV_PORT" || true
}

send() {
  [ $# -ge 1 ] || usage
  setup
  step "Sending to $1 through its dev queue (cargo lambda watch on 127.0.0.1:$DEV_PORT)"
  "$TARGET"/debug/dev send --watch "127.0.0.1:$DEV_PORT" "$@" || die "not every job settled (see above)"
}

case "${1:-}" in
  "" | -h | --help) usage ;;
  send) shift; send "$@" ;;
  *) [ $# -eq 1 ] || usage; watch "$1" ;;
esac
