#!/usr/bin/env bash
# The chaos soak's long form: `bash scripts/soak.sh [jobs] [seed] [MODE]` (default 10,000 jobs,
# MODE `all`: per-job, batch, fifo-per-job and fifo-batch one after the other; `both`: the first
# two; or one of them; `fifo-…` on a FIFO queue whose per-group order is checked too) through
# the local SQS API and the real consumer binaries, with SIGKILLs, a restart of a throwaway
# PostgreSQL cluster of its own (initdb in a temporary directory; never the machine's) and lost
# SQS deletes; then the invariant checker. Exits non-zero if the promise broke. (The test
# command runs a 1,200-job form of it, 600 on FIFO.)
#
# `bash scripts/soak.sh model [cases] [seed]`: the model-based test's long form instead
# (`shared/tests/model.rs`, issue 34): `cases` generated histories (default 2,000) against the
# real harness on the PostgreSQL of `DATABASE_URL` (a database of its own, dropped after),
# picked by `seed` (default: an unseen one, printed, so a failure can be run again). A broken
# promise prints the history shrunk to its minimum. (The test command runs 24.)
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed"
if [ "${1:-}" = model ]; then
  ensure_postgres
  ensure_sqs_api # the histories' bulk replays send to it
  cases=${2:-2000}
  seed=${3:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  step "Model-based histories: $cases of them, seed $seed (cargo test -p shared --test model)"
  MODEL_CASES=$cases MODEL_SEED=$seed cargo test --quiet -p shared --test model \
    model_histories_keep_the_promises -- --nocapture ||
    die "a model history broke a promise (its minimal history is above); again: bash scripts/soak.sh model $cases $seed"
  exit 0
fi
ensure_pg_server_binaries
ensure_sqs_api
step "Building the soak and the functions (cargo build --profile perf -p e2e)"
cargo build --quiet --profile perf -p e2e --bin soak --bin local-consumer --bin local-dlq-ingester --bin local-scheduled || die "the build failed"
modes=${3:-all}
[ "$modes" = both ] && modes="per-job batch"
[ "$modes" = all ] && modes="per-job batch fifo-per-job fifo-batch"
for mode in $modes; do
  step "Soaking, $mode commits (function logs in \$TMPDIR/job-harness-soak/)"
  "$TARGET"/perf/soak "${1:-10000}" "${2:-1}" "$mode" || die "the soak ($mode) found a broken invariant (see above)"
done
