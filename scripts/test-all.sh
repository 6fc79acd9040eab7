#!/usr/bin/env bash
# The whole test suite, from a fresh clone: unit, integration, property and doc tests,
# then the loom models of every per-key state machine.
#
#   ./scripts/test-all.sh
#
# Needs only a stable Rust toolchain; everything else comes from crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, integration, property and doc tests (release) =="
cargo test --release

echo "== loom models (RUSTFLAGS=--cfg tollgate_loom) =="
# A separate target directory: the cfg changes every crate's build, and sharing one
# directory would rebuild the normal one afterwards.
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
RUSTFLAGS="--cfg tollgate_loom" \
CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}" \
    cargo test --release --test 'loom*'
