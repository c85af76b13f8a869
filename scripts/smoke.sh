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
  eval "$(bash "$(dirname "$0")/stack.sh" env)"
  export SMOKE_QUEUE_URL=${SMOKE_QUEUE_URL:-$AWARD_POINTS_QUEUE_URL}
  step "Smoke-testing the local stack ($DLQ_API_URL)"
else
  stack=$(python3 -c 'import sys, tomllib; print(tomllib.load(open("samconfig.toml", "rb"))[sys.argv[1]]["deploy"]["parameters"]["stack_name"])' "$target" 2>/dev/null) \
    || die "samconfig.toml has no [$target.deploy.parameters] stack_name"
  region=$(python3 -c 'import sys, tomllib; print(tomllib.load(open("samconfig.toml", "rb"))[sys.argv[1]]["deploy"]["parameters"].get("region", ""))' "$target")
  [ -n "${DLQ_TOKEN:-}" ] || die "DLQ_TOKEN is not set: a token with core.dead_letters.read and .discard (docs/operations.md, Getting a token)"
  ensure_sam_cli
  step "Reading the outputs of $stack (sam list stack-outputs)"
  outputs=$(sam list stack-outputs --stack-name "$stack" ${region:+--region "$region"} --output json) \
    || die "could not read the outputs of $stack: is it deployed, and are your AWS credentials for its account?"
  output() { python3 -c 'import json, sys; print(next(o["OutputValue"] for o in json.load(sys.stdin) if o["OutputKey"] == sys.argv[1]))' "$1" <<<"$outputs"; }
  export DLQ_API_URL=${DLQ_API_URL:-$(output DeadLetterApiUrl)}
  export SMOKE_QUEUE_URL=${SMOKE_QUEUE_URL:-$(output AwardPointsJobQueueUrl)}
  export AWS_REGION=${AWS_REGION:-$region}
  step "Smoke-testing $stack ($DLQ_API_URL)"
fi
target/debug/smoke "$@" || die "the smoke test failed (see above)"
