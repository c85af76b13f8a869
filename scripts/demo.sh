#!/usr/bin/env bash
# The main job on a local default: PostgreSQL, the migrations, and a sample workload through
# the harness and the reference consumer, with a summary. Pass --check to exit non-zero when
# an outcome differs from the expected one.
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
ensure_postgres
DATABASE_URL=$(database_url_for jobs_demo)
export DATABASE_URL
step "Building and running the demo against database jobs_demo"
cargo run --quiet -p e2e --bin demo -- "$@" || die "the demo failed"
