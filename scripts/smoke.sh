#!/usr/bin/env bash
# The deployer's smoke test (docs/deploy.md): a canary job through the real job queue to its
# fence, a poison job to its letter (then discarded, with a reason), the operators' API read with
# a token. Through the queue and the API only, never the database.
#
#   DLQ_TOKEN=… bash scripts/smoke.sh <environment>   a deployed stack: its samconfig.toml section
#                                                      (staging, production) names the stack; its
#                                                      outputs give the API and the queue. The token
#                                                      needs core.dead_letters.read and .discard
#   bash scripts/smoke.sh local                        the local stack (bash scripts/stack.sh up)
#
# Any further arguments go to the smoke tool: --consumer redeem-reward --queue-url … --payload
# '{…}' (the canary's effect is real: make it harmless), --no-letter (no poison job, no incident).
source "$(dirname "$0")/lib.sh"

[ $# -ge 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
target=$1; shift
command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
step "Building the smoke tool (cargo build -p e2e --bin smoke)"
cargo build --quiet -p e2e --bin smoke || die "the smoke tool did not build"

if [ "$target" = local ]; then
  [ -f "$TOOLS/stack/stack.env" ] || die "the local stack is not running: bash scripts/stack.sh up"
  eval "$(bash scripts/stack.sh env)"
  export SMOKE_QUEUE_URL=${SMOKE_QUEUE_URL:-$AWARD_POINTS_QUEUE_URL}
  step "Smoke-testing the local stack ($DLQ_API_URL)"
else
  [ -n "${DLQ_TOKEN:-}" ] || die "DLQ_TOKEN is not set: a token with core.dead_letters.read and .discard (docs/operations.md, Getting a token)"
  ensure_sam_cli
  # samconfig.toml read with the SAM CLI venv's Python (3.11+, tomllib), whatever python3 is.
  config() {
    "$TOOLS/sam-venv/bin/python" - "$target" "$1" <<'PY'
import sys, tomllib
section = tomllib.load(open("samconfig.toml", "rb")).get(sys.argv[1])
if section is None:
    sys.exit(f"samconfig.toml has no [{sys.argv[1]}.deploy.parameters]")
print(section["deploy"]["parameters"].get(sys.argv[2], ""))
PY
  }
  stack=$(config stack_name) || die "no environment $target in samconfig.toml"
  [ -n "$stack" ] || die "samconfig.toml's [$target.deploy.parameters] has no stack_name"
  region=$(config region) || die "could not read samconfig.toml"
  step "Reading the outputs of $stack (sam list stack-outputs)"
  outputs=$(sam list stack-outputs --stack-name "$stack" ${region:+--region "$region"} --output json) \
    || die "could not read the outputs of $stack: is it deployed, and are your AWS credentials for its account?"
  output() {
    "$TOOLS/sam-venv/bin/python" -c 'import json, sys; print(next((o["OutputValue"] for o in json.load(sys.stdin) if o["OutputKey"] == sys.argv[1]), ""))' "$1" <<<"$outputs"
  }
  api=${DLQ_API_URL:-$(output DeadLetterApiUrl)}
  queue=${SMOKE_QUEUE_URL:-$(output AwardPointsJobQueueUrl)}
  [ -n "$api" ] || die "$stack has no output DeadLetterApiUrl"
  [ -n "$queue" ] || die "$stack has no output AwardPointsJobQueueUrl (give --queue-url for another consumer)"
  export DLQ_API_URL=$api SMOKE_QUEUE_URL=$queue
  # The stack's region, where the queue is (samconfig's wins over the shell's).
  if [ -n "$region" ]; then export AWS_REGION=$region; fi
  step "Smoke-testing $stack ($DLQ_API_URL)"
fi
"$TARGET"/debug/smoke "$@" || die "the smoke test failed (see above)"
