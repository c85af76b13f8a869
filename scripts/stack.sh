#!/usr/bin/env bash
# The local stack, kept running for curl and the dlq tool:
#
#   bash scripts/stack.sh up       start it (PostgreSQL, the local SQS API, every consumer of the
#                                  workspace and its DLQ ingester fed like Lambda's event sources,
#                                  the scheduled function every minute, the dead-letter API over
#                                  HTTP on 127.0.0.1:8787 behind a local gateway with dev tokens)
#   eval "$(bash scripts/stack.sh env)"   DLQ_API_URL, DLQ_TOKEN (every scope), DLQ_READ_TOKEN,
#                                  the queues' URLs, DATABASE_URL and the AWS variables
#   bash scripts/stack.sh status   whether it runs, and where
#   bash scripts/stack.sh down     stop it (and the SQS API, if it started it)
#   bash scripts/stack.sh reset    stop it and make its database (jobs_local) anew
#
# The database jobs_local (LOCAL_DATABASE) is kept between runs; the queues live in the SQS API's
# memory. GATEWAY_ADDR and LOCAL_QUEUE_NAME (the queues' base name) move it beside another one.
source "$(dirname "$0")/lib.sh"

STATE=$TOOLS/stack
PID_FILE=$STATE/local-stack.pid
ENV_FILE=$STATE/stack.env
GATEWAY_ADDR=${GATEWAY_ADDR:-127.0.0.1:8787}
LOCAL_DATABASE=${LOCAL_DATABASE:-jobs_local}

running() { [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

up() {
  if running; then
    step "The local stack already runs (pid $(cat "$PID_FILE"))"
    env_hint
    return
  fi
  command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
  mkdir -p "$STATE"
  ensure_postgres
  DATABASE_URL=$(database_url_for "$LOCAL_DATABASE")
  export DATABASE_URL
  ensure_sqs_api detached
  # Every binary of the workspace: each consumer's own (the stack runs them all), the other
  # functions, the local stack and the dlq tool.
  step "Building the functions, the local stack and the dlq tool (cargo build --bins)"
  cargo build --quiet --bins || die "the build failed"
  step "Starting the local stack (log: .tools/stack/local-stack.log; function logs: .tools/stack/logs/)"
  rm -f "$ENV_FILE"
  LOCAL_STACK_DIR=$STATE GATEWAY_ADDR=$GATEWAY_ADDR \
    setsid nohup "$TARGET"/debug/local-stack >"$STATE/local-stack.log" 2>&1 < /dev/null &
  echo $! > "$PID_FILE"
  for _ in $(seq 1 120); do
    [ -f "$ENV_FILE" ] && break
    running || die "the local stack stopped at start; see .tools/stack/local-stack.log:
$(tail -n 20 "$STATE/local-stack.log")"
    sleep 0.5
  done
  [ -f "$ENV_FILE" ] || die "the local stack did not come up within 60 s; see .tools/stack/local-stack.log"
  note "$(tail -n 1 "$STATE/local-stack.log")"
  env_hint
}

env_hint() {
  cat <<EOF

    Use it:
      eval "\$(bash scripts/stack.sh env)"
      $TARGET/debug/dlq groups                      # or: cargo run -q -p dlq -- groups
      curl -s -H "Authorization: Bearer \$DLQ_TOKEN" "\$DLQ_API_URL/v1/core/dead-letters?status=pending_review"
      bash scripts/smoke.sh local                  # a canary job to its fence, a poison one to its letter, the API
    Stop it: bash scripts/stack.sh down
EOF
}

down() {
  if running; then
    step "Stopping the local stack (pid $(cat "$PID_FILE"))"
    kill -TERM "$(cat "$PID_FILE")" 2>/dev/null || true
    for _ in $(seq 1 40); do running || break; sleep 0.25; done
    running && kill -KILL "$(cat "$PID_FILE")" 2>/dev/null || true
  else
    step "The local stack is not running"
  fi
  rm -f "$PID_FILE" "$ENV_FILE"
  if [ -f "$TOOLS/moto.pid" ]; then
    step "Stopping the local SQS API it started"
    kill "$(cat "$TOOLS/moto.pid")" 2>/dev/null || true
    rm -f "$TOOLS/moto.pid"
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status)
    if running; then
      step "The local stack runs (pid $(cat "$PID_FILE")); API on http://$GATEWAY_ADDR"
      tail -n 5 "$STATE/local-stack.log" | sed 's/^/    /'
    else
      step "The local stack is not running (start it: bash scripts/stack.sh up)"
      exit 1
    fi
    ;;
  env)
    running && [ -f "$ENV_FILE" ] || die "the local stack is not running (start it: bash scripts/stack.sh up)"
    cat "$ENV_FILE"
    ;;
  reset)
    down
    ensure_postgres
    step "Making the local stack's database anew ($LOCAL_DATABASE)"
    psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$LOCAL_DATABASE\" WITH (FORCE)" >/dev/null ||
      die "could not drop $LOCAL_DATABASE"
    ;;
  *) usage ;;
esac
