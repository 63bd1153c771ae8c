#!/usr/bin/env bash
# The multi-worker tutorial's CNN trained by 2 workers × 1 thread, each in a network namespace
# of its own, joined by a veth pair whose both ends a `tbf` qdisc limits to RATE: Lockstep's
# `mnist_keras` (one pack of gradients after the backward pass, the default for this model's
# 0.9 MB; packs of 256 KiB reduced during the pass; bf16 on the wire; both) beside PyTorch DDP over
# gloo (../shared/anchors/training/torch_train.py; and again with DDP's own `fp16_compress_hook`,
# benches/torch_train_fp16_hook.py), interleaved, every run's figure printed.
# Global batch 128, SGD lr 1e-3, the anchors' MNIST data, EPOCHS epochs; MODEL picks the model.
#
# Usage: sudo benches/side_by_side_links.sh   (from the repository root; needs root for the
# namespaces, `ip` and `tc`)
# Needs: PY=/path/to/python with torch, and GNU time (/usr/bin/time). RATES (default "unlimited
# 1gbit 100mbit"), REPS (default 2), EPOCHS (default 3); LATENCY (say 2ms) adds netem's delay
# where the kernel has it; TORCH=0 leaves PyTorch out (Lockstep's runs and limits only);
# VARIANTS (say "packs_256k overlap_256k") runs only those of Lockstep's two-worker settings:
# lockstep (as it comes), packs_256k, bf16, bf16_packs_256k, overlap_256k (packs of 256 KiB
# whose update lands in the next step's forward pass, `--overlap-update`), bf16_overlap_256k,
# and any pack size as packs_BYTES, overlap_BYTES, bf16_packs_BYTES or bf16_overlap_BYTES;
# BIN_DIR (default target/release) is where Lockstep's binaries are, for a build before a
# change beside one after it; MTU (say 9000, jumbo frames) sets the link's MTU (veth's 1500
# otherwise); PIN=1 keeps each Lockstep worker's kernels to a core of its own (worker i's
# `--kernel-cpus i`, in every Lockstep run), as two hosts would.
#
# Figures: examples/s over `fit` (every step, the first included) for both: Lockstep's
# `examples_per_s` (and `comm_wait_share`, the share of worker 0's steps blocked in their
# collectives), PyTorch's `fit_examples_per_s`; each one's steady speed beside it (Lockstep's
# `loop_examples_per_s`, steps 2..N over their time; PyTorch's `steady_examples_per_s`, the
# global batch over the median step); one worker of each alone, for scaling
# efficiency; two one-worker Lockstep jobs at once, one in each namespace (their
# summed examples/s: the compute of a step of two workers on this machine's cores, nothing
# sent); each two-worker Lockstep run's `cpu_cores`, the CPU time of both workers (user and
# system, the kernel's network stack included) over the run's wall time; and beside them the
# link's limit for this model, the examples/s at which a step's gradient bytes (each worker
# sends and receives its 0.9 MB once in a ring of two) take the whole link.
set -euo pipefail
ANCHORS="${ANCHORS:-../shared/anchors/training}"
DATA="${DATA:-../shared/data/mnist}"
PY="${PY:-python3}"
RATES="${RATES:-unlimited 1gbit 100mbit}"
REPS="${REPS:-2}"
EPOCHS="${EPOCHS:-3}"
LATENCY="${LATENCY:-}"
TORCH="${TORCH:-1}"
VARIANTS="${VARIANTS:-}"
PIN="${PIN:-0}"
BIN_DIR="${BIN_DIR:-target/release}"
# MODEL=cnn (the multi-worker tutorial's two-convolution CNN, 225,034 parameters, on the
# anchors' MNIST digits), MODEL=tutorial-literal (the one-convolution model of its
# mnist_setup.py, 2,770,634), or MODEL=cnn-bn-wide (the CNN with batch normalization and
# Dense(2048), 3,318,250, on TRAIN_EXAMPLES images of Fashion-MNIST an epoch, Adam 1e-3; each
# replica's own batch statistics, as DDP's BatchNorm2d; benches/reference/fashion_ddp.py).
MODEL="${MODEL:-cnn}"
TRAIN_EXAMPLES="${TRAIN_EXAMPLES:-8000}"
case $MODEL in
  cnn | tutorial-literal)
    PARAMS=225034 TORCH_MODEL=cnn
    if [ "$MODEL" = tutorial-literal ]; then PARAMS=2770634 TORCH_MODEL=tutorial_cnn; fi
    LS_BIN=mnist_keras LS_RATE=examples_per_s
    LS_ARGS=(--optimizer sgd --learning-rate 0.001 --no-backup --model "$MODEL")
    TORCH_SCRIPT="$ANCHORS/torch_train.py" TORCH_RATE=fit_examples_per_s
    TORCH_ARGS=(--data "$DATA" --model "$TORCH_MODEL" --lr 0.001 --interop 1) ;;
  cnn-bn-wide)
    PARAMS=3318250 LS_BIN=fashion_mnist LS_RATE=loop_examples_per_s
    LS_ARGS=(--model cnn-bn --dense-units 2048 --local-batch-norm --train-examples "$TRAIN_EXAMPLES")
    TORCH_SCRIPT=benches/reference/fashion_ddp.py TORCH_RATE=loop_examples_per_s
    TORCH_ARGS=(--dense-units 2048 --train-examples "$TRAIN_EXAMPLES") ;;
  *) echo "MODEL is cnn, tutorial-literal or cnn-bn-wide" >&2; exit 2 ;;
esac
NS=(lockstep-link0 lockstep-link1)
DEV=(lsl-veth0 lsl-veth1)
ADDR=(10.231.7.1 10.231.7.2)

. "$(dirname "$0")/two_hosts.sh"
two_hosts_up

cargo build --release --quiet -p lockstep-examples --bin "$LS_BIN"

limit() { # rate: netem's delay (and rate) where LATENCY asks and the kernel has it, else tbf
  if [ -n "$LATENCY" ]; then
    local rate=()
    if [ "$1" != unlimited ]; then rate=(rate "$1"); fi
    local applied=true
    for i in 0 1; do
      tc -n "${NS[$i]}" qdisc del dev "${DEV[$i]}" root 2>/dev/null || true
      tc -n "${NS[$i]}" qdisc add dev "${DEV[$i]}" root netem delay "$LATENCY" ${rate[@]+"${rate[@]}"} 2>/dev/null || applied=false
    done
    if $applied; then return; fi
    echo "# no netem in this kernel: LATENCY=$LATENCY not applied"
    LATENCY=""
  fi
  tbf_limit "$1"
}

# The figures of a Lockstep run's stdout as
# `tag,examples_per_s=…,loop_examples_per_s=…,comm_wait_share=…,test_acc=…`: examples_per_s is
# LS_RATE's figure, loop_examples_per_s the steps after the first over their time (a step's
# steady length, without the first step's set-up).
lockstep_figures() { # tag
  awk -v tag="$1" -v rate="$LS_RATE" '/^test_accuracy=/ {
      delete f
      for (i = 1; i <= NF; i++) { n = index($i, "="); if (n) f[substr($i, 1, n - 1)] = substr($i, n + 1) }
      printf "%s,examples_per_s=%s,loop_examples_per_s=%s,comm_wait_share=%s,test_acc=%s\n",
        tag, f[rate], f["loop_examples_per_s"], f["comm_wait_share"], f["test_accuracy"]
    }'
}

# The figures of PyTorch's JSON line in file $2, as
# `tag,examples_per_s=…,steady_examples_per_s=…,test_acc=…` (steady: global batch ÷ the median
# step, torch_train.py's `steady_examples_per_s`; fashion_ddp.py's loop figure).
torch_figures() { # tag file
  "$PY" - "$1" "$2" "$TORCH_RATE" <<'PYEOF'
import json, sys
lines = [l for l in open(sys.argv[2]) if l.startswith("{")]
r = json.loads(lines[-1]) if lines else {}
steady = r.get("steady_examples_per_s", r.get("loop_examples_per_s", 0))
print(f"{sys.argv[1]},examples_per_s={r.get(sys.argv[3], 0):.0f},steady_examples_per_s={steady:.0f},test_acc={r.get('test_acc', 0):.4f}")
PYEOF
}

# The flag that keeps worker $1's kernels to core $1 under PIN=1 (nothing otherwise).
pinned() { if [ "$PIN" = 1 ]; then echo "--kernel-cpus=$1"; fi; }

lockstep() { # tag seed flags...
  local tag=$1 seed=$2 port=$((7200 + RANDOM % 500)) figures
  shift 2
  local cluster="{\"cluster\":{\"worker\":[\"${ADDR[0]}:$port\",\"${ADDR[1]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":IDX}}"
  ip netns exec "${NS[1]}" env TF_CONFIG="${cluster/IDX/1}" /usr/bin/time -o /tmp/lockstep-links.cpu1 \
    -f '%U %S %e' timeout 900 "$BIN_DIR/$LS_BIN" \
    --threads 1 --epochs "$EPOCHS" --seed "$seed" $(pinned 1) "${LS_ARGS[@]}" "$@" >/dev/null 2>&1 &
  figures=$(ip netns exec "${NS[0]}" env TF_CONFIG="${cluster/IDX/0}" /usr/bin/time -o /tmp/lockstep-links.cpu0 \
    -f '%U %S %e' timeout 900 "$BIN_DIR/$LS_BIN" \
    --threads 1 --epochs "$EPOCHS" --seed "$seed" $(pinned 0) "${LS_ARGS[@]}" "$@" 2>/dev/null |
    lockstep_figures "$tag")
  wait
  echo "$figures,cpu_cores=$(cpu_cores /tmp/lockstep-links.cpu0 /tmp/lockstep-links.cpu1)"
}

# Two one-worker Lockstep jobs at once, one in each namespace, 1 thread and batch 64 each:
# their summed examples/s is what two workers compute on this machine with nothing to send.
alone_pair() { # tag seed
  local port=$((7200 + RANDOM % 500)) i
  for i in 0 1; do
    ip netns exec "${NS[$i]}" env TF_CONFIG="{\"cluster\":{\"worker\":[\"${ADDR[$i]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":0}}" \
      timeout 900 "$BIN_DIR/$LS_BIN" --threads 1 --epochs "$EPOCHS" --seed "$2" $(pinned "$i") \
      "${LS_ARGS[@]}" >"/tmp/lockstep-links.pair$i.out" 2>/dev/null &
  done
  wait
  cat /tmp/lockstep-links.pair0.out /tmp/lockstep-links.pair1.out | lockstep_figures x |
    awk -F, -v tag="lockstep_2jobs_at_once.$1" '{ split($2, kv, "="); rates[NR] = kv[2]; sum += kv[2] }
      END { printf "%s,examples_per_s=%d,each=%d/%d\n", tag, sum, rates[1], rates[2] }'
}

alone() { # tag seed: one Lockstep worker and one PyTorch process, 1 thread, batch 64 (no link)
  local port=$((7200 + RANDOM % 500))
  ip netns exec "${NS[0]}" env TF_CONFIG="{\"cluster\":{\"worker\":[\"${ADDR[0]}:$port\"]},\"task\":{\"type\":\"worker\",\"index\":0}}" \
    timeout 900 "$BIN_DIR/$LS_BIN" --threads 1 --epochs "$EPOCHS" --seed "$2" $(pinned 0) \
    "${LS_ARGS[@]}" 2>/dev/null | lockstep_figures "lockstep_1worker.$1"
  if [ "$TORCH" = 0 ]; then return; fi
  ip netns exec "${NS[0]}" env RANK=0 WORLD_SIZE=1 timeout 900 "$PY" "$TORCH_SCRIPT" \
    --batch 64 --epochs "$EPOCHS" --threads 1 --seed "$2" "${TORCH_ARGS[@]}" \
    >/tmp/lockstep-links-torch.alone.out 2>&1
  torch_figures "torch_1worker.$1" /tmp/lockstep-links-torch.alone.out
}

torch() { # tag seed [fp16_hook]
  local tag=$1 seed=$2 port=$((29500 + RANDOM % 500)) launched
  local script=("$TORCH_SCRIPT")
  # DDP's own compression: the script run with `fp16_compress_hook` registered.
  if [ "${3:-}" = fp16_hook ]; then script=(benches/torch_train_fp16_hook.py "$TORCH_SCRIPT"); fi
  launched=$(date +%s.%N)
  for i in 1 0; do
    ip netns exec "${NS[$i]}" env MASTER_ADDR="${ADDR[0]}" MASTER_PORT="$port" RANK="$i" \
      WORLD_SIZE=2 GLOO_SOCKET_IFNAME="${DEV[$i]}" LAUNCH_T="$launched" \
      RESULT_JSON="/tmp/lockstep-links-torch.w$i.json" timeout 900 "$PY" "${script[@]}" \
      --batch 64 --epochs "$EPOCHS" --threads 1 --seed "$seed" "${TORCH_ARGS[@]}" \
      >"/tmp/lockstep-links-torch.w$i.out" 2>&1 &
  done
  wait
  torch_figures "$tag" /tmp/lockstep-links-torch.w0.out
}

variant() { # setting rate rep flags...: one two-worker Lockstep run, when VARIANTS asks for it
  local setting=$1 rate=$2 rep=$3 tag
  shift 3
  if [ -n "$VARIANTS" ] && [[ " $VARIANTS " != *" $setting "* ]]; then return 0; fi
  tag=lockstep_$setting
  if [ "$setting" = lockstep ]; then tag=lockstep; fi
  lockstep "$tag.$rate.r$rep" "$rep" "$@"
}

# One worker of each, for scaling efficiency: 2-worker examples/s ÷ (2 × one worker's).
echo "# one worker, no link"
for rep in $(seq 0 $((REPS - 1))); do alone "r$rep" "$rep"; alone_pair "r$rep" "$rep"; done

for rate in $RATES; do
  limit "$rate"
  case $rate in
    unlimited) echo "# link $rate" ;;
    *) bits=$(numfmt --from=si "$(echo "${rate%bit}" | tr a-z A-Z)")
       # PARAMS parameters of 4 bytes, sent and received once a step by each of 2 workers.
       echo "# link $rate: limit $((bits / 8 * 128 / (PARAMS * 4))) examples/s" ;;
  esac
  for rep in $(seq 0 $((REPS - 1))); do
    if [ "$TORCH" != 0 ]; then
      torch "torch_ddp.$rate.r$rep" "$rep"
      torch "torch_ddp_fp16_hook.$rate.r$rep" "$rep" fp16_hook
    fi
    variant lockstep "$rate" "$rep"
    variant packs_256k "$rate" "$rep" --bytes-per-pack 262144
    variant bf16 "$rate" "$rep" --compression bf16
    variant bf16_packs_256k "$rate" "$rep" --compression bf16 --bytes-per-pack 262144
    variant overlap_256k "$rate" "$rep" --bytes-per-pack 262144 --overlap-update
    variant bf16_overlap_256k "$rate" "$rep" --compression bf16 --bytes-per-pack 262144 \
      --overlap-update
    # Any other pack size VARIANTS names: packs_BYTES, overlap_BYTES, bf16_packs_BYTES,
    # bf16_overlap_BYTES (BYTES a number, say overlap_4194304).
    for setting in $VARIANTS; do
      if [[ $setting =~ ^(bf16_)?(packs|overlap)_([0-9]+)$ ]]; then
        flags=(--bytes-per-pack "${BASH_REMATCH[3]}")
        if [ -n "${BASH_REMATCH[1]}" ]; then flags+=(--compression bf16); fi
        if [ "${BASH_REMATCH[2]}" = overlap ]; then flags+=(--overlap-update); fi
        variant "$setting" "$rate" "$rep" "${flags[@]}"
      fi
    done
  done
done
