#!/usr/bin/env bash
# Test accuracy of the multi-worker tutorial's CNN trained with Adam (2 workers on this host,
# global batch 128, 3 epochs, learning rate 0.001), Lockstep's `mnist_keras` beside
# TensorFlow's MultiWorkerMirrored with tf_keras on the same configuration, one seed after the
# other. Both programs are deterministic per seed, so each seed's figure reproduces exactly.
#
# Usage: benches/adam_accuracy.sh   (from the repository root)
# Needs: PY=/path/to/python with tensorflow-cpu 2.21 and tf_keras 2.21 (see
# ../shared/anchors/training/README.md). SEEDS (default "0 1 2 3 4 5 6 7 8 9").
set -euo pipefail
ANCHORS="${ANCHORS:-../shared/anchors/training}"
DATA="${DATA:-../shared/data/mnist}"
PY="${PY:-python3}"
SEEDS="${SEEDS:-0 1 2 3 4 5 6 7 8 9}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2

cargo build --release --quiet -p lockstep-examples --bin mnist_keras

for seed in $SEEDS; do
  lockstep=$(cargo xtask run-cluster --example mnist_keras -- --threads 1 --seed "$seed" \
    --no-backup 2>/dev/null | sed -n 's/^\[worker:0\] test_accuracy=\([0-9.]*\) .*/\1/p')
  "$PY" "$ANCHORS/launch.py" --nproc 2 --cluster tf --out "$WORK" --tag "tf$seed" -- \
    "$ANCHORS/tf_train.py" --data "$DATA" --model cnn --batch 64 --epochs 3 --strategy mwms \
    --keras legacy --optimizer adam --lr 0.001 --intra 1 --inter 1 --data-threads 1 \
    --seed "$seed" >/dev/null 2>&1 || echo "# FAILED: tf seed $seed"
  tf=$("$PY" - "$ANCHORS" "$WORK/tf$seed.json" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[1])
from summarize import run_metrics
print(f"{run_metrics(json.load(open(sys.argv[2])))['acc']:.4f}")
PYEOF
)
  echo "seed=$seed lockstep_test_acc=$lockstep tf_test_acc=$tf"
done
