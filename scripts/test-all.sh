#!/usr/bin/env bash
# The whole test suite, from a fresh clone: the docs' code blocks checked (they paste as
# shown); unit, integration, property and doc tests; the fuzz corpus replayed through the
# fuzz targets' checks; then the loom models of every per-key state machine. Each step
# prints how long it took.
#
#   ./scripts/test-all.sh
#
# Needs a stable Rust toolchain; crates come from crates.io, and `redis-server` (for the Redis
# backend's tests) from Debian's packages when it is missing. (Fuzzing itself
# needs nightly and cargo-fuzz: see fuzz/README.md. Here the committed corpus, seeds and
# reproducers of past findings, is replayed on stable without libFuzzer.)
set -euo pipefail
cd "$(dirname "$0")/.."

step_start=$(date +%s)
timed() {
    local now
    now=$(date +%s)
    echo "-- $1: $((now - step_start))s"
    step_start=$now
}

echo "== code blocks in README.md and docs/*.md paste as shown (compiled by the doc tests below) =="
python3 scripts/check-doc-blocks.py
timed "doc blocks"

echo "== redis-server for the Redis backend's tests (installed when missing) =="
./scripts/install-redis.sh
timed "redis-server"

echo "== unit, integration, property and doc tests, every feature (release) =="
cargo test --release --all-features
timed "tests"

echo "== fuzz corpus replayed on stable (fuzz/corpus/*, no libFuzzer) =="
cargo test --manifest-path fuzz/Cargo.toml --no-default-features --lib
timed "fuzz corpus replay"

echo "== loom models (RUSTFLAGS=--cfg tollgate_loom) =="
# A separate target directory: the cfg changes every crate's build, and sharing one
# directory would rebuild the normal one afterwards.
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
RUSTFLAGS="--cfg tollgate_loom" \
CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}" \
    cargo test --release --test 'loom*'
timed "loom models (build and run)"
