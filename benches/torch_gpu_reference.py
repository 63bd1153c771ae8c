"""PyTorch eager on the GPU: the reference figures of `cargo xtask gpu-check`'s benchmark.

- SGEMM: 4096×4096×4096 f32 `torch.matmul` with TF32 off (full f32, as cuBLAS SGEMM).
- The multi-worker tutorial's CNN (Conv2D(32, 3×3, relu) → MaxPool 2×2 → Conv2D(64, 3×3,
  relu) → MaxPool 2×2 → Flatten → Dense(128, relu) → Dense(10)), one Adam training step
  (forward, sparse softmax cross-entropy, backward, update) at batches 64 and 512 on random
  28×28 images, the loss read back each step as a training loop reads it.

Each figure: the median of 5 runs after warm-ups, timed between `torch.cuda.synchronize()`
calls. Run on the GPU machine beside `run.sh` of `cargo xtask gpu-check`:
`python3 benches/torch_gpu_reference.py`.
"""

import statistics
import time

import torch

RUNS = 5


def median_seconds(work, repeat):
    work()
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(repeat):
            work()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)


def sgemm(n=4096):
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.full((n, n), 0.5, device="cuda")
    b = torch.full((n, n), 0.25, device="cuda")
    seconds = median_seconds(lambda: torch.matmul(a, b), 10)
    print(f"| SGEMM (torch.matmul, f32) | {n}×{n}×{n} | {2 * n**3 / seconds / 1e12:.1f} TFLOP/s |")


def cnn_step(batch):
    torch.backends.cudnn.allow_tf32 = False
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(1600, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    images = torch.rand(batch, 1, 28, 28, device="cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(10):
        step()
    seconds = median_seconds(step, 50)
    print(f"| CNN training step (PyTorch eager, Adam) | batch {batch} | "
          f"{seconds * 1e3:.3f} ms, {batch / seconds:,.0f} examples/s |")


if __name__ == "__main__":
    print(f"device: {torch.cuda.get_device_name()} (PyTorch {torch.__version__})")
    print("| measurement | size | figure |")
    print("|---|---|---|")
    sgemm()
    for batch in (64, 512):
        cnn_step(batch)
