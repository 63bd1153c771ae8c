#!/usr/bin/env bash
# Parameter-server training beside TensorFlow 2.21's ParameterServerStrategy on this machine:
# the same cluster shape (2 workers; 1 ps, 2 for the embedding model), model (MODELS: the
# 784 → 128 → 10 MLP of the anchor, the multi-worker tutorial's CNN, and `embedding`, the
# `recommender` example's click model on a table of 2^20 rows cut into 4 shards), optimizer
# (SGD 0.01) and batch (64 a step), interleaved, every run's figure printed.
#
# TensorFlow: benches/reference/tf_ps_reference.py, an in-process cluster of
# tf.distribute.Server (../shared/anchors/training/tf_ps_strategy.py's shape), 20 steps of
# warm-up (tf.function tracing, the first RPCs) then 200 timed: `warm_ex_per_s`; `ex_per_s`
# counts the warm-up too. Its peak memory is the one process that holds every task.
# Lockstep: `mnist_parameter_server --model MODEL` (or `recommender` for `embedding`, on its
# generated clicks) under `cargo xtask run-cluster` (a process per task: chief, 2 workers,
# the ps tasks; one kernel thread each), 3 epochs of 200 steps on the embedded MNIST subset:
# `examples_per_s` over the whole `fit`, its first steps included; `peak_rss_mib` of each task.
#
# Usage: benches/side_by_side_ps.sh   (from the repository root)
# Needs: PY=/path/to/python with tensorflow-cpu 2.21. REPS (default 3) repetitions; MODELS
# (default "mlp cnn embedding").
set -euo pipefail
PY="${PY:-python3}"
REPS="${REPS:-3}"
MODELS="${MODELS:-mlp cnn embedding}"
export TF_CPP_MIN_LOG_LEVEL=2 RUST_BACKTRACE=0

cargo build --release --quiet -p lockstep-examples --bin mnist_parameter_server --bin recommender

ps_tasks() { # model
  if [ "$1" = embedding ]; then echo 2; else echo 1; fi
}

tensorflow() { # model
  "$PY" benches/reference/tf_ps_reference.py --model "$1" --steps 200 --warmup 20 --workers 2 \
    --ps "$(ps_tasks "$1")" 2>/dev/null | tail -1 || echo "# FAILED: tf $1"
}

lockstep() { # model
  if [ "$1" = embedding ]; then
    set -- "$1" --example recommender -- --shards 4
  else
    set -- "$1" --example mnist_parameter_server -- --model "$1" --no-backup
  fi
  cargo xtask run-cluster --workers 2 --ps "$(ps_tasks "$1")" --chief "${@:2}" \
    --optimizer sgd --learning-rate 0.01 --epochs 3 --steps-per-epoch 200 \
    --threads 1 2>/dev/null |
    awk '/examples_per_s=/ { for (i = 1; i <= NF; i++) if ($i ~ /^examples_per_s=/) rate = $i }
         /peak_rss_mib=/ { for (i = 1; i <= NF; i++) if ($i ~ /^peak_rss_mib=/) { split($i, kv, "="); peaks = peaks sep $1 kv[2]; sep = " " } }
         END { print "lockstep,'"$1"'," rate ",peak_rss_mib_per_task=" peaks }'
}

for rep in $(seq 1 "$REPS"); do
  for model in $MODELS; do
    tensorflow "$model"
    lockstep "$model"
  done
done
