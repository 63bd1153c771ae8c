"""TensorFlow (Keras 3) or PyTorch training the Fashion-MNIST models of Lockstep's
`fashion_mnist` example, for benches/side_by_side_models.sh: one process, the same data
(Debian's dataset-fashion-mnist), batch, optimizer (Adam 1e-3) and epochs.

Prints one line: framework, model, loop_ex_per_s (global examples of steps 2..N over the time
from the end of step 1 to the end of step N), first_step_s (from process start), test_acc.
"""
import argparse
import os
import time

START = time.time()

p = argparse.ArgumentParser()
p.add_argument("--framework", choices=["tf", "torch"], required=True)
p.add_argument("--model", choices=["mlp", "cnn-bn"], required=True)
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

import numpy as np
from idx import idx as read_idx  # noqa: E402


def idx(name):
    return read_idx(args.data, name)


x_train = idx("train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
y_train = idx("train-labels-idx1-ubyte.gz").astype(np.int64)
x_test = idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
y_test = idx("t10k-labels-idx1-ubyte.gz").astype(np.int64)
if args.model == "mlp":
    x_train, x_test = x_train.reshape(-1, 784), x_test.reshape(-1, 784)
else:
    x_train, x_test = x_train[..., None], x_test[..., None]
steps = args.epochs * (len(x_train) // args.batch)


def report(first_end, end, accuracy):
    loop = (steps - 1) * args.batch / (end - first_end)
    print(f"{args.framework},{args.model},loop_ex_per_s={loop:.0f},"
          f"first_step_s={first_end - START:.2f},test_acc={accuracy:.4f}", flush=True)


def run_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.keras.utils.set_random_seed(args.seed)
    layers = tf.keras.layers
    if args.model == "mlp":
        inputs = tf.keras.Input(shape=(784,))
        x = layers.Dense(64, activation="relu")(inputs)
        x = layers.Dense(64, activation="relu")(x)
    else:
        inputs = tf.keras.Input(shape=(28, 28, 1))
        x = inputs
        for filters in (32, 64):
            x = layers.Conv2D(filters, 3, use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            x = layers.ReLU()(x)
            x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(x)
        x = layers.Dense(128, activation="relu")(x)
    outputs = layers.Dense(10)(x)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    data = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train), seed=args.seed).batch(args.batch, drop_remainder=True)
            .prefetch(2))
    marks = {}

    class Clock(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 and "first" not in marks:
                marks["first"] = time.time()

    model.fit(data, epochs=args.epochs, verbose=0, callbacks=[Clock()])
    end = time.time()
    _, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    report(marks["first"], end, accuracy)


def run_torch():
    import torch
    from torch import nn
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 10))
        to_input = torch.from_numpy
    else:
        # Keras' ε and momentum (PyTorch's momentum is the new value's weight).
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, bias=False),
                    nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU(), nn.MaxPool2d(2)]
        model = nn.Sequential(*block(1, 32), *block(32, 64), nn.Flatten(),
                              nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10))

        def to_input(a):
            return torch.from_numpy(a).permute(0, 3, 1, 2).contiguous()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    generator = np.random.default_rng(args.seed)
    first = None
    model.train()
    for _ in range(args.epochs):
        order = generator.permutation(len(x_train))
        for step in range(len(x_train) // args.batch):
            batch = order[step * args.batch:(step + 1) * args.batch]
            x, y = to_input(x_train[batch]), torch.from_numpy(y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if first is None:
                first = time.time()
    end = time.time()
    model.eval()
    with torch.no_grad():
        logits = model(to_input(x_test))
        accuracy = (logits.argmax(1).numpy() == y_test).mean()
    report(first, end, accuracy)


run_tf() if args.framework == "tf" else run_torch()
