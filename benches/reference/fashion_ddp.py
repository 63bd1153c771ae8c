"""PyTorch DDP (gloo) training `fashion_mnist --model cnn-bn --local-batch-norm
--dense-units U` beside Lockstep, for benches/side_by_side_links.sh: the CNN with batch
normalization after each convolution (BatchNorm2d at Keras' epsilon and momentum, each
process's own batch statistics as DDP leaves them), Dense(U), Adam 1e-3, per-process batch 64,
the first N images of Fashion-MNIST's training set after a seeded shuffle.

Cluster from the environment, as torch_train.py: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
(absent or 1: one process, no DDP). Prints one JSON line on rank 0 with `loop_examples_per_s`
(global examples of steps 2..N over the time from the end of step 1 to the end of step N,
as Lockstep's `loop_examples_per_s`) and `test_acc`.
"""
import argparse
import json
import os
import time

import numpy as np
from idx import idx as read_idx
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--dense-units", type=int, default=128)
p.add_argument("--train-examples", type=int, default=60000)
p.add_argument("--batch", type=int, default=64, help="per-process batch size")
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.set_num_threads(args.threads)
torch.set_num_interop_threads(1)
torch.manual_seed(args.seed)
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)


def idx(name):
    return read_idx(args.data, name)


order = np.random.default_rng(args.seed).permutation(60000)[: args.train_examples]
x_train = torch.from_numpy(idx("train-images-idx3-ubyte.gz")[order].astype(np.float32) / 255.0)
y_train = torch.from_numpy(idx("train-labels-idx1-ubyte.gz")[order].astype(np.int64))
x_test = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
y_test = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
x_train, x_test = x_train[:, None], x_test[:, None]


def block(cin, cout):
    # Keras' BatchNormalization: epsilon 1e-3, momentum 0.99 (PyTorch's momentum is 1 - that).
    return [nn.Conv2d(cin, cout, 3, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01),
            nn.ReLU(), nn.MaxPool2d(2)]


model = nn.Sequential(*block(1, 32), *block(32, 64), nn.Flatten(),
                      nn.Linear(64 * 5 * 5, args.dense_units), nn.ReLU(),
                      nn.Linear(args.dense_units, 10))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

# Each process its contiguous share of the examples, in whole global batches.
per_rank = len(x_train) // world
mine = slice(rank * per_rank, (rank + 1) * per_rank)
xs, ys = x_train[mine], y_train[mine]
steps = per_rank // args.batch
ends = []
model.train()
for epoch in range(args.epochs):
    for s in range(steps):
        xb, yb = xs[s * args.batch:(s + 1) * args.batch], ys[s * args.batch:(s + 1) * args.batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        ends.append(time.time())
net = model.module if world > 1 else model
net.eval()
with torch.no_grad():
    pred = torch.cat([net(x_test[i:i + 1000]).argmax(1) for i in range(0, len(x_test), 1000)])
test_acc = float((pred == y_test).float().mean())
loop = (len(ends) - 1) * args.batch * world / (ends[-1] - ends[0]) if len(ends) > 1 else 0.0
if world > 1:
    dist.barrier()
    dist.destroy_process_group()
if rank == 0:
    print(json.dumps({"loop_examples_per_s": loop, "test_acc": test_acc, "steps": len(ends)}))
