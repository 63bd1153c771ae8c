//! Synchronous data-parallel training of the multi-worker tutorial's CNN on the embedded MNIST
//! subset: TensorFlow's "custom training loop with `MultiWorkerMirroredStrategy`", in Rust.
//!
//! The loop is the tutorial's: the model is built under the strategy, the dataset distributed
//! with `distribute_dataset`, and each step calls `model.run` (`strategy.run`) with a step
//! function that computes the replica's loss, takes its gradients and applies them
//! (`apply_gradients`, which sums them over every replica of every worker first);
//! `model.reduce` (`strategy.reduce`) combines the replicas' metric states at the end of each
//! epoch. Every replica applies the same Adam update, so they stay in lockstep: at the end
//! each worker prints the same weight checksum.
//!
//! ```text
//! $ cargo xtask run-cluster --example mnist_custom_loop     # 2 workers, 3 epochs
//! [worker:0] epoch=1 loss=0.7554 accuracy=0.8012 steps=63
//! [worker:1] epoch=1 loss=0.7554 accuracy=0.8012 steps=63
//! …
//! [worker:0] test_accuracy=0.9596 weights_checksum=cdb5065ef65a75fc steps=189 examples_per_s=18935
//! [worker:1] test_accuracy=0.9596 weights_checksum=cdb5065ef65a75fc steps=189 examples_per_s=18902
//! ```
//!
//! (Stdout; the model summary and the launcher's log go to stderr. `examples_per_s` depends on
//! the machine; everything else is the same from run to run. The loop is `fit`'s step written
//! out, so the weights are `mnist_keras`'s, bit for bit.)

use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use lockstep_collective::{CommunicationOptions, ReduceOp};
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs};
use lockstep_nn::{
    Adam, Loss, Metric as _, PredictionMetric as _, Reduction, SparseCategoricalAccuracy,
    SparseCategoricalCrossentropy, models,
};
use lockstep_train::{LabeledBatch as _, Model, MultiWorkerMirroredStrategy, TrainError};

/// Activations of several MB are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train the tutorial CNN on MNIST across the workers of the cluster in `TF_CONFIG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Each replica sums its examples' losses; `apply_gradients` divides the summed gradients by
/// the examples of the whole step: the gradient of the mean loss over the global batch.
const SUMMED: SparseCategoricalCrossentropy = SparseCategoricalCrossentropy {
    from_logits: true,
    reduction: Reduction::Sum,
};

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    if cluster.rank().is_none() {
        println!(
            "task {} has no training role in this example",
            cluster.task()
        );
        return Ok(());
    }
    let workers = cluster.world_size().max(1);
    args.training
        .start_kernel_threads(cluster.group_tasks_on_this_host())?;
    let strategy = MultiWorkerMirroredStrategy::with_transport_options(
        &cluster,
        CommunicationOptions::default(),
        1,
        &args.cluster.transport(),
    )?;
    let seed = args.training.seed;
    let mut model = Model::new(strategy, || models::mnist_cnn(seed))?;
    model.set_optimizer(Adam::default());
    if model.is_chief() {
        eprintln!("{}", model.summary());
    }

    let mnist = Mnist::embedded()?;
    let train = mnist
        .train
        .dataset()?
        // The tutorial's `map(scale).cache().shuffle()` reordered: the digits are in memory
        // already, so the bytes are shuffled and each is scaled as its batch is made.
        .shuffle(10_000, seed, true)
        .map(|(x, y)| (scale(&x), y));
    let global_batch = args.training.global_batch(workers);
    let train = model.distribute_dataset(train, global_batch)?;

    let started = Instant::now();
    let mut steps = 0_u64;
    for epoch in 0..args.training.epochs {
        let mut totals = [0.0_f64; 4];
        let mut epoch_steps = 0;
        let mut batches = train.iter_epoch(epoch)?;
        loop {
            // A worker whose part of the data has run out takes steps without a batch until
            // every worker's has: the all-reduced examples say when no replica had any, so
            // every worker runs the same steps.
            let step = batches.next().transpose()?.unwrap_or_default();
            let step = model.run(step, train_step)?;
            let step = step.first().context("one replica per worker")?;
            if step[1] == 0.0 {
                break;
            }
            for (total, value) in totals.iter_mut().zip(step) {
                *total += value;
            }
            epoch_steps += 1;
        }
        steps += epoch_steps;
        println!(
            "epoch={} loss={:.4} accuracy={:.4} steps={epoch_steps}",
            epoch + 1,
            totals[0] / totals[1],
            totals[2] / totals[3],
        );
    }
    let elapsed = started.elapsed().as_secs_f64();

    let checksum = model
        .network()
        .parameters()
        .values()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
    let accuracy = test_accuracy(&mut model, &mnist, global_batch)?;
    println!(
        "test_accuracy={accuracy:.4} weights_checksum={checksum:016x} steps={steps} examples_per_s={:.0}",
        (steps as f64 * global_batch as f64) / elapsed
    );
    Ok(())
}

/// One replica's step: the forward pass, the summed loss and its gradients, applied with
/// this step's loss, examples and accuracy counts summed over every replica in the same
/// all-reduce. Returns those totals over every replica (loss sum, examples, accuracy state).
fn train_step(
    replica: &mut lockstep_train::ReplicaContext<'_>,
    batch: Option<(ndarray::Array4<f32>, ndarray::Array1<u8>)>,
) -> Result<Vec<f64>, TrainError> {
    // Summed loss, examples, then the accuracy's (correct, seen).
    let mut totals = vec![0.0_f64; 4];
    let gradients = match batch {
        Some(batch) => {
            let parts = batch.into_parts()?;
            let forward = replica.forward(&parts.inputs)?;
            let targets = parts.targets.as_targets();
            let loss = Loss::call(&SUMMED, &forward.output, targets, None)?;
            let mut accuracy = SparseCategoricalAccuracy::default();
            accuracy.update_state(&forward.output, targets, None)?;
            totals[0] = f64::from(loss.item()?);
            totals[1] = parts.targets.len() as f64;
            totals[2..].copy_from_slice(&accuracy.state());
            replica.gradients(&forward, &loss, parts.targets.len())?
        }
        // A replica past the end of a short last step joins the all-reduce empty-handed.
        None => replica.no_gradients()?,
    };
    replica.apply_gradients(gradients, &mut totals)?;
    Ok(totals)
}

/// Accuracy on the whole test split, each worker evaluating its part and the counts summed
/// over every replica with `reduce`.
fn test_accuracy(model: &mut Model, mnist: &Mnist, global_batch: usize) -> anyhow::Result<f64> {
    let test = mnist.test.dataset()?.map(|(x, y)| (scale(&x), y));
    let test = model.distribute_dataset(test, global_batch)?;
    let mut counts = [0.0_f64; 2];
    let mut batches = test.iter_epoch(0)?;
    loop {
        let step = batches.next().transpose()?.unwrap_or_default();
        let states = model.run(step, |replica, batch| {
            let mut accuracy = SparseCategoricalAccuracy::default();
            if let Some(batch) = batch {
                let parts = batch.into_parts()?;
                let output = replica.network().predict(&parts.inputs)?;
                accuracy.update_state(&output, parts.targets.as_targets(), None)?;
            }
            Ok(accuracy.state())
        })?;
        let summed = model.reduce_each(ReduceOp::Sum, &states)?;
        if summed[1] == 0.0 {
            break;
        }
        counts[0] += summed[0];
        counts[1] += summed[1];
    }
    Ok(counts[0] / counts[1])
}
