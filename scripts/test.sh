#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test of the workspace against real
# PostgreSQL (each database test gets a fresh migrated database of its own) and a real SQS API
# (moto's server, started here and stopped at exit).
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
step "Checking disk space"
ensure_disk_space 8
ensure_postgres
ensure_sqs_api

step "Checking formatting (cargo fmt --check)"
cargo fmt --all -- --check || die "code is not formatted: run cargo fmt --all"

step "Checking sqlx's query data (.sqlx/) against the SQL (cargo sqlx prepare --check)"
sqlx_prepare --check ||
  die "the query data in .sqlx/ does not match the SQL of the query macros (or the build failed: see above); write it again with
    bash -c 'source scripts/lib.sh && ensure_postgres && sqlx_prepare'
  and commit .sqlx/"

# template.yaml and the nested templates its consumers use (templates/), each a template of its own.
TEMPLATES=(template.yaml templates/*.yaml)
ensure_cfn_lint
step "Linting ${TEMPLATES[*]} (cfn-lint)"
"$TOOLS/lint-venv/bin/cfn-lint" "${TEMPLATES[@]}" || die "cfn-lint found problems in ${TEMPLATES[*]}"
ensure_sam_cli
for t in "${TEMPLATES[@]}"; do
  step "Validating $t (sam validate --lint)"
  "$TOOLS/sam-venv/bin/sam" validate --lint --region us-east-1 --template "$t" || die "sam validate rejected $t"
done

step "Linting (cargo clippy --all-targets -- -D warnings)"
cargo clippy --workspace --all-targets --quiet -- -D warnings || die "clippy found problems"

ensure_pg_server_binaries
ensure_pgbouncer
ensure_cargo_lambda # the dev loop's test runs the consumer under cargo lambda watch
export PGBOUNCER
step "Building the tests (cargo test --workspace --no-run)"
log=$(mktemp) artifacts=$(mktemp)
on_exit 'rm -f "$log" "$artifacts"'
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$artifacts" ||
  die "the tests did not build (see above)"
# Most of the suite waits on PostgreSQL, the SQS API and the processes it starts: two test
# binaries side by side take about the time of one (TEST_LANES=1 runs them one at a time).
LANES=${TEST_LANES:-2}
step "Running the tests against ${DATABASE_URL%%@*}@…, $LANES test binaries at a time (scripts/run_tests.py), then the doc tests"
note "the chaos soak restarts a throwaway PostgreSQL cluster of its own, never this one"
status=0
python3 scripts/run_tests.py "$LANES" <"$artifacts" 2>&1 | tee "$log" || status=$?
cargo test --workspace --doc 2>&1 | tee -a "$log" || status=$?
# One closing line for the whole suite (cargo's own last line is the empty doc-test run).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "\ntests: %d passed, %d failed\n", p, f }' "$log"
[ "$status" = 0 ] || die "tests failed (see above)"

# The guarantee tests again, through a transaction pooler as deployed (RDS Proxy multiplexes
# connections at transaction boundaries): every test's database, harness, scheduled run and API
# on a PgBouncer in transaction mode, where nothing of a session survives its transaction.
POOLER_TESTS=(-p shared -p e2e --lib --test acceptance --test batch --test conflicts
              --test letter_locks --test schema_guards --test sweeper --test true_records --test fifo
              --test identity --test families --test lanes --test outside_attacks --test model_findings
              --test ac2_crash --test faults --test boundary --test scheduled --test api)
step "Running the guarantee tests through PgBouncer in transaction mode (cargo test ${POOLER_TESTS[*]}), $LANES test binaries at a time"
cargo build --quiet -p e2e --bin through-pooler || die "could not build through-pooler"
cargo test "${POOLER_TESTS[@]}" --no-run --message-format=json-render-diagnostics >"$artifacts" ||
  die "the guarantee tests did not build (see above)"
status=0
"$TARGET"/debug/through-pooler -- python3 scripts/run_tests.py "$LANES" "$artifacts" 2>&1 | tee "$log" ||
  status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "\ntests through the pooler: %d passed, %d failed\n", p, f }' "$log"
[ "$status" = 0 ] || die "tests failed through the pooler (see above)"
