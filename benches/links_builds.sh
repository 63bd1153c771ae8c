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
# `mnist_keras` and `fashion_mnist`; a DIR may be followed by ,ITEM items for both workers:
# NAME=VALUE to their environment, others (--flag=value) to their flags, `{i}` in an item
# becoming each worker's index (name:DIR,RUST_LOG=debug,--kernel-cpus={i}; a list of cores
# as a range, 0-1, since commas part the items). RATE (default 1gbit, or unlimited),
# ROUNDS (default 3), EPOCHS (default 3), MTU (veth's 1500 unless set), MODEL (cnn,
# tutorial-literal or cnn-bn-wide, as side_by_side_links.sh's; the last on 8,000 images);
# ARGS, more flags for every run's binary (say "--batch-per-worker 32"; not one the script
# sets already: --threads, --epochs, --seed, --bytes-per-pack, --overlap-update, the model's).
#
# Prints per run: the build's name, both workers' weights checksum (the same for every build
# that computes the same bits), `steps` (`mnist_keras` prints it), `loop_examples_per_s` (steps 2..N over their time),
# `cpu`, both workers' CPU time over the run's wall time (GNU time), and `link_bytes`, what
# worker 0's end of the link sent in the run as its rate limit counts them: every frame whole,
# headers and the acknowledgements of worker 1's bytes included (0 without a limit).
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

run() { # name dir[,ITEM...] seed
  local port=$((7200 + RANDOM % 500)) items dir figures
  IFS=, read -ra items <<< "$2"
  dir=${items[0]}
  items=("${items[@]:1}")
  local sent_before
  sent_before=$(link_bytes_sent)
  local cluster="{\"cluster\":{\"worker\":[\"${ADDR[0]}:$port\",\"${ADDR[1]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":IDX}}"
  local flags=(--threads 1 --epochs "$EPOCHS" --seed "$3" "${LS_ARGS[@]}" --bytes-per-pack 262144 --overlap-update)
  local extra
  read -ra extra <<< "${ARGS:-}"
  flags+=(${extra[@]+"${extra[@]}"})
  FLAGS=("${flags[@]}") ITEMS=(${items[@]+"${items[@]}"})
  worker 1 "$dir" "${cluster/IDX/1}" >/dev/null 2>&1 &
  figures=$(worker 0 "$dir" "${cluster/IDX/0}" 2>/dev/null |
    grep -o 'weights_checksum=[0-9a-f]*\|steps=[0-9]*\|loop_examples_per_s=[0-9.]*' | tr '\n' ' ')
  wait
  if [[ $figures != *weights_checksum=* ]]; then
    echo "$1 printed no figures: run worker 0's command by hand to see why" >&2
  fi
  echo "$1 ${figures}cpu=$(cpu_cores /tmp/links-builds.cpu0 /tmp/links-builds.cpu1) link_bytes=$(($(link_bytes_sent) - sent_before))"
}

# Worker $1 of build $2 with TF_CONFIG $3, in its namespace, timed, with FLAGS and the
# build's ITEMS (NAME=VALUE to its environment, the others to its flags), `{i}` in each item
# replaced by the worker's index.
worker() { # index dir tf_config
  local index=$1 dir=$2 tf_config=$3 env=() args=("${FLAGS[@]}") item
  for item in ${ITEMS[@]+"${ITEMS[@]}"}; do
    item=${item//\{i\}/$index}
    case $item in
      -*) args+=("$item") ;;
      *=*) env+=("$item") ;;
      *) args+=("$item") ;;
    esac
  done
  ip netns exec "${NS[$index]}" env ${env[@]+"${env[@]}"} TF_CONFIG="$tf_config" \
    /usr/bin/time -o "/tmp/links-builds.cpu$index" -f '%U %S %e' timeout 900 "$dir/$LS_BIN" "${args[@]}"
}

# The bytes worker 0's end of the link has sent since the namespaces were made.
link_bytes_sent() {
  tc -n "${NS[0]}" -s qdisc show dev "${DEV[0]}" | awk '/Sent/ { print $2; exit }'
}

echo "# $MODEL, ${RATE:-1gbit}, MTU ${MTU:-1500}, $EPOCHS epochs${ARGS:+, $ARGS}"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for build in $BUILDS; do run "${build%%:*}" "${build#*:}" "$round"; done
done
