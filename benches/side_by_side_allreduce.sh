#!/usr/bin/env bash
# All-reduce over TCP loopback: Lockstep beside the reference implementations of
# ../shared/anchors/collectives (gloo through PyTorch, Open MPI), interleaved in one session so
# the machine's mood affects all alike. Every program uses the anchors' timing method.
#
# Usage: benches/side_by_side_allreduce.sh [SIZES...]   (from the repository root)
# Needs: mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev) and a Python with torch
# (PY=/path/to/python; default python3). REPS (default 3) repetitions.
set -euo pipefail
ANCHORS="${ANCHORS:-../shared/anchors/collectives}"
PY="${PY:-python3}"
REPS="${REPS:-3}"
if [ $# -gt 0 ]; then SIZES=("$@"); else SIZES=(4 4096 16777216 67108864 268435456); fi
CSV_SIZES=$(IFS=,; echo "${SIZES[*]}")
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

mpicc -O3 -march=native "$ANCHORS/mpi_allreduce_bench.c" -o "$WORK/mpi_allreduce_bench" -lm
cargo xtask bench allreduce --workers 2 -- --sizes 4 --iters 1 >/dev/null 2>&1 # build first

port=29800
echo "rep,impl,n,bytes,busbw_GBps,median_us"
for rep in $(seq 1 "$REPS"); do
  for n in 2 4; do
    port=$((port + 1))
    GLOO_SOCKET_IFNAME=lo "$PY" "$ANCHORS/gloo_allreduce_bench.py" --world "$n" --port "$port" \
      --label tcp "${SIZES[@]}" 2>/dev/null |
      awk -F, -v r="$rep" 'NR > 1 { print r ",gloo," $3 "," $4 "," $9 "," $6 }'
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca btl tcp,self \
      --mca btl_tcp_if_include lo "$WORK/mpi_allreduce_bench" tcp "${SIZES[@]}" 2>/dev/null |
      awk -F, -v r="$rep" 'NR > 1 { print r ",openmpi," $3 "," $4 "," $9 "," $6 }'
    for algorithm in ring tree; do
      cargo xtask bench allreduce --workers "$n" -- --sizes "$CSV_SIZES" \
        --algorithms "$algorithm" 2>/dev/null |
        awk -v r="$rep" '/\[worker:0\] [0-9]/ { print r ",lockstep-" $5 "," $2 "," $4 "," $9 "," $7 }'
    done
  done
done
