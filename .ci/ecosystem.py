"""Checks that other programs read what Lockstep writes, as a user's tools would.

Usage: ecosystem.py STDOUT TENSORBOARD_DIR WEIGHTS MNIST_DIR

STDOUT is what `mnist_keras --tensorboard-dir TENSORBOARD_DIR --checkpoint-path WEIGHTS`
printed (one worker). TensorBoard's own reader must load every epoch's loss and accuracy with
its step and the value the program printed; the weights, opened with `safetensors` and run
through the tutorial CNN's forward pass in numpy on MNIST's test split, must give the test
accuracy the program printed.
"""

import gzip
import re
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def fail(message):
    print(f"ecosystem check failed: {message}")
    sys.exit(1)


def printed(stdout):
    epochs = {}
    test_accuracy = None
    for line in Path(stdout).read_text().splitlines():
        m = re.match(r"Epoch (\d+)/\d+ - .* - accuracy: ([0-9.]+) - loss: ([0-9.]+)$", line)
        if m:
            epochs[int(m.group(1)) - 1] = {"accuracy": float(m.group(2)), "loss": float(m.group(3))}
        m = re.match(r"test_accuracy=([0-9.]+) ", line)
        if m:
            test_accuracy = float(m.group(1))
    if not epochs or test_accuracy is None:
        fail(f"no epoch lines or no test accuracy in {stdout}")
    return epochs, test_accuracy


def check_tensorboard(log_dir, epochs):
    events = EventAccumulator(str(Path(log_dir) / "train"))
    events.Reload()
    for name in ("loss", "accuracy"):
        scalars = events.Scalars(f"epoch_{name}")
        steps = [s.step for s in scalars]
        if steps != sorted(epochs):
            fail(f"epoch_{name} has steps {steps}, the program ran epochs {sorted(epochs)}")
        for s in scalars:
            want = epochs[s.step][name]
            # Printed with 4 decimals; stored as f32.
            if abs(s.value - want) > 6e-5:
                fail(f"epoch_{name} at step {s.step} is {s.value}, the program printed {want}")
    print(f"TensorBoard's reader: epoch_loss and epoch_accuracy for steps {sorted(epochs)} match")


def idx(path):
    data = gzip.open(path).read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def conv_relu(x, kernel, bias):
    windows = np.lib.stride_tricks.sliding_window_view(x, kernel.shape[:2], axis=(1, 2))
    return np.maximum(np.einsum("nhwcij,ijcf->nhwf", windows, kernel, optimize=True) + bias, 0)


def max_pool(x):
    n, h, w, c = x.shape
    return x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def check_weights(weights, mnist_dir, test_accuracy):
    w = load_file(weights)
    images = idx(Path(mnist_dir) / "t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    labels = idx(Path(mnist_dir) / "t10k-labels-idx1-ubyte.gz")
    correct = 0
    for start in range(0, len(images), 250):
        x = images[start: start + 250, :, :, None]
        x = max_pool(conv_relu(x, w["conv2d/kernel"], w["conv2d/bias"]))
        x = max_pool(conv_relu(x, w["conv2d_1/kernel"], w["conv2d_1/bias"]))
        x = x.reshape(len(x), -1)
        x = np.maximum(x @ w["dense/kernel"] + w["dense/bias"], 0)
        logits = x @ w["dense_1/kernel"] + w["dense_1/bias"]
        correct += int((logits.argmax(axis=1) == labels[start: start + 250]).sum())
    accuracy = correct / len(images)
    # Printed with 4 decimals; a logit within float rounding of a tie may flip one example.
    if abs(accuracy - test_accuracy) > 1.0 / len(images) + 5e-5:
        fail(f"numpy's forward pass gives accuracy {accuracy:.4f}, the program printed {test_accuracy}")
    print(f"numpy forward pass over {len(images)} test digits: accuracy {accuracy:.4f} (printed {test_accuracy})")


def main():
    stdout, log_dir, weights, mnist_dir = sys.argv[1:5]
    epochs, test_accuracy = printed(stdout)
    check_tensorboard(log_dir, epochs)
    check_weights(weights, mnist_dir, test_accuracy)


if __name__ == "__main__":
    main()
