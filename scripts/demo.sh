#!/usr/bin/env bash
# The main job on a local default: PostgreSQL, a local SQS API (moto), every consumer of the
# workspace and its DLQ ingester running as Lambda binaries fed like the event source mapping,
# and a sample workload with a summary. Pass --check to exit non-zero when an outcome differs.
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
ensure_postgres
ensure_sqs_api
step "A fresh database for the demo (jobs_demo), so every run gives the same summary"
psql "$DATABASE_URL" -qc 'DROP DATABASE IF EXISTS jobs_demo WITH (FORCE)' >/dev/null || die "could not drop jobs_demo"
DATABASE_URL=$(database_url_for jobs_demo)
export DATABASE_URL
step "Building the functions and the demo (cargo build --bins: each consumer's own binary too)"
cargo build --bins --quiet || die "the build failed"
step "Running the demo workload against database jobs_demo"
"$TARGET"/debug/demo "$@" || die "the demo failed"
