#!/usr/bin/env bash
# The chaos soak's long form: `bash scripts/soak.sh [jobs] [seed]` (default 10,000 jobs) through
# the local SQS API and the real consumer binaries, with SIGKILLs, a PostgreSQL restart (when
# this user may restart the local cluster; otherwise every connection is terminated) and lost
# SQS deletes; then the invariant checker. Uses a fresh database, jobs_soak. Exits non-zero if
# the promise broke. (The test command runs a 2,000-job form of it.)
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed"
ensure_postgres
ensure_sqs_api
step "A fresh database for the soak (jobs_soak)"
psql "$DATABASE_URL" -qc 'DROP DATABASE IF EXISTS jobs_soak WITH (FORCE)' >/dev/null || die "could not drop jobs_soak"
DATABASE_URL=$(database_url_for jobs_soak)
export DATABASE_URL
SOAK_PG_RESTART_CMD=$(local_pg_restart_command)
export SOAK_PG_RESTART_CMD
step "Building the soak and the functions (cargo build --profile perf -p e2e)"
cargo build --quiet --profile perf -p e2e --bin soak --bin local-consumer --bin local-dlq-ingester || die "the build failed"
step "Soaking (function logs in \$TMPDIR/job-harness-soak/)"
target/perf/soak "${1:-10000}" "${2:-1}" || die "the soak found a broken invariant (see above)"
