//! The GPU benchmark of `cargo xtask gpu-check`: SGEMM through cuBLAS at 4096² and memory
//! copy bandwidth (host to device, device to host, on the device), one table.
//!
//! Each figure is the median of 5 runs of back-to-back operations after a warm-up, timed from
//! one device synchronisation to the next. Run on a machine with a GPU:
//! `cargo run --release -p lockstep-cuda --example gpu_bench`.

use std::time::Instant;

use lockstep_cuda::ops::{self, MatRef};
use lockstep_cuda::{CudaDevice, CudaError};

/// Runs of each measurement; the median is reported.
const RUNS: usize = 5;

/// The median of `RUNS` timings of `work`, in seconds, after one untimed call.
fn median_seconds(
    device: &CudaDevice,
    mut work: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    work()?;
    device.synchronize()?;
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        work()?;
        device.synchronize()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[RUNS / 2])
}

fn main() -> Result<(), CudaError> {
    let device = CudaDevice::open(0)?;
    let (major, minor) = device.compute_capability();
    println!(
        "device: {} (compute capability {major}.{minor})",
        device.name()
    );
    println!("| measurement | size | figure |");
    println!("|---|---|---|");

    let n = 4096;
    let a = device.upload(&vec![0.5_f32; n * n])?;
    let b = device.upload(&vec![0.25_f32; n * n])?;
    let operand = |buffer| MatRef {
        buffer,
        rows: n,
        cols: n,
        transposed: false,
    };
    let products = 10;
    let seconds = median_seconds(&device, || {
        for _ in 0..products {
            ops::matmul(operand(&a), operand(&b))?;
        }
        Ok(())
    })?;
    let flops = 2.0 * (n as f64).powi(3) * f64::from(products) / seconds;
    println!(
        "| SGEMM (cuBLAS, f32) | {n}×{n}×{n} | {:.1} TFLOP/s |",
        flops / 1e12
    );

    let len = 64 << 20; // 256 MiB of f32
    let host = vec![1.0_f32; len];
    let bytes = (len * 4) as f64;
    let up = median_seconds(&device, || device.upload(&host).map(drop))?;
    println!(
        "| copy host → device | 256 MiB | {:.1} GB/s |",
        bytes / up / 1e9
    );
    let buffer = device.upload(&host)?;
    let down = median_seconds(&device, || buffer.to_host().map(drop))?;
    println!(
        "| copy device → host | 256 MiB | {:.1} GB/s |",
        bytes / down / 1e9
    );
    let on = median_seconds(&device, || buffer.try_clone().map(drop))?;
    println!(
        "| copy on the device (read + write) | 256 MiB | {:.0} GB/s |",
        2.0 * bytes / on / 1e9
    );
    Ok(())
}
