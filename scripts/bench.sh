#!/usr/bin/env bash
# Benchmarks (not tests): ratios against a baseline measured in the same run, medians of
# alternating rounds. Builds with the `perf` profile (optimized, quick to link).
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed"
ensure_postgres
DATABASE_URL=$(database_url_for jobs_bench)
export DATABASE_URL
ensure_sqs_api
step "Building the benchmarks (cargo build --profile perf -p e2e --bin bench-sweep --bin bench-api)"
cargo build --quiet --profile perf -p e2e --bin bench-sweep --bin bench-api || die "the build failed"
step "Sweeper: delete rate vs a raw batched DELETE, consumers with vs without a sweep"
target/perf/bench-sweep || die "the sweep benchmark failed"
step "Dead-letter API: p50/p95 at 1,000,000 letters (seeded once into jobs_bench)"
target/perf/bench-api || die "the API benchmark failed"
