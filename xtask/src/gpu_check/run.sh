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
cd "$here"
export LOCKSTEP_REQUIRE_GPU="${LOCKSTEP_REQUIRE_GPU:-1}" LOCKSTEP_REQUIRE_NVRTC=1
export LOCKSTEP_SKIP_LOG="$logs/skipped.tsv"
: >"$LOCKSTEP_SKIP_LOG"
budget="${LOCKSTEP_CALL_BUDGET:-540}"
deadline=$((SECONDS + budget))
timeout_s="${LOCKSTEP_TEST_TIMEOUT:-150}"
repeats="${LOCKSTEP_BENCH_REPEATS:-3}"

# The seconds the next step may run: its own limit, or what is left of the call's budget.
allowance() {
    local left=$((deadline - SECONDS))
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

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

if [ -z "${LOCKSTEP_CUDA_LIBRARY_PATH:-}" ] && command -v python3 >/dev/null; then
    found="$(python3 -c '
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
folders = sorted({os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)})
print(os.pathsep.join(f for f in folders if os.path.isdir(f)))
' 2>/dev/null)"
    if [ -n "$found" ]; then export LOCKSTEP_CUDA_LIBRARY_PATH="$found"; fi
fi
{
    echo "== environment"
    date -u
    uname -srm
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
        nvidia-smi
    else
        echo "nvidia-smi: not on PATH"
    fi
    echo "python3: $(command -v python3 || echo none)"
    echo "LOCKSTEP_CUDA_LIBRARY_PATH=${LOCKSTEP_CUDA_LIBRARY_PATH:-}"
    ./gpu_bench --libraries
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
    if [ $((deadline - SECONDS)) -lt 5 ]; then
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

bench_done=0
for ((r = 1; r <= repeats; r++)); do
    if [ $((deadline - SECONDS)) -lt 120 ]; then
        echo "== benchmark repetitions $r to $repeats not run: $((deadline - SECONDS))s left of ${budget}s"
        break
    fi
    echo "== benchmark, repetition $r of $repeats"
    timeout --kill-after=10 "$(allowance "$timeout_s")" ./gpu_bench >"$logs/gpu_bench.$r.log" 2>&1 || status=1
    cat "$logs/gpu_bench.$r.log"
    timeout --kill-after=10 "$(allowance "$timeout_s")" ./gpu_fit_bench >"$logs/gpu_fit_bench.$r.log" 2>&1 || status=1
    cat "$logs/gpu_fit_bench.$r.log"
    torch=0
    if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then torch=1; fi
    if [ "$torch" = 1 ]; then
        timeout --kill-after=10 "$(allowance "$timeout_s")" python3 torch_gpu_reference.py \
            >"$logs/torch.$r.log" 2>&1 || status=1
        cat "$logs/torch.$r.log"
    else
        echo "PyTorch reference not run: no python3 with torch"
    fi
    timeout --kill-after=10 "$(allowance "$timeout_s")" ./nccl_bench >"$logs/nccl_bench.$r.log" 2>&1 || status=1
    cat "$logs/nccl_bench.$r.log"
    if [ "$torch" = 1 ]; then
        PYTHONUNBUFFERED=1 timeout --kill-after=10 "$(allowance "$timeout_s")" python3 torch_nccl_reference.py \
            >"$logs/torch_nccl.$r.log" 2>&1 || status=1
        cat "$logs/torch_nccl.$r.log"
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
