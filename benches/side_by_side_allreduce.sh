#!/usr/bin/env bash
# All-reduce between processes on this host: Lockstep beside the reference implementations of
# ../shared/anchors/collectives (gloo through PyTorch; Open MPI when installed), interleaved in
# one session so the machine's mood affects all alike. Every program uses the anchors' timing
# method (5 warm-ups, >= 2 s of back-to-back rounds, the slowest rank's median).
#
# Lockstep runs three times per cluster size: `lockstep-ring` with its defaults (ranks on one
# host exchange bytes through shared-memory rings), `lockstep-ring-unix` with `--same-host unix`
# (Unix-domain sockets, the default before the rings) and `lockstep-ring-tcp` with
# `--same-host tcp` (TCP over 127.0.0.1, as gloo and Open MPI's tcp BTL do). Each Lockstep run's settings (wires, send-ahead,
# socket buffers, cores) are printed as `# settings …` lines.
#
# Usage: benches/side_by_side_allreduce.sh [SIZES...]   (from the repository root)
# Needs: a Python with torch (PY=/path/to/python; default python3); Open MPI is used when
# `mpicc` is on PATH (apt-get install openmpi-bin libopenmpi-dev) unless MPI=0.
# REPS (default 5) repetitions.
set -euo pipefail
ANCHORS="${ANCHORS:-../shared/anchors/collectives}"
PY="${PY:-python3}"
REPS="${REPS:-5}"
if [ $# -gt 0 ]; then SIZES=("$@"); else SIZES=(4 4096 16777216 67108864 268435456); fi
CSV_SIZES=$(IFS=,; echo "${SIZES[*]}")
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

MPI="${MPI:-$(command -v mpicc >/dev/null && echo 1 || echo 0)}"
if [ "$MPI" = 1 ]; then
  mpicc -O3 -march=native "$ANCHORS/mpi_allreduce_bench.c" -o "$WORK/mpi_allreduce_bench" -lm
fi
cargo xtask bench allreduce --workers 2 -- --sizes 4 --iters 1 >/dev/null 2>&1 # build first

lockstep() { # n label extra-args...
  local n=$1 label=$2
  shift 2
  cargo xtask bench allreduce --workers "$n" -- --sizes "$CSV_SIZES" --algorithms ring "$@" \
    2>/dev/null >"$WORK/out"
  sed -n 's/^\[worker:0\] settings /# settings '"$label"' n='"$n"' /p' "$WORK/out"
  awk -v r="$rep" -v l="$label" '/\[worker:0\] [0-9]/ { print r "," l "," $2 "," $4 "," $9 "," $7 }' "$WORK/out"
}

port=29800
echo "rep,impl,n,bytes,busbw_GBps,median_us"
for rep in $(seq 1 "$REPS"); do
  for n in 2 4; do
    port=$((port + 1))
    GLOO_SOCKET_IFNAME=lo "$PY" "$ANCHORS/gloo_allreduce_bench.py" --world "$n" --port "$port" \
      --label tcp "${SIZES[@]}" 2>/dev/null |
      awk -F, -v r="$rep" 'NR > 1 { print r ",gloo," $3 "," $4 "," $9 "," $6 }'
    lockstep "$n" lockstep-ring
    if [ "$MPI" = 1 ]; then
      mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$WORK/mpi_allreduce_bench" tcp "${SIZES[@]}" 2>/dev/null |
        awk -F, -v r="$rep" 'NR > 1 { print r ",openmpi-tcp," $3 "," $4 "," $9 "," $6 }'
    fi
    lockstep "$n" lockstep-ring-unix --same-host unix
    lockstep "$n" lockstep-ring-tcp --same-host tcp
  done
done
