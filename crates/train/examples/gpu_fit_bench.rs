//! `fit` end to end on this machine's GPUs: the multi-worker tutorial's CNN under
//! `MirroredStrategy::all_devices()` (one replica per GPU, NCCL where it loads) on the embedded
//! MNIST subset, global batch 512, Adam, the loss and accuracy logged each step as `fit` logs
//! them. The input pipeline (shuffle, scale, batch, prefetch) runs on the host and each batch
//! goes to the GPU as `fit` sends it.
//!
//! Four epochs of 60 steps each (the subset repeated); the first (NVRTC's compilation, cuBLAS's
//! set-up, the memory pool's growth) is left out, and each later epoch's time per step and
//! examples per second is printed: the figure beside `torch_gpu_reference.py`'s PyTorch eager
//! step at batch 512 (data already on the device). Before training, the input pipeline is
//! timed alone: the floor under a step that the host feeds.
//!
//! Run on a machine with a GPU:
//! `cargo run --release -p lockstep-train --example gpu_fit_bench`. Where there is none it
//! trains on the CPU, unless `LOCKSTEP_REQUIRE_GPU=1` (as `cargo xtask gpu-check`'s runner
//! sets it), which makes that an error.

use std::time::Instant;

use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
use lockstep_tensor::Device;
use lockstep_testenv::Need;
use lockstep_train::{Callback, Logs, MirroredStrategy, Model, TrainError, TrainingContext};

const GLOBAL_BATCH: usize = 512;
const STEPS_PER_EPOCH: u64 = 60;
const EPOCHS: u64 = 4;

/// Each epoch's wall time, from its beginning to its end.
#[derive(Default)]
struct EpochTimes {
    started: Option<Instant>,
    seconds: Vec<f64>,
}

impl Callback for &mut EpochTimes {
    fn on_epoch_begin(
        &mut self,
        _epoch: u64,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        self.started = Some(Instant::now());
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        _epoch: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        if let Some(started) = self.started.take() {
            self.seconds.push(started.elapsed().as_secs_f64());
        }
        Ok(())
    }
}

/// Seconds a batch of `train` takes to come out of the pipeline with nothing else running:
/// the floor under `fit`'s step when the host feeds it (the first epoch's worth, then as many
/// again timed).
fn pipeline_alone<D: Dataset>(train: &D) -> anyhow::Result<f64> {
    let mut batches = train.iter()?;
    for _ in 0..STEPS_PER_EPOCH {
        batches.next().transpose()?;
    }
    let started = Instant::now();
    for _ in 0..STEPS_PER_EPOCH {
        batches.next().transpose()?;
    }
    Ok(started.elapsed().as_secs_f64() / STEPS_PER_EPOCH as f64)
}

fn main() -> anyhow::Result<()> {
    let strategy = MirroredStrategy::all_devices()?;
    let mut model = Model::new(strategy, || models::mnist_cnn(0))?;
    let loss = SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    };
    model.compile(Adam::default(), loss, &["accuracy"])?;
    let device = model.network().device();
    // `all_devices` falls back to the CPU where it finds no GPU: a figure that would pass for
    // the GPU's, so a run that requires one stops here.
    if device == Device::Cpu && Need::Gpu.is_required() {
        anyhow::bail!(
            "{}=1, but MirroredStrategy::all_devices() found no GPU and placed fit on the CPU",
            Need::Gpu.variable()
        );
    }
    let mnist = Mnist::embedded()?;
    let train = mnist
        .train
        .dataset()?
        .shuffle(10_000, 7, true)
        .map(|(x, y)| (scale(&x), y))
        .repeat(None);
    let train = model.distribute_dataset(train, GLOBAL_BATCH)?;
    let pipeline = pipeline_alone(&train)?;
    let mut times = EpochTimes::default();
    let history = model
        .fit(&train)
        .epochs(EPOCHS)
        .steps_per_epoch(STEPS_PER_EPOCH)
        .verbose(false)
        .callback(&mut times)
        .run()?;
    println!(
        "device: {device} × {} replica(s); fit, tutorial CNN, global batch {GLOBAL_BATCH}, {STEPS_PER_EPOCH} steps an epoch",
        model.num_replicas_in_sync()
    );
    for (epoch, seconds) in times.seconds.iter().enumerate().skip(1) {
        let per_step = seconds / STEPS_PER_EPOCH as f64;
        println!(
            "| fit (Lockstep, MirroredStrategy, Adam, loss and accuracy each step), epoch {} | batch {GLOBAL_BATCH} | {:.3} ms a step, {:.0} examples/s |",
            epoch + 1,
            per_step * 1e3,
            GLOBAL_BATCH as f64 / per_step
        );
    }
    println!(
        "| input pipeline alone (shuffle, scale, batch, prefetch; no training) | batch {GLOBAL_BATCH} | {:.3} ms a batch |",
        pipeline * 1e3
    );
    let accuracy = history.get("accuracy").and_then(|a| a.last().copied());
    println!("accuracy of the last epoch: {accuracy:?}");
    Ok(())
}
