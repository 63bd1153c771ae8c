#!/usr/bin/env bash
# The README's test command on a fresh checkout, as CI runs it: a new clone of COMMIT (HEAD
# by default) in a temporary folder, no target directory, the crates already downloaded,
# then `cargo test --workspace --locked --no-run` (the compile) and
# `cargo test --workspace --locked` (the run), each timed. The environment is CI's
# (.ci/test_env): pip's NVRTC in $VENV (default /tmp/lockstep-ci-venv, made by .ci/run), and
# every resource this machine provides required (start SLURM first with .ci/slurm_up, as CI
# does). ROUNDS (default 1) clones and measures again, one round after another.
#
# Usage: benches/test_command_time.sh [COMMIT]   (from the repository root)
#
# Prints per round: the compile's and the run's seconds (wall) and the whole command's CPU
# seconds (user + system), the tests passed, failed and skipped (.ci/test_summary), and the
# ten test executables that took longest.
set -uo pipefail
root="$(git rev-parse --show-toplevel)"
commit="$(git -C "$root" rev-parse "${1:-HEAD}")"
rounds="${ROUNDS:-1}"
VENV="${VENV:-/tmp/lockstep-ci-venv}"
export CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
# A target directory of the clone's own: nothing built before.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR
. "$root/.ci/test_env"
for ((round = 1; round <= rounds; round++)); do
    work="$(mktemp -d)"
    git clone --quiet "$root" "$work/lockstep" || exit 1
    git -C "$work/lockstep" checkout --quiet "$commit" || exit 1
    cd "$work/lockstep" || exit 1
    export LOCKSTEP_SKIP_LOG="$work/skips.tsv"
    : >"$LOCKSTEP_SKIP_LOG"
    started=$SECONDS
    /usr/bin/time -f "%U %S" -o "$work/compile.cpu" \
        cargo test --workspace --locked --no-run >"$work/compile.log" 2>&1
    compiled=$((SECONDS - started))
    started=$SECONDS
    /usr/bin/time -f "%U %S" -o "$work/run.cpu" \
        cargo test --workspace --locked >"$work/test.log" 2>&1
    status=$?
    ran=$((SECONDS - started))
    cpu() { awk '{ printf "%.0f", $1 + $2 }' "$1"; }
    echo "round $round of $rounds, ${commit:0:7}: compile ${compiled} s (cpu $(cpu "$work/compile.cpu") s), run ${ran} s (cpu $(cpu "$work/run.cpu") s), exit $status"
    "$root/.ci/test_summary" "$work/test.log" "$LOCKSTEP_SKIP_LOG" | head -n 1
    # Each executable by its file (`deps/NAME-HASH`, the hash cut), doc tests by crate.
    awk '/^ *Running / { n = split($NF, p, "/"); name = p[n]; sub(/-[0-9a-f]+\)$/, "", name) }
         /^ *Doc-tests / { name = "doc-tests " $2 }
         /^test result:/ { split($0, a, "finished in "); printf "%7.1f s  %s\n", a[2] + 0, name }' \
        "$work/test.log" | sort -rn | head -n 10
    cd "$root" && rm -rf "$work"
done
