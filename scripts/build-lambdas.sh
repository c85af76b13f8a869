#!/usr/bin/env bash
# Release builds of every Lambda function with cargo-lambda (x86_64, provided.al2023), as
# `sam build` makes them: target/lambda/<function>/bootstrap. Separate from the test command
# because a release build of the whole dependency tree takes several minutes on 2 cores.
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed"
ensure_cargo_lambda
# The binaries template.yaml deploys, so this never drifts: its functions' BuildProperties
# `Binary: <name>`, each consumer stanza's `Binary: <name>` parameter, and the literal ones of
# the nested templates (templates/consumer.yaml: the DLQ ingester; its consumer's is a `Ref`).
mapfile -t BINARIES < <(sed -n 's/^ *Binary: *\([a-z][a-z0-9_-]*\) *$/\1/p' template.yaml templates/*.yaml | sort -u)
[ "${#BINARIES[@]}" -gt 0 ] || die "no Binary: entries found in template.yaml or templates/"
step "Building ${BINARIES[*]} (cargo lambda build --release)"
cargo lambda build --release $(printf -- '--bin %s ' "${BINARIES[@]}") || die "cargo lambda build failed"
for f in "${BINARIES[@]}"; do
  [ -x "target/lambda/$f/bootstrap" ] || die "target/lambda/$f/bootstrap was not produced"
  note "$f: target/lambda/$f/bootstrap ($(du -h "target/lambda/$f/bootstrap" | cut -f1))"
done
step "Built; deploy with: sam build && sam deploy --config-env staging (docs/deploy.md; sam build reuses this build)"
