"""TensorFlow 2.21's ParameterServerStrategy + ClusterCoordinator on this machine, for
benches/side_by_side_ps.sh: the shape of ../shared/anchors/training/tf_ps_strategy.py (an
in-process cluster of tf.distribute.Server: 2 workers and 1 ps; SGD 0.01, batch 64, random
inputs) with its measurement split: WARMUP steps scheduled and joined first (tf.function
tracing, the first RPCs), then STEPS steps timed from the first schedule to the join. The
model: `mlp`, the anchor's 784-128-10, `cnn`, the multi-worker tutorial's CNN (Lockstep's
`models::mnist_cnn`), or `embedding`, the `recommender` example's click model (an Embedding
table of 2^20 rows of 16 on pairs of ids, Flatten, Dense 64 relu, Dense 2) with every
variable cut into 4 shards by FixedShardsPartitioner, on random ids and labels: TensorFlow
looks up the rows on the ps tasks and sends back IndexedSlices gradients. Prints one line: `tf,MODEL,ex_per_s=…,warm_ex_per_s=…,peak_rss_mib=…`
(the whole in-process cluster's peak memory: every task lives in this one process).

Usage: python tf_ps_reference.py [--model mlp|cnn|embedding] [--steps 200] [--warmup 20] [--workers 2] [--ps 1]
"""
import argparse, os, resource, socket, time
os.environ["GRPC_FAIL_FAST"] = "use_caller"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--ps", type=int, default=1)
parser.add_argument("--model", choices=["mlp", "cnn", "embedding"], default="mlp")
args = parser.parse_args()
if args.model == "embedding":
    # Keras 3's variables cannot be a ShardedVariable ("'ShardedVariable' object has no
    # attribute 'handle'"): sharded variables need Keras 2, tf_keras.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf


def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


spec = {"worker": [f"localhost:{port()}" for _ in range(args.workers)],
        "ps": [f"localhost:{port()}" for _ in range(args.ps)]}
cluster = tf.train.ClusterSpec(spec)
config = tf.compat.v1.ConfigProto(); config.inter_op_parallelism_threads = 4
for i in range(args.workers):
    tf.distribute.Server(cluster, job_name="worker", task_index=i, protocol="grpc", config=config, start=True)
for i in range(args.ps):
    tf.distribute.Server(cluster, job_name="ps", task_index=i, protocol="grpc", start=True)
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
partitioner = (tf.distribute.experimental.partitioners.FixedShardsPartitioner(num_shards=4)
               if args.model == "embedding" else None)
strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
ROWS = 1 << 20
if args.model == "embedding":
    shape = (2,)
    x = np.random.randint(0, ROWS, (8000, 2)).astype("int64"); y = np.random.randint(0, 2, 8000)
else:
    shape = (784,) if args.model == "mlp" else (28, 28, 1)
    x = np.random.rand(8000, *shape).astype("float32"); y = np.random.randint(0, 10, 8000)


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8000).batch(64).repeat()


with strategy.scope():
    if args.model == "mlp":
        layers = [tf.keras.layers.Dense(128, activation="relu"), tf.keras.layers.Dense(10)]
    elif args.model == "embedding":
        layers = [tf.keras.layers.Embedding(ROWS, 16, input_length=2), tf.keras.layers.Flatten(),
                  tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(2)]
    else:
        layers = [tf.keras.layers.Conv2D(32, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
                  tf.keras.layers.Conv2D(64, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
                  tf.keras.layers.Flatten(), tf.keras.layers.Dense(128, activation="relu"),
                  tf.keras.layers.Dense(10)]
    model = tf.keras.Sequential(layers)
    model.build((None, *shape))
    optimizer = tf.keras.optimizers.SGD(0.01)
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step(iterator):
    def fn(bx, by):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(by, model(bx), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    bx, by = next(iterator)
    return strategy.run(fn, args=(bx, by))


started = time.time()
for _ in range(args.warmup):
    coordinator.schedule(step, args=(iterator,))
coordinator.join()
warm = time.time()
for _ in range(args.steps):
    coordinator.schedule(step, args=(iterator,))
coordinator.join()
done = time.time()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"tf,{args.model},ex_per_s={(args.warmup + args.steps) * 64 / (done - started):.0f},"
      f"warm_ex_per_s={args.steps * 64 / (done - warm):.0f},peak_rss_mib={peak}")
