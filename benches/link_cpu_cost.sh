#!/usr/bin/env bash
# What the kernel's network stack costs in CPU time to move a step's gradient bytes between two
# network namespaces joined by a veth pair (limited by `tbf` to RATE), as the links benchmark
# (benches/side_by_side_links.sh) moves them: each end sends and receives BYTES at once over one
# TCP connection, REPEATS times, with blocking 1 MiB reads and writes
# (benches/reference/duplex_tcp.py, no user-space spinning). On one machine both "hosts" stacks
# run on the same cores as the workers' compute; this is the part of a step's CPU time the link
# itself takes, whatever sends the bytes.
#
# Usage: sudo benches/link_cpu_cost.sh   (from the repository root; root for the namespaces)
# Settings: RATES (default "10gbit unlimited"), SIZES in bytes per end and step (default: the
# tutorial CNN's 900,136, its literal model's 11,082,536, the 3.3 M CNN with batch
# normalization's 13,273,000), REPEATS (default 100), REPS (default 2).
#
# Figures: `busy_cpu_ms_per_exchange`, the whole machine's CPU time (every state but idle and
# iowait in /proc/stat, soft interrupts included) while the REPEATS exchanges ran, divided by
# REPEATS; `wall_ms_per_exchange` beside it.
set -euo pipefail
RATES="${RATES:-10gbit unlimited}"
SIZES="${SIZES:-900136 11082536 13273000}"
REPEATS="${REPEATS:-100}"
REPS="${REPS:-2}"
NS=(lockstep-cpu0 lockstep-cpu1)
DEV=(lsc-veth0 lsc-veth1)
ADDR=(10.231.11.1 10.231.11.2)

. "$(dirname "$0")/two_hosts.sh"
two_hosts_up

busy_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
ticks=$(getconf CLK_TCK)

for rate in $RATES; do
  tbf_limit "$rate"
  for size in $SIZES; do
    for rep in $(seq 1 "$REPS"); do
      port=$((7800 + RANDOM % 500))
      ip netns exec "${NS[1]}" python3 benches/reference/duplex_tcp.py server "${ADDR[1]}" "$port" \
        $((size * REPEATS)) >/dev/null &
      sleep 0.5 # the server listening, its start-up out of the count
      b0=$(busy_jiffies)
      t0=$(date +%s%N)
      ip netns exec "${NS[0]}" python3 benches/reference/duplex_tcp.py client "${ADDR[1]}" "$port" \
        $((size * REPEATS)) >/dev/null
      wait
      b1=$(busy_jiffies)
      t1=$(date +%s%N)
      awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) -v n="$REPEATS" -v hz="$ticks" \
        -v tag="$rate,bytes=$size,r$rep" \
        'BEGIN { printf "%s,busy_cpu_ms_per_exchange=%.2f,wall_ms_per_exchange=%.2f\n", tag, b * 1000 / hz / n, t / 1e6 / n }'
    done
  done
done
