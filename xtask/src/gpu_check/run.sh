#!/usr/bin/env bash
# Written by `cargo xtask gpu-check`: the GPU checks for a machine with a GPU and no Rust.
# Usage: run.sh [LOG_DIR]   (logs default to ./logs beside this script)
# Environment:
#   LOCKSTEP_CALL_BUDGET    seconds the whole run may take (default 540: a 10-minute call with
#                           room to fetch the logs); each step gets what is left, at most its own
#                           limit, and the summary is printed within it
#   LOCKSTEP_TEST_TIMEOUT   seconds per test executable (default 150)
#   LOCKSTEP_BENCH_REPEATS  benchmark repetitions (default 3; 0 runs none)
#   LOCKSTEP_REQUIRE_GPU    1 (the default here): a test that finds no GPU fails
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:-$here/logs}"
mkdir -p "$logs" || exit 2
# Absolute, before leaving the caller's folder for the artefact's.
logs="$(cd "$logs" && pwd)" || exit 2
cd "$here"
export LOCKSTEP_REQUIRE_GPU="${LOCKSTEP_REQUIRE_GPU:-1}"
export LOCKSTEP_SKIP_LOG="$logs/skipped.tsv"
: >"$LOCKSTEP_SKIP_LOG"
budget="${LOCKSTEP_CALL_BUDGET:-540}"
deadline=$((SECONDS + budget))
timeout_s="${LOCKSTEP_TEST_TIMEOUT:-150}"
repeats="${LOCKSTEP_BENCH_REPEATS:-3}"

# The seconds the next step may run: its own limit, or what is left of the call's budget (at
# least 1: `timeout 0` would mean no limit). A step is started only with `enough` seconds left.
allowance() {
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 1 ]; then left=1; fi
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
enough() { [ $((deadline - SECONDS)) -ge "$1" ]; }

# The artefact's binaries were linked against the glibc of the machine that built them.
glibc_needed="$(cat glibc-needed 2>/dev/null || echo unknown)"
glibc_here="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
echo "glibc: this machine has ${glibc_here:-unknown}, the artefact needs ${glibc_needed}"
if [ -n "$glibc_here" ] && [ "$glibc_needed" != unknown ] \
    && [ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_here" | sort -V | head -n 1)" != "$glibc_needed" ]; then
    echo "STOP: the artefact's binaries need glibc $glibc_needed and this machine has $glibc_here;"
    echo "build the artefact on a machine with glibc $glibc_here or older"
    exit 2
fi

# NVIDIA's libraries: where LOCKSTEP_CUDA_LIBRARY_PATH names them, else on the loader's path,
# else where pip's wheels put them beside each python3 on PATH (`gpu_bench --libraries`
# prints which file each comes from).
{
    echo "== environment"
    date -u
    uname -srm
    if command -v nvidia-smi >/dev/null; then
        timeout --kill-after=5 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
        timeout --kill-after=5 30 nvidia-smi
    else
        echo "nvidia-smi: not on PATH"
    fi
    echo "python3: $(command -v python3 || echo none)"
    echo "LOCKSTEP_CUDA_LIBRARY_PATH=${LOCKSTEP_CUDA_LIBRARY_PATH:-}"
    timeout --kill-after=5 30 ./gpu_bench --libraries
} 2>&1 | tee "$logs/environment.log"

status=0
summary=()
ran=0
expected_all=0
# Each line of tests/list: an executable, then the tests it must run, by name.
while IFS='|' read -r name tests; do
    [ -n "$name" ] || continue
    log="$logs/$name.log"
    # shellcheck disable=SC2206 # the names are words
    expected=($tests)
    expected_all=$((expected_all + ${#expected[@]}))
    allowed="$(allowance "$timeout_s")"
    echo "== $name: ${#expected[@]} tests, at most ${allowed}s"
    if ! enough 5; then
        summary+=("$name: NOT RUN, the call's budget of ${budget}s ran out")
        status=1
        continue
    fi
    # stdout holds libtest's lines, one `test NAME ... ok` per test that passed (a test's own
    # output is captured and shown with its failure); a skip is written to stderr and the log.
    timeout --kill-after=10 "$allowed" "tests/$name" --exact --test-threads 1 "${expected[@]}" \
        >"$log" 2>"$log.stderr"
    rc=$?
    cat "$log.stderr" >>"$log"
    tail -n 3 "$log"
    passed=0
    missing=()
    for test in "${expected[@]}"; do
        if grep -qxF "test $test ... ok" "$log"; then
            passed=$((passed + 1))
        else
            missing+=("$test")
        fi
    done
    skipped="$(grep -cF "SKIPPED " "$log.stderr")"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        line="$name: TIMED OUT after ${allowed}s, $passed of ${#expected[@]} passed (log: $log)"
        status=1
    else
        line="$name: $passed of ${#expected[@]} passed, $skipped of them skipped (exit $rc)"
        [ "$rc" -eq 0 ] || status=1
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        line="$line; did not pass: ${missing[*]}"
        status=1
    fi
    ran=$((ran + passed - skipped))
    summary+=("$line")
done <tests/list

# Runs one benchmark step, its output in LOG (shown after it), while 10 s of the budget are
# left; a step that fails, or is cut off, fails the run.
bench_step() { # LOG COMMAND...
    local log="$1"
    shift
    if ! enough 10; then
        echo "$* not run: the call's budget of ${budget}s ran out"
        return
    fi
    timeout --kill-after=10 "$(allowance "$timeout_s")" "$@" >"$log" 2>&1 || status=1
    cat "$log"
}

bench_done=0
for ((r = 1; r <= repeats; r++)); do
    if ! enough 120; then
        echo "== benchmark repetitions $r to $repeats not run: $((deadline - SECONDS))s left of ${budget}s"
        break
    fi
    echo "== benchmark, repetition $r of $repeats"
    bench_step "$logs/gpu_bench.$r.log" ./gpu_bench
    bench_step "$logs/gpu_fit_bench.$r.log" ./gpu_fit_bench
    torch=0
    if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then torch=1; fi
    if [ "$torch" = 1 ]; then
        bench_step "$logs/torch.$r.log" python3 torch_gpu_reference.py
    else
        echo "PyTorch reference not run: no python3 with torch"
    fi
    bench_step "$logs/nccl_bench.$r.log" ./nccl_bench
    if [ "$torch" = 1 ]; then
        PYTHONUNBUFFERED=1 bench_step "$logs/torch_nccl.$r.log" python3 torch_nccl_reference.py
    fi
    bench_done=$r
done

echo "== summary"
printf '%s\n' "${summary[@]}"
skips="$(wc -l <"$LOCKSTEP_SKIP_LOG")"
echo "GPU tests run: $ran of $expected_all, skipped: $skips (LOCKSTEP_REQUIRE_GPU=$LOCKSTEP_REQUIRE_GPU)"
if [ "$skips" -gt 0 ]; then
    echo "skipped, and why:"
    awk -F '\t' '{ print "  " $2 " (" $1 "): needs " $3 ": " $4 }' "$LOCKSTEP_SKIP_LOG"
fi
echo "benchmark repetitions run: $bench_done of $repeats; the run took ${SECONDS}s of ${budget}s"
for ((r = 1; r <= bench_done; r++)); do
    echo "-- benchmark, repetition $r"
    grep -h -E '^(\||device)' "$logs/gpu_bench.$r.log" "$logs/gpu_fit_bench.$r.log" "$logs/torch.$r.log" \
        "$logs/nccl_bench.$r.log" "$logs/torch_nccl.$r.log" 2>/dev/null
done
exit $status
