#!/usr/bin/env bash
# The deployer's and the operator's tools, pinned, onto PATH:
#
#   bash scripts/tools.sh          installs the AWS SAM CLI, cargo-lambda (with zig), cfn-lint
#                                  (each in a venv of its own under .tools/) and the dlq tool
#                                  (cargo install --locked --path tools/dlq), and links sam,
#                                  cargo-lambda, zig, cfn-lint and dlq into /usr/local/bin (as root)
#                                  or ~/.local/bin
#
# docs/deploy.md and docs/operations.md run what this installs.
source "$(dirname "$0")/lib.sh"

command -v cargo >/dev/null || die "cargo is not installed (the Rust toolchain comes with the machine)"
ensure_sam_cli
ensure_cargo_lambda
ensure_cfn_lint
step "Installing the dlq tool (cargo install --locked --path tools/dlq)"
cargo install --quiet --locked --path tools/dlq --root "$TOOLS/dlq" || die "dlq did not build"

if [ "$(id -u)" = 0 ]; then BIN=/usr/local/bin; else BIN=$HOME/.local/bin; fi
mkdir -p "$BIN"
step "Linking sam, cargo-lambda (and zig), cfn-lint and dlq into $BIN"
ln -sf "$TOOLS/sam-venv/bin/sam" "$BIN/sam"
ln -sf "$TOOLS/lambda-venv/bin/cargo-lambda" "$BIN/cargo-lambda"
# zig, the cross linker cargo-lambda runs: the binary the ziglang wheel ships (its lib/ beside it).
ZIG=$(ls "$TOOLS"/lambda-venv/lib/python3*/site-packages/ziglang/zig 2>/dev/null | head -n 1)
[ -x "$ZIG" ] || die "zig is missing from .tools/lambda-venv (the ziglang wheel)"
ln -sf "$ZIG" "$BIN/zig"
ln -sf "$TOOLS/lint-venv/bin/cfn-lint" "$BIN/cfn-lint"
ln -sf "$TOOLS/dlq/bin/dlq" "$BIN/dlq"
case ":$PATH:" in *":$BIN:"*) ;; *) note "$BIN is not on your PATH: add it (export PATH=\"$BIN:\$PATH\")" ;; esac
note "sam: $("$BIN/sam" --version 2>&1 | head -n 1)"
note "cargo lambda: $(cargo lambda --version 2>&1 | head -n 1)"
note "cfn-lint: $("$BIN/cfn-lint" --version 2>&1 | head -n 1)"
note "dlq: $("$BIN/dlq" --version 2>&1 | head -n 1)"
