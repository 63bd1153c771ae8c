#!/usr/bin/env bash
# Training the multi-worker tutorial's CNN, 2 workers × 1 thread on 127.0.0.1, global batch
# 128, 3 epochs, SGD lr 1e-3: Lockstep's `mnist_keras` (Keras-style `fit`, without and with
# `BackupAndRestore`; the references save nothing) beside the references of ../shared/anchors/training
# (TensorFlow 2.21 MultiWorkerMirroredStrategy with tf_keras, pinned threads; PyTorch DDP over
# gloo, 1 thread), interleaved, every run's figure printed; then `fit` against
# `mnist_custom_loop` on the same work (Adam, no backup), and the test accuracy of `fit` with
# Adam beside TensorFlow's on the same configuration (the repetition is the seed of both).
#
# Usage: benches/side_by_side_training.sh   (from the repository root)
# Needs: PY=/path/to/python with tensorflow-cpu 2.21, tf_keras 2.21 and torch (see
# ../shared/anchors/training/README.md). REPS (default 3) repetitions; the repetition is also
# the seed.
#
# Figures: the references' "loop ex/s" (global examples of steps 2..N over the time from the
# end of step 1 to the end of step N, the anchors' headline) and peak RSS per process;
# Lockstep's `examples_per_s` (every step of `fit`, first included, over fit's wall time),
# `first_step_s` (process start to the end of step 1) and `peak_rss_mib`.
set -euo pipefail
ANCHORS="${ANCHORS:-../shared/anchors/training}"
DATA="${DATA:-../shared/data/mnist}"
PY="${PY:-python3}"
REPS="${REPS:-3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2

cargo build --release --quiet -p lockstep-examples --bin mnist_keras --bin mnist_custom_loop

anchor() { # tag cluster script args...
  local tag=$1 cluster=$2
  shift 2
  "$PY" "$ANCHORS/launch.py" --nproc 2 --cluster "$cluster" --out "$WORK" --tag "$tag" -- "$@" \
    >/dev/null 2>&1 || echo "# FAILED: $tag"
  "$PY" - "$ANCHORS" "$WORK/$tag.json" "$tag" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[1])
from summarize import run_metrics
m = run_metrics(json.load(open(sys.argv[2])))
print(f"{sys.argv[3]},loop_ex_per_s={m['loop_eps']:.0f},first_step_s={m['first']:.2f},peak_rss_mib={m['rss']:.0f},test_acc={m['acc']:.4f}")
PYEOF
}

lockstep() { # tag example args...
  local tag=$1 example=$2
  shift 2
  cargo xtask run-cluster --example "$example" -- "$@" 2>/dev/null |
    sed -n 's/^\[worker:0\] test_accuracy=\([0-9.]*\) .* examples_per_s=\([0-9]*\)\(.*\)$/'"$tag"',examples_per_s=\2\3,test_acc=\1/p' |
    sed 's/ loop_examples_per_s=/,loop_examples_per_s=/; s/ comm_wait_share=/,comm_wait_share=/; s/ first_step_s=/,first_step_s=/; s/ peak_rss_mib=/,peak_rss_mib=/'
}

for rep in $(seq 0 $((REPS - 1))); do
  anchor "tf_mwms.r$rep" tf "$ANCHORS/tf_train.py" --data "$DATA" --model cnn --batch 64 --epochs 3 \
    --strategy mwms --keras legacy --lr 0.001 --intra 1 --inter 1 --data-threads 1 --seed "$rep"
  lockstep "lockstep_fit_sgd.r$rep" mnist_keras --threads 1 --optimizer sgd --learning-rate 0.001 \
    --seed "$rep" --no-backup
  lockstep "lockstep_fit_sgd_backup.r$rep" mnist_keras --threads 1 --optimizer sgd \
    --learning-rate 0.001 --seed "$rep" --backup-dir "$WORK/backup"
  anchor "torch_ddp.r$rep" torch "$ANCHORS/torch_train.py" --data "$DATA" --model cnn --batch 64 \
    --epochs 3 --lr 0.001 --threads 1 --interop 1 --seed "$rep"
  lockstep "lockstep_custom_loop_adam.r$rep" mnist_custom_loop --threads 1 --seed "$rep"
  lockstep "lockstep_fit_adam.r$rep" mnist_keras --threads 1 --seed "$rep" --no-backup
  anchor "tf_mwms_adam.r$rep" tf "$ANCHORS/tf_train.py" --data "$DATA" --model cnn --batch 64 \
    --epochs 3 --strategy mwms --keras legacy --optimizer adam --lr 0.001 --intra 1 --inter 1 \
    --data-threads 1 --seed "$rep"
done
