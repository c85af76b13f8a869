#!/usr/bin/env bash
# Benchmarks (not tests): ratios against a baseline measured in the same run, medians of
# alternating rounds. Builds with the `perf` profile (optimized, quick to link).
# `bash scripts/bench.sh [harness] [latency] [pooler] [sweep] [api] [scale] [storm] [operations]` runs
# those parts (default: all).
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed"
ensure_postgres
# jobs_bench is kept between runs (its million letters take a while to seed), unless it was
# made before core's migrations had a tracking table of their own (core._sqlx_migrations).
bench_url="${DATABASE_URL%/*}/jobs_bench"
if can_connect "$bench_url" && [ -z "$(psql "$bench_url" -Atqc "SELECT to_regclass('core._sqlx_migrations')")" ]; then
  note "jobs_bench predates core's own migration table: making it anew"
  psql "$DATABASE_URL" -qc 'DROP DATABASE IF EXISTS jobs_bench WITH (FORCE)' >/dev/null || die "could not drop jobs_bench"
fi
DATABASE_URL=$(database_url_for jobs_bench)
export DATABASE_URL
ensure_sqs_api
ensure_pgbench
PARTS=${*:-harness latency pooler sweep api scale storm operations}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# The deployed consumer binary (`consumer`, package consumer) beside them, for the storm part.
BINS=(bench-harness bench-latency bench-sweep bench-api bench-scale bench-storm bench-operations local-consumer local-dlq-ingester consumer)
BIN_ARGS=$(printf -- '--bin %s ' "${BINS[@]}")
step "Building the benchmarks (cargo build --profile perf -p e2e -p consumer $BIN_ARGS)"
# shellcheck disable=SC2086 # one word per flag and name
cargo build --quiet --profile perf -p e2e -p consumer $BIN_ARGS || die "the build failed"
if part harness; then
  step "Harness vs pgbench: per job at c = 1, 8, 32; batch mode at c = 8; the consumer's peak memory"
  "$TARGET"/perf/bench-harness || die "the harness benchmark failed"
fi
if part latency; then
  step "At RDS latency: a throwaway primary with a synchronous standby, a latency proxy (0, 0.5, 1, 2 ms) on both links; pgbench vs the harness, round trips per job (~13 min)"
  "$TARGET"/perf/bench-latency || die "the latency benchmark failed"
fi
if part pooler; then
  ensure_pgbouncer
  export PGBOUNCER
  step "Through PgBouncer in transaction mode at 1 ms RTT: 64 clients over 8 server connections vs 8 clients direct, pgbench and the harness (~2 min)"
  "$TARGET"/perf/bench-latency pooler || die "the pooler benchmark failed"
fi
if part sweep; then
  step "Sweeper: delete rate vs a raw batched DELETE, consumers with vs without a sweep"
  "$TARGET"/perf/bench-sweep || die "the sweep benchmark failed"
fi
if part api; then
  step "Dead-letter API: p50/p95 at 1,000,000 letters (seeded once into jobs_bench)"
  "$TARGET"/perf/bench-api || die "the API benchmark failed"
fi
if part scale; then
  step "The fence table at 2 and 20 million live fences (database jobs_bench_scale, seeded anew: a few minutes, ~4 GB)"
  DATABASE_URL=$(database_url_for jobs_bench_scale) "$TARGET"/perf/bench-scale || die "the scale benchmark failed"
fi
if part storm; then
  step "A storm in one failure group: valid, all-poison and one-in-ten workloads through 8 consumer processes, both commit modes, and the DLQ ingester; pgbench for context; the same at 1 ms RTT with a synchronous standby (database jobs_bench_storm, emptied before every run; ~12 min)"
  DATABASE_URL=$(database_url_for jobs_bench_storm) "$TARGET"/perf/bench-storm || die "the storm benchmark failed"
fi
if part operations; then
  step "Bulk operations on a storm: 1,000,000 letters of one group discarded, 100,000 replayed to the local SQS API, API reads timed meanwhile (database jobs_bench_ops, seeded anew; ~10 min)"
  psql "$DATABASE_URL" -qc 'DROP DATABASE IF EXISTS jobs_bench_ops WITH (FORCE)' >/dev/null || die "could not drop jobs_bench_ops"
  # A local SQS API of its own, started empty: moto slows down as it holds more queues and
  # messages, and the figure is the worker's, not what other runs left in moto.
  (SQS_PORT=9399 ensure_sqs_api && DATABASE_URL=$(database_url_for jobs_bench_ops) "$TARGET"/perf/bench-operations) ||
    die "the operations benchmark failed"
fi
step "All figures: target/bench/results.json"
python3 - <<'PY' || die "could not merge the results"
import json, os
parts = {name: json.load(open(f"target/bench/{name}.json"))
         for name in ("harness", "latency", "pooler", "sweep", "api", "scale", "storm", "operations") if os.path.exists(f"target/bench/{name}.json")}
json.dump(parts, open("target/bench/results.json", "w"), indent=2)
PY
