//! The GPU benchmark of `cargo xtask gpu-check`: the multi-worker tutorial's CNN training step
//! (Adam, in a `TrainingSession` whose parameters, gradients and optimizer state stay on the
//! GPU) at batches 64 and 512, SGEMM through cuBLAS at 4096², and memory copy bandwidth (host
//! to device, device to host, on the device), one table. `benches/torch_gpu_reference.py`
//! prints PyTorch eager's figures for the same measurements.
//!
//! Each figure is the median of 5 runs of back-to-back operations after a warm-up, timed from
//! one device synchronisation to the next. Run on a machine with a GPU:
//! `cargo run --release -p lockstep-nn --example gpu_bench`. With `--libraries` it prints
//! only where each CUDA library would be loaded from (the GPU runner's environment report).

use std::time::Instant;

use lockstep_cuda::ops::{self, MatRef};
use lockstep_cuda::{CudaDevice, CudaError, Transfers};
use lockstep_data::mnist::Mnist;
use lockstep_nn::{Adam, ForwardContext, Reduction, SparseCategoricalCrossentropy, models};
use lockstep_tensor::{Device, Tensor};

/// Runs of each measurement; the median is reported.
const RUNS: usize = 5;

/// Training steps per timed run.
const STEPS: u64 = 50;

/// The median of `RUNS` timings of `work`, in seconds, after one untimed call.
fn median_seconds<E>(
    device: &CudaDevice,
    mut work: impl FnMut() -> Result<(), E>,
) -> anyhow::Result<f64>
where
    anyhow::Error: From<E>,
{
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

/// What [`cnn_step`] measured.
struct StepFigures {
    /// Milliseconds per step, the loss read back every step.
    read_each: f64,
    /// Milliseconds per step, the loss read once per run.
    read_once: f64,
    /// The copies between host and device of one run of `STEPS` steps, loss read once.
    copies: Transfers,
}

/// The CNN's training step at `batch` on the first `batch` training digits: milliseconds per
/// step with the loss read back every step (as a training loop that logs it does, and as the
/// PyTorch reference does), and with it read once per run.
fn cnn_step(device: &CudaDevice, mnist: &Mnist, batch: usize) -> anyhow::Result<StepFigures> {
    let images = mnist.train.images_f32();
    let x = images.slice(ndarray::s![..batch, .., .., ..]).to_owned();
    let x = Tensor::from_vec(x.into_raw_vec_and_offset().0, &[batch, 28, 28, 1])?
        .to_device(Device::Cuda(device.ordinal()))?;
    let labels: Vec<usize> = mnist
        .train
        .labels
        .iter()
        .take(batch)
        .map(|&l| usize::from(l))
        .collect();
    let model = models::mnist_cnn(0)?;
    let mut model = model
        .to_device(Device::Cuda(device.ordinal()))
        .map_err(|(_, e)| e)?;
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let mut adam = Adam::default();
    let mut session = model.training(&mut adam)?;
    let mut step = 0;
    let mut run = |read_every_step: bool| -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..STEPS {
            let ctx = ForwardContext::training(step, 0);
            let loss = session.step(&x, ctx, |logits| loss_fn.call(logits, &labels))?;
            if read_every_step {
                anyhow::ensure!(loss.item()?.is_finite(), "the loss diverged");
            }
            last = Some(loss);
            step += 1;
        }
        if let Some(loss) = last {
            anyhow::ensure!(loss.item()?.is_finite(), "the loss diverged");
        }
        Ok(())
    };
    let per_step = |seconds: f64| seconds / STEPS as f64 * 1e3;
    let read_each = per_step(median_seconds(device, || run(true))?);
    let read_once = per_step(median_seconds(device, || run(false))?);
    let before = Transfers::on_this_thread();
    run(false)?;
    let copies = Transfers::on_this_thread() - before;
    session.finish()?;
    Ok(StepFigures {
        read_each,
        read_once,
        copies,
    })
}

fn main() -> anyhow::Result<()> {
    if std::env::args().skip(1).any(|arg| arg == "--libraries") {
        for library in lockstep_cuda::libraries::locations() {
            println!("{library}");
        }
        return Ok(());
    }
    let device = CudaDevice::open(0)?;
    let (major, minor) = device.compute_capability();
    println!(
        "device: {} (compute capability {major}.{minor})",
        device.name()
    );
    println!("| measurement | size | figure |");
    println!("|---|---|---|");

    let mnist = Mnist::embedded()?;
    for batch in [64, 512] {
        let StepFigures {
            read_each,
            read_once,
            copies,
        } = cnn_step(&device, &mnist, batch)?;
        println!(
            "| CNN training step (Lockstep, Adam, loss read every step) | batch {batch} | {read_each:.3} ms, {:.0} examples/s |",
            batch as f64 / read_each * 1e3
        );
        println!(
            "| CNN training step (Lockstep, Adam, loss read once per {STEPS}) | batch {batch} | {read_once:.3} ms, {:.0} examples/s |",
            batch as f64 / read_once * 1e3
        );
        // The batch stays on the GPU: each step uploads its labels, and the run reads back
        // its last loss. Anything more is a host round trip inside the step.
        println!(
            "| CNN training: copies in {STEPS} steps, loss read once | batch {batch} | {} to the device, {} to the host |",
            copies.to_device, copies.to_host
        );
    }

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
        Ok::<(), CudaError>(())
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
