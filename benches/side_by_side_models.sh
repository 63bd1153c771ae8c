#!/usr/bin/env bash
# The Fashion-MNIST models users bring (the Keras guide's functional MLP, 784 → 64 → 64 → 10;
# the CNN with batch normalization after each convolution) trained for one epoch of the full
# 60,000 images, batch 64, Adam 1e-3, one process on all cores: Lockstep's `fashion_mnist`
# beside TensorFlow (Keras 3) and PyTorch running benches/reference/fashion_reference.py,
# interleaved, every run's figure printed.
#
# Usage: benches/side_by_side_models.sh   (from the repository root)
# Needs: PY=/path/to/python with tensorflow-cpu 2.21 and torch; Debian's dataset-fashion-mnist.
# REPS (default 3) repetitions; THREADS (default 2) threads for every framework; MODELS
# (default "mlp cnn-bn") the models to run.
#
# Figures: every framework's loop_ex_per_s, measured alike: the examples of steps 2..N over
# the time from the end of step 1 to the end of step N (Lockstep's from its StepClock callback).
# Lockstep also prints examples_per_s: every step of `fit`, the first and the data set's
# fingerprint included, and the test set's evaluation, over their wall time.
set -euo pipefail
PY="${PY:-python3}"
REPS="${REPS:-3}"
THREADS="${THREADS:-2}"
MODELS="${MODELS:-mlp cnn-bn}"
export TF_CPP_MIN_LOG_LEVEL=2

cargo build --release --quiet -p lockstep-examples --bin fashion_mnist

reference() { # framework model seed
  "$PY" benches/reference/fashion_reference.py --framework "$1" --model "$2" --seed "$3" \
    --threads "$THREADS" 2>/dev/null | tail -1 || echo "# FAILED: $1 $2"
}

lockstep() { # model seed
  target/release/fashion_mnist --model "$1" --seed "$2" --epochs 1 --threads "$THREADS" \
    2>/dev/null |
    sed -n 's/^test_accuracy=\([0-9.]*\) .* examples_per_s=\([0-9]*\) loop_examples_per_s=\([0-9]*\) .*$/lockstep,'"$1"',loop_ex_per_s=\3,examples_per_s=\2,test_acc=\1/p'
}

for rep in $(seq 0 $((REPS - 1))); do
  for model in $MODELS; do
    reference tf "$model" "$rep"
    lockstep "$model" "$rep"
    reference torch "$model" "$rep"
  done
done
