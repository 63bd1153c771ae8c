"""PyTorch's NCCL all-reduce on one GPU: the reference beside `nccl_bench` (lockstep-cuda).

One process, one rank (`torch.distributed` with the NCCL backend, world size 1), an in-place
SUM all-reduce of f32 buffers of 1 MiB to 256 MiB. For each size: the median of 5 runs of 20
back-to-back all-reduces after warm-ups, timed between `torch.cuda.synchronize()` calls, and
the algorithm bandwidth (bytes of the buffer per second). The bus bandwidth of nccl-tests is
the algorithm bandwidth × 2(n−1)/n, which is 0 for one rank: with one rank NCCL copies the
buffer on the device, so what this measures is the cost of one call (launch, NCCL's
bookkeeping, the copy). Run on the GPU machine: `python3 benches/torch_nccl_reference.py`.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

RUNS = 5
REPEAT = 20
SIZES_MIB = [1, 16, 256]


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    for mib in SIZES_MIB:
        buffer = torch.ones(mib * 1024 * 1024 // 4, device="cuda")
        for _ in range(5):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            for _ in range(REPEAT):
                dist.all_reduce(buffer)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / REPEAT)
        seconds = statistics.median(times)
        print(f"| NCCL all-reduce, torch.distributed, 1 rank | {mib} MiB | "
              f"{seconds * 1e6:.1f} µs | {mib * 1024 * 1024 / seconds / 1e9:.1f} GB/s |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
