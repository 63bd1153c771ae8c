#!/usr/bin/env bash
# Two or more builds of Lockstep (or one build under different environment settings) trained
# by 2 workers × 1 thread in network namespaces joined by a `tbf`-limited veth pair, as in
# benches/side_by_side_links.sh, interleaved round by round: each round runs every build once,
# same seed, so a change is measured beside what it changed, on the same machine, minutes apart.
# Every run keeps its update in flight with packs of 256 KiB (`--bytes-per-pack 262144
# --overlap-update`).
#
# Usage: sudo BUILDS="before:/path/to/old/release after:target/release" benches/links_builds.sh
# (from the repository root; root for the namespaces). BUILDS: name:DIR pairs, DIR holding
# `mnist_keras` and `fashion_mnist`; a DIR may be followed by ,NAME=VALUE settings passed to
# both workers' environment (name:DIR,RUST_LOG=debug). RATE (default 1gbit, or unlimited),
# ROUNDS (default 3), EPOCHS (default 3), MTU (veth's 1500 unless set), MODEL (cnn,
# tutorial-literal or cnn-bn-wide, as side_by_side_links.sh's; the last on 8,000 images).
#
# Prints per run: the build's name, both workers' weights checksum (the same for every build
# that computes the same bits), `loop_examples_per_s` (steps 2..N over their time), and
# `cpu`, both workers' CPU time over the run's wall time (GNU time).
set -uo pipefail
NS=(lockstep-link0 lockstep-link1)
DEV=(lsl-veth0 lsl-veth1)
ADDR=(10.231.7.1 10.231.7.2)
. "$(dirname "$0")/two_hosts.sh"
BUILDS="${BUILDS:?name:DIR pairs, say before:/tmp/old after:target/release}"
MODEL="${MODEL:-cnn}"
EPOCHS="${EPOCHS:-3}"
case $MODEL in
  cnn | tutorial-literal) LS_BIN=mnist_keras
    LS_ARGS=(--optimizer sgd --learning-rate 0.001 --no-backup --model "$MODEL") ;;
  cnn-bn-wide) LS_BIN=fashion_mnist
    LS_ARGS=(--model cnn-bn --dense-units 2048 --local-batch-norm --train-examples 8000) ;;
  *) echo "MODEL is cnn, tutorial-literal or cnn-bn-wide" >&2; exit 2 ;;
esac
two_hosts_up
tbf_limit "${RATE:-1gbit}"

run() { # name dir[,NAME=VALUE...] seed
  local port=$((7200 + RANDOM % 500)) settings dir figures
  IFS=, read -ra settings <<< "$2"
  dir=${settings[0]}
  settings=("${settings[@]:1}")
  local cluster="{\"cluster\":{\"worker\":[\"${ADDR[0]}:$port\",\"${ADDR[1]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":IDX}}"
  local flags=(--threads 1 --epochs "$EPOCHS" --seed "$3" "${LS_ARGS[@]}" --bytes-per-pack 262144 --overlap-update)
  ip netns exec "${NS[1]}" env ${settings[@]+"${settings[@]}"} TF_CONFIG="${cluster/IDX/1}" \
    /usr/bin/time -o /tmp/links-builds.cpu1 -f '%U %S %e' timeout 900 "$dir/$LS_BIN" "${flags[@]}" \
    >/dev/null 2>&1 &
  figures=$(ip netns exec "${NS[0]}" env ${settings[@]+"${settings[@]}"} TF_CONFIG="${cluster/IDX/0}" \
    /usr/bin/time -o /tmp/links-builds.cpu0 -f '%U %S %e' timeout 900 "$dir/$LS_BIN" "${flags[@]}" \
    2>/dev/null | grep -o 'weights_checksum=[0-9a-f]*\|loop_examples_per_s=[0-9.]*' | tr '\n' ' ')
  wait
  echo "$1 ${figures}cpu=$(cpu_cores /tmp/links-builds.cpu0 /tmp/links-builds.cpu1)"
}

echo "# $MODEL, ${RATE:-1gbit}, MTU ${MTU:-1500}, $EPOCHS epochs"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for build in $BUILDS; do run "${build%%:*}" "${build#*:}" "$round"; done
done
