#!/usr/bin/env bash
# Helpers for the README's commands: say what is happening, and bring up what they need.
set -euo pipefail

# Commands to run when the calling script exits, however it exits (one EXIT trap for all).
CLEANUP=()
on_exit() { CLEANUP+=("$1"); }
run_cleanup() { local c; for c in "${CLEANUP[@]}"; do eval "$c" || true; done; }
trap run_cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

# Where cargo puts what it builds: CARGO_TARGET_DIR if the user set one, as cargo does.
TARGET=${CARGO_TARGET_DIR:-target}
note() { printf '    %s\n' "$*"; }
die()  { printf '\nFAILED: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $*"; fi
}

apt_install() {
  step "Installing $* from Debian's packages"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null || die "apt-get install $* failed"
}

# The suite needs room for two debug builds of the workspace (about 6 GB with the lean profile);
# a full disk shows up as an LLVM "IO failure" deep in a test, so say it first.
ensure_disk_space() {
  local need_gb=${1:-8} dir=${CARGO_TARGET_DIR:-.} free_gb
  mkdir -p "$dir"
  free_gb=$(df -P -BG "$dir" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
  note "free disk under $dir: ${free_gb} GB (the builds need about ${need_gb} GB)"
  [ "$free_gb" -ge "$need_gb" ] || die "only ${free_gb} GB free under $dir; the builds need about ${need_gb} GB (free space, or set CARGO_TARGET_DIR to a larger disk)"
}

can_connect() { psql "$1" -Atqc 'SELECT 1' >/dev/null 2>&1; }

# pgbench, the benchmarks' baseline: Debian ships it with the server package.
ensure_pgbench() {
  pgbench --version >/dev/null 2>&1 && return
  apt_install postgresql
  pgbench --version >/dev/null 2>&1 || die "pgbench is still missing after installing postgresql"
}

# Sets DATABASE_URL to a PostgreSQL server we can create databases on:
# the one in DATABASE_URL if set; else 127.0.0.1:5432 with trust auth; else the local
# cluster, started (and installed first if missing), with a password set for TCP.
ensure_postgres() {
  command -v psql >/dev/null || apt_install postgresql-client
  if [ -n "${DATABASE_URL:-}" ]; then
    step "Using PostgreSQL from DATABASE_URL"
    can_connect "$DATABASE_URL" || die "cannot connect to DATABASE_URL (${DATABASE_URL%%@*}@…)"
    return
  fi
  local trust=postgres://postgres@127.0.0.1:5432/postgres
  local password=postgres://postgres:postgres@127.0.0.1:5432/postgres
  step "Looking for PostgreSQL on 127.0.0.1:5432"
  for url in "$trust" "$password"; do
    if can_connect "$url"; then export DATABASE_URL=$url; note "found it"; return; fi
  done
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    apt_install postgresql
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  step "Starting PostgreSQL $version (cluster main)"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  pg_isready -q -h 127.0.0.1 -p 5432 || die "PostgreSQL $version did not start; see /var/log/postgresql/"
  if can_connect "$trust"; then export DATABASE_URL=$trust; return; fi
  note "TCP needs a password here: setting one for the local postgres user"
  as_root runuser -u postgres -- psql -qc "ALTER USER postgres PASSWORD 'postgres'" >/dev/null ||
    die "could not set the postgres user's password"
  can_connect "$password" || die "cannot connect to PostgreSQL on 127.0.0.1:5432"
  export DATABASE_URL=$password
}

# The PostgreSQL server binaries (initdb, pg_ctl) for the tests that start a throwaway cluster
# of their own (the chaos soak restarts it; the machine's PostgreSQL is never touched).
ensure_pg_server_binaries() {
  if [ -z "${PG_BINDIR:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt_install postgresql
  fi
  if [ -n "${PG_BINDIR:-}" ]; then [ -x "$PG_BINDIR/initdb" ] || die "PG_BINDIR=$PG_BINDIR has no initdb"; fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    die "the throwaway PostgreSQL runs as the postgres user (it refuses root), and there is none"
  fi
  return 0
}

# Prints DATABASE_URL with its database replaced by $1, creating that database if needed.
database_url_for() {
  local name=$1 server=${DATABASE_URL%%\?*}
  local url="${server%/*}/$name"
  if ! can_connect "$url"; then
    psql "$DATABASE_URL" -qc "CREATE DATABASE \"$name\"" >/dev/null || die "could not create database $name"
  fi
  printf '%s' "$url"
}

# The local SQS API: moto's server from PyPI (with SQS's FIFO group rule: scripts/moto_server.py),
# in a venv of the project's own (.tools/), on
# 127.0.0.1:$SQS_PORT. Started here and stopped when the calling script exits, unless one was
# already answering there. Exports the AWS SDK variables that point the functions at it.
MOTO_VERSION=5.2.5
MOTO_LAUNCHER=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/moto_server.py
SQS_PORT=${SQS_PORT:-9324}
TOOLS=$PWD/.tools

# Creates the venv .tools/$1 if needed and pip-installs the pinned packages that follow into it.
venv_install() {
  local venv=$TOOLS/$1; shift
  step "Installing $* into .tools/$(basename "$venv")"
  command -v python3 >/dev/null || apt_install python3 python3-venv
  mkdir -p "$TOOLS"
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv; python3 -m venv "$venv"; } ||
    die "could not create a Python venv in $venv"
  "$venv/bin/pip" install -q "$@" || die "pip install $* failed"
}

sqs_api_up() { python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=2)
PY
}

# `ensure_sqs_api detached` leaves a server it starts running after the script (for
# scripts/stack.sh), with its pid in .tools/moto.pid.
ensure_sqs_api() {
  export AWS_ENDPOINT_URL_SQS=http://127.0.0.1:$SQS_PORT AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true
  export AWS_ENDPOINT_URL_SECRETS_MANAGER=$AWS_ENDPOINT_URL_SQS
  if sqs_api_up "$AWS_ENDPOINT_URL_SQS"; then
    step "Using the local SQS API already answering on 127.0.0.1:$SQS_PORT"
    return
  fi
  # Compare captured output: `pip show | grep -q` would fail under pipefail when grep exits early.
  local installed
  installed=$("$TOOLS/venv/bin/pip" show moto 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ ! -x "$TOOLS/venv/bin/moto_server" ] || [ "$installed" != "$MOTO_VERSION" ]; then
    venv_install venv "moto[server]==$MOTO_VERSION"
  fi
  local log=$TOOLS/moto.log
  [ "$SQS_PORT" = 9324 ] || log=$TOOLS/moto-$SQS_PORT.log
  step "Starting the local SQS API (moto) on 127.0.0.1:$SQS_PORT (log: ${log#"$PWD"/})"
  if [ "${1:-}" = detached ]; then
    setsid nohup "$TOOLS/venv/bin/python" "$MOTO_LAUNCHER" -H 127.0.0.1 -p "$SQS_PORT" >"$log" 2>&1 < /dev/null &
    echo $! > "$TOOLS/moto.pid"
  else
    "$TOOLS/venv/bin/python" "$MOTO_LAUNCHER" -H 127.0.0.1 -p "$SQS_PORT" >"$log" 2>&1 &
    MOTO_PID=$!
    on_exit 'kill "$MOTO_PID" 2>/dev/null'
  fi

  for _ in $(seq 1 60); do sqs_api_up "$AWS_ENDPOINT_URL_SQS" && return; sleep 0.5; done
  die "the local SQS API did not answer on 127.0.0.1:$SQS_PORT; see ${log#"$PWD"/}"
}

# cfn-lint, pinned, in a venv of its own (.tools/lint-venv), for template.yaml.
CFN_LINT_VERSION=1.58.0
ensure_cfn_lint() {
  local installed
  installed=$("$TOOLS/lint-venv/bin/cfn-lint" --version 2>/dev/null || true)
  if [ "$installed" != "cfn-lint $CFN_LINT_VERSION" ]; then
    venv_install lint-venv "cfn-lint==$CFN_LINT_VERSION"
  fi
}

# The AWS SAM CLI, pinned, in its own venv (.tools/sam-venv: it pins boto3 apart from moto's).
SAM_CLI_VERSION=1.170.0
ensure_sam_cli() {
  export SAM_CLI_TELEMETRY=0
  local installed
  installed=$("$TOOLS/sam-venv/bin/sam" --version 2>/dev/null || true)
  if [ "$installed" != "SAM CLI, version $SAM_CLI_VERSION" ]; then
    venv_install sam-venv "aws-sam-cli==$SAM_CLI_VERSION"
  fi
  # Only `sam` on PATH (.tools/bin), not the venv's python and pip.
  mkdir -p "$TOOLS/bin"
  ln -sf "$TOOLS/sam-venv/bin/sam" "$TOOLS/bin/sam"
  export PATH="$TOOLS/bin:$PATH"
}

# cargo-lambda and zig (its cross linker), pinned, in .tools/lambda-venv; puts them first on PATH.
CARGO_LAMBDA_VERSION=1.9.2
ensure_cargo_lambda() {
  local installed
  installed=$("$TOOLS/lambda-venv/bin/pip" show cargo-lambda 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ "$installed" != "$CARGO_LAMBDA_VERSION" ]; then
    venv_install lambda-venv "cargo-lambda==$CARGO_LAMBDA_VERSION" ziglang
  fi
  export PATH="$TOOLS/lambda-venv/bin:$PATH"
}

# sqlx-cli at the version of the sqlx the workspace builds (Cargo.lock), from crates.io into
# .tools/sqlx (once; a few minutes); puts `sqlx` and `cargo sqlx` first on PATH.
ensure_sqlx_cli() {
  local version installed
  version=$(sed -n '/^name = "sqlx"$/{n;s/^version = "\(.*\)"$/\1/p;}' Cargo.lock)
  [ -n "$version" ] || die "found no sqlx in Cargo.lock"
  installed=$("$TOOLS/sqlx/bin/sqlx" --version 2>/dev/null || true)
  if [ "$installed" != "sqlx-cli $version" ]; then
    step "Installing sqlx-cli $version into .tools/sqlx (once; a few minutes; log: .tools/sqlx-install.log)"
    mkdir -p "$TOOLS"
    cargo install sqlx-cli --version "$version" --no-default-features --features postgres,rustls \
      --locked --root "$TOOLS/sqlx" >"$TOOLS/sqlx-install.log" 2>&1 ||
      die "cargo install sqlx-cli $version failed; see .tools/sqlx-install.log"
  fi
  export PATH="$TOOLS/sqlx/bin:$PATH"
}

# The query data sqlx's macros build from (.sqlx/; offline builds: .cargo/config.toml), written
# by `cargo sqlx prepare` from the database SQLX_DATABASE on DATABASE_URL's server, dropped and
# migrated anew (core's migrations, then each consumer's). `sqlx_prepare --check` only compares.
SQLX_DATABASE=sqlx_offline
sqlx_prepare() {
  ensure_sqlx_cli
  PGOPTIONS='-c client_min_messages=warning' psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$SQLX_DATABASE\" WITH (FORCE)" >/dev/null ||
    die "could not drop database $SQLX_DATABASE"
  local url source
  url=$(database_url_for "$SQLX_DATABASE") || exit 1
  for source in migrations functions/*/migrations; do
    [ -d "$source" ] || continue
    # --ignore-missing: the sources share one migrations table.
    sqlx migrate run --ignore-missing --source "$source" --database-url "$url" >/dev/null ||
      die "could not apply $source to database $SQLX_DATABASE"
  done
  cargo sqlx prepare --workspace "$@" --database-url "$url" -- --all-targets
}

# PgBouncer >= 1.21 (the first to carry named prepared statements across a transaction pool,
# max_prepared_statements), the local analog of RDS Proxy's multiplexing. Debian 12 ships 1.18,
# so this builds the release Debian 13 ships, from Debian's source package with its security
# patches, into .tools/pgbouncer/ (once; about a minute). Sets PGBOUNCER to the binary.
ensure_pgbouncer() {
  PGBOUNCER=$TOOLS/pgbouncer/bin/pgbouncer
  if "$PGBOUNCER" --version >/dev/null 2>&1; then return; fi
  command -v pkg-config >/dev/null && pkg-config --exists libevent || apt_install libevent-dev pkg-config
  command -v make >/dev/null && command -v gcc >/dev/null || apt_install build-essential
  step "Building PgBouncer from Debian 13's source package into .tools/pgbouncer (log: .tools/pgbouncer-build.log)"
  local work=$TOOLS/pgbouncer-src build_log=$TOOLS/pgbouncer-build.log
  rm -rf "$work"; mkdir -p "$work/lists/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$work/sources.list"
  local apt=(-o Dir::Etc::sourcelist="$work/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$work/lists")
  (
    set -e; cd "$work"
    apt-get "${apt[@]}" update -qq
    apt-get "${apt[@]}" source --download-only pgbouncer
    tar xf pgbouncer_*.orig.tar.gz; tar xf pgbouncer_*.debian.tar.xz
    cd pgbouncer-*/
    # Debian's security fixes; not its packaging patch (debian-config: system paths).
    sed '/^debian-config$/d; /^#/d; /^[[:space:]]*$/d' ../debian/patches/series >../patches
    while read -r p; do patch -p1 -s <"../debian/patches/$p"; done <../patches
    ./configure -q --prefix="$TOOLS/pgbouncer" --without-cares --without-systemd --without-pam
    make -s -j2 && make -s install
  ) >"$build_log" 2>&1 || die "building PgBouncer failed; see $build_log"
  rm -rf "$work"
  "$PGBOUNCER" --version >/dev/null 2>&1 || die "PgBouncer was built but does not run; see $build_log"
  note "$("$PGBOUNCER" --version | head -1)"
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."
