#!/usr/bin/env bash
# The two figures a model of many workers' all-reduce needs, measured between two network
# namespaces joined by a veth pair (the kernel's TCP path between hosts, without a wire): the
# cost of one message (a 4-byte all-reduce of two ranks is two messages, one after the other)
# and the bandwidth of one link (a 16 MiB all-reduce), with `allreduce_bench` (ring and tree),
# RATE-limited by `tbf` as in benches/side_by_side_links.sh. Every repetition's figure printed.
#
# Usage: sudo benches/per_message_cost.sh   (from the repository root; needs root for the
# namespaces, `ip` and `tc`). RATES (default "unlimited 1gbit"), REPS (default 3).
set -euo pipefail
RATES="${RATES:-unlimited 1gbit}"
REPS="${REPS:-3}"
NS=(lockstep-msg0 lockstep-msg1)
DEV=(lsm-veth0 lsm-veth1)
ADDR=(10.231.8.1 10.231.8.2)

. "$(dirname "$0")/two_hosts.sh"
two_hosts_up

cargo build --release --quiet -p lockstep-examples --bin allreduce_bench

for rate in $RATES; do
  tbf_limit "$rate"
  for rep in $(seq 1 "$REPS"); do
    port=$((7700 + RANDOM % 500))
    cluster="{\"cluster\":{\"worker\":[\"${ADDR[0]}:$port\",\"${ADDR[1]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":IDX}}"
    ip netns exec "${NS[1]}" env TF_CONFIG="${cluster/IDX/1}" timeout 300 \
      target/release/allreduce_bench --sizes 4,16777216 >/dev/null 2>&1 &
    ip netns exec "${NS[0]}" env TF_CONFIG="${cluster/IDX/0}" timeout 300 \
      target/release/allreduce_bench --sizes 4,16777216 2>/dev/null |
      sed -n "s/^\(2 \+tcp .*\)$/$rate r$rep \1/p"
    wait
  done
done
