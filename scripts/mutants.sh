#!/usr/bin/env bash
# Mutation testing of the engine and of the keyed registry with cargo-mutants: every mutant
# (an operator flipped, a function body replaced by a plain value, ...) must make a test fail.
#
#   ./scripts/mutants.sh [engine|registry|all|FILE...] [-- CARGO-MUTANTS OPTIONS...]
#
#   engine    src/engine/ (the default): the algorithms' arithmetic and cells, the seqlock,
#             the one-word CAS loop, composites, dispatch, states with their own parameters
#   registry  src/keyed/: the keyed limiter's maps, generations, eviction, settling
#   all       both
#   FILE...   these source files only, e.g. src/engine/word.rs
#
# Options after `--` go to cargo-mutants as they are, e.g. `-- --shard 1/4`, `-- --iterate`
# (skip the mutants caught by the previous run), `-- --list` (list the mutants, run nothing).
#
# The tests, features and timeouts are in .cargo/mutants.toml: the library's unit tests and
# the `core` suite, in a debug build, so the debug assertions count. Results are written to
# mutants.out/ (the run before moves to mutants.out.old/). The script ends with the score,
# caught and timed out over viable mutants, and the survivors. It exits with cargo-mutants'
# status: 0 when every viable mutant was caught, 2 when some survived, 3 when some only timed
# out, 4 when the unmutated tests fail.
#
# Needs cargo-mutants (`cargo install cargo-mutants --locked`). Takes long: 3 to 3.5 minutes
# to build and test the unmutated tree, then 10 to 20 s per mutant on two cores
# (docs/ARCHITECTURE.md, "Mutation testing").
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    sed -n '5,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit "$1"
}

# The engine's files, less the atomics' switch to loom (src/engine/sync.rs): its loom
# stand-ins are not compiled in a normal build, so their mutants could never be caught.
engine=(--file 'src/engine/**/*.rs' --exclude src/engine/sync.rs)
registry=(--file 'src/keyed/**/*.rs')

selection=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
        engine) selection+=("${engine[@]}") ;;
        registry) selection+=("${registry[@]}") ;;
        all) selection+=("${engine[@]}" "${registry[@]}") ;;
        -h | --help) usage 0 ;;
        *.rs)
            [ -f "$1" ] || { echo "no such file: $1" >&2; exit 1; }
            selection+=(--file "$1")
            ;;
        *) echo "unknown scope: $1" >&2; usage 1 ;;
    esac
    shift
done
[ $# -gt 0 ] && shift # the `--`
[ ${#selection[@]} -gt 0 ] || selection=("${engine[@]}")

if ! cargo mutants --version >/dev/null 2>&1; then
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 1
fi

# Listing runs nothing and writes no results: no score to print.
for arg in "$@"; do
    case "$arg" in
        --list | --list-files) exec cargo mutants "${selection[@]}" "$@" ;;
    esac
done

# A mutant needs one failing case, not the smallest one: without shrinking, a property test
# that fails only by reaching the retry bound (about a second per case in a debug build)
# fails once instead of once per shrinking step, well inside the timeout.
export PROPTEST_MAX_SHRINK_ITERS="${PROPTEST_MAX_SHRINK_ITERS:-0}"

cargo mutants --version
start=$(date +%s)
status=0
cargo mutants --colors never "${selection[@]}" "$@" || status=$?
elapsed=$(($(date +%s) - start))

# 0: all caught; 2: some missed; 3: some timed out. Anything else tested nothing (usage
# error, unmutated tests failing, interrupted), and mutants.out may be an older run's.
case "$status" in
    0 | 2 | 3) ;;
    *)
        echo "no mutation score: cargo-mutants exited with $status" >&2
        exit "$status"
        ;;
esac
out=mutants.out
count() { if [ -f "$out/$1.txt" ]; then grep -c . "$out/$1.txt" || true; else echo 0; fi; }
caught=$(count caught)
missed=$(count missed)
timeout=$(count timeout)
unviable=$(count unviable)
viable=$((caught + missed + timeout))

echo
echo "== mutation score =="
printf 'caught %s, timed out %s, missed %s, unviable %s; %s viable mutants in %dm%02ds\n' \
    "$caught" "$timeout" "$missed" "$unviable" "$viable" $((elapsed / 60)) $((elapsed % 60))
if [ "$viable" -gt 0 ]; then
    # Caught and timed-out mutants over viable ones, in percent with one decimal.
    score=$(((caught + timeout) * 1000 / viable))
    printf 'score: %d.%d%% ((caught + timed out) / viable)\n' $((score / 10)) $((score % 10))
fi
if [ "$timeout" -gt 0 ]; then
    echo
    echo "== timed out (caught only by hanging: a weak signal; make them fail instead) =="
    cat "$out/timeout.txt"
fi
if [ "$missed" -gt 0 ]; then
    echo
    echo "== survivors (kill each with a test, or list it in .cargo/mutants.toml with why it is equivalent) =="
    cat "$out/missed.txt"
fi
exit "$status"
