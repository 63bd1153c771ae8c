"""Writes keras_reference.json beside this file: the value tf_keras 2.21 (Keras 2, on
TensorFlow 2.21) gives each loss and metric on fixed inputs, for crates/nn/tests/keras_values.rs.

Run from any directory with a Python that has tensorflow-cpu 2.21 and tf_keras 2.21:
    python crates/nn/tests/data/keras_reference.py
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tf_keras as keras  # noqa: E402


def values(n, scale, offset, salt):
    """Deterministic values in [offset, offset + scale)."""
    return [offset + scale * (((i * 37 + salt * 11) % 97) / 97.0) for i in range(n)]


def probabilities(rows, cols, salt):
    raw = np.array(values(rows * cols, 1.0, 0.05, salt), dtype=np.float32).reshape(rows, cols)
    return (raw / raw.sum(axis=1, keepdims=True)).astype(np.float32)


rows, cols = 6, 4
logits = np.array(values(rows * cols, 6.0, -3.0, 1), dtype=np.float32).reshape(rows, cols)
probs = probabilities(rows, cols, 2)
class_ids = np.array([0, 3, 1, 2, 3, 1])
one_hot = np.eye(cols, dtype=np.float32)[class_ids]
binary = np.array(values(rows * cols, 1.0, 0.0, 3), dtype=np.float32).reshape(rows, cols)
binary_targets = (binary > 0.5).astype(np.float32)
regression = np.array(values(rows * cols, 4.0, -2.0, 4), dtype=np.float32).reshape(rows, cols)
weights = np.array([1.0, 0.5, 0.0, 2.0, 1.5, 1.0], dtype=np.float32)

cases = []


def loss_case(name, loss, y_true, y_pred, config):
    for weighted in (False, True):
        w = weights if weighted else None
        value = float(loss(y_true, y_pred, sample_weight=w).numpy())
        cases.append({"kind": "loss", "name": name, "config": config,
                      "y_true": np.asarray(y_true, np.float32).ravel().tolist(),
                      "y_pred": y_pred.ravel().tolist(), "shape": list(y_pred.shape),
                      "sample_weight": None if w is None else w.tolist(), "expected": value})


L = keras.losses
loss_case("sparse_categorical_crossentropy", L.SparseCategoricalCrossentropy(from_logits=True),
          class_ids, logits, {"from_logits": True})
loss_case("sparse_categorical_crossentropy", L.SparseCategoricalCrossentropy(), class_ids, probs,
          {"from_logits": False})
loss_case("categorical_crossentropy", L.CategoricalCrossentropy(from_logits=True), one_hot,
          logits, {"from_logits": True, "label_smoothing": 0.0})
loss_case("categorical_crossentropy",
          L.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1), one_hot, logits,
          {"from_logits": True, "label_smoothing": 0.1})
loss_case("categorical_crossentropy", L.CategoricalCrossentropy(label_smoothing=0.2), one_hot,
          probs, {"from_logits": False, "label_smoothing": 0.2})
loss_case("binary_crossentropy", L.BinaryCrossentropy(from_logits=True), binary_targets, logits,
          {"from_logits": True, "label_smoothing": 0.0})
loss_case("binary_crossentropy", L.BinaryCrossentropy(label_smoothing=0.1), binary_targets,
          binary, {"from_logits": False, "label_smoothing": 0.1})
loss_case("mean_squared_error", L.MeanSquaredError(), regression, logits, {})
loss_case("mean_absolute_error", L.MeanAbsoluteError(), regression, logits, {})
loss_case("huber", L.Huber(), regression, logits, {"delta": 1.0})
loss_case("huber", L.Huber(delta=2.5), regression, logits, {"delta": 2.5})


def metric_case(name, metric, y_true, y_pred):
    for weighted in (False, True):
        m = metric()
        w = weights if weighted else None
        m.update_state(y_true, y_pred, sample_weight=w)
        cases.append({"kind": "metric", "name": name, "config": {},
                      "y_true": np.asarray(y_true, np.float32).ravel().tolist(),
                      "y_pred": y_pred.ravel().tolist(), "shape": list(y_pred.shape),
                      "sample_weight": None if w is None else w.tolist(),
                      "expected": float(m.result().numpy())})


M = keras.metrics
metric_case("sparse_categorical_accuracy", M.SparseCategoricalAccuracy, class_ids, probs)
metric_case("categorical_accuracy", M.CategoricalAccuracy, one_hot, probs)
metric_case("top_k_categorical_accuracy", M.TopKCategoricalAccuracy, one_hot, probs)
metric_case("binary_accuracy", M.BinaryAccuracy, binary_targets, binary)
metric_case("mean_squared_error", M.MeanSquaredError, regression, logits)
metric_case("mean_absolute_error", M.MeanAbsoluteError, regression, logits)
metric_case("precision", M.Precision, binary_targets, binary)
metric_case("recall", M.Recall, binary_targets, binary)
metric_case("auc", M.AUC, binary_targets, binary)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_reference.json")
with open(out, "w") as f:
    json.dump({"source": f"tf_keras {keras.__version__}", "cases": cases}, f, indent=1)
    f.write("\n")
print(f"{len(cases)} cases written to {out}")
