//! NCCL all-reduce on this machine's GPUs through `lockstep_cuda::nccl`: the figures beside
//! `benches/torch_nccl_reference.py` (PyTorch's `torch.distributed` with NCCL).
//!
//! One rank per GPU of the machine, one thread each, an in-place SUM all-reduce of f32
//! buffers of 1, 16 and 256 MiB. For each size: the median of 5 runs of 20 back-to-back
//! all-reduces after warm-ups. With several ranks each call of `NcclComm::all_reduce_sum`
//! waits until the sum is in the buffer (that wait is where the timeout is enforced), so the
//! figure is a call's whole cost; a group of one rank queues its calls and the run waits once
//! at its end, as PyTorch's reference does. Bus bandwidth is the
//! algorithm bandwidth × 2(n−1)/n, as nccl-tests reports it: 0 for one rank, whose NCCL moves
//! no data.
//!
//! Run on a machine with a GPU: `cargo run --release -p lockstep-cuda --example nccl_bench`.

use std::time::{Duration, Instant};

use lockstep_cuda::nccl::{self, NcclComm};
use lockstep_cuda::{CudaDevice, device_count};

const RUNS: usize = 5;
const REPEAT: usize = 20;
const SIZES_MIB: [usize; 3] = [1, 16, 256];

fn main() -> anyhow::Result<()> {
    let devices: Vec<CudaDevice> = (0..device_count()?)
        .map(CudaDevice::open)
        .collect::<Result<_, _>>()?;
    let first = devices.first().ok_or_else(|| anyhow::anyhow!("no GPU"))?;
    let (major, minor, patch) = nccl::version()?;
    let ranks = devices.len();
    println!(
        "device: {} × {ranks}; NCCL {major}.{minor}.{patch} (lockstep_cuda::nccl)",
        first.name()
    );
    let mut comms = NcclComm::local_group(&devices, Duration::from_mins(1))?;
    for mib in SIZES_MIB {
        let len = mib * 1024 * 1024 / 4;
        let medians: Vec<anyhow::Result<f64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .iter_mut()
                .map(|comm| scope.spawn(move || median_seconds(comm, len)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
                })
                .collect()
        });
        let seconds = medians
            .into_iter()
            .collect::<anyhow::Result<Vec<f64>>>()?
            .into_iter()
            .fold(0.0_f64, f64::max);
        let algorithm = (mib * 1024 * 1024) as f64 / seconds / 1e9;
        let bus = algorithm * 2.0 * (ranks - 1) as f64 / ranks as f64;
        println!(
            "| NCCL all-reduce, lockstep_cuda::nccl, {ranks} rank(s) | {mib} MiB | {:.1} µs | {algorithm:.1} GB/s algorithm, {bus:.1} GB/s bus |",
            seconds * 1e6
        );
    }
    Ok(())
}

/// The median over [`RUNS`] of one all-reduce's time, each run [`REPEAT`] calls.
fn median_seconds(comm: &mut NcclComm, len: usize) -> anyhow::Result<f64> {
    let mut buffer = comm.device().upload(&vec![1.0; len])?;
    for _ in 0..5 {
        comm.all_reduce_sum(&mut buffer)?;
    }
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        for _ in 0..REPEAT {
            comm.all_reduce_sum(&mut buffer)?;
        }
        // A group of one queues its calls without waiting: wait once, as PyTorch's does.
        comm.device().synchronize()?;
        times.push(started.elapsed().as_secs_f64() / REPEAT as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[RUNS / 2])
}
