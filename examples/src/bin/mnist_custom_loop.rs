//! Synchronous data-parallel training of the multi-worker tutorial's CNN on the embedded MNIST
//! subset: TensorFlow's "custom training loop with `MultiWorkerMirroredStrategy`", in Rust.
//!
//! Every worker reads its part of each global batch, computes gradients, all-reduces them
//! (mean) with the others, and applies the same Adam update, so the replicas stay in lockstep:
//! at the end each prints the same weight checksum.
//!
//! ```text
//! $ cargo xtask run-cluster --example mnist_custom_loop     # 2 workers, 3 epochs
//! [worker:0] epoch=1 loss=0.7595 accuracy=0.8002 steps=62
//! [worker:1] epoch=1 loss=0.7595 accuracy=0.8002 steps=62
//! …
//! [worker:0] test_accuracy=0.9606 weights_checksum=531bf17deb50cdef steps=186 examples_per_s=5321
//! [worker:1] test_accuracy=0.9606 weights_checksum=531bf17deb50cdef steps=186 examples_per_s=5321
//! ```
//!
//! (Stdout; the model summary and the launcher's log go to stderr. `examples_per_s` depends on
//! the machine; everything else is the same from run to run.)

use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use lockstep_collective::{CommunicationOptions, Communicator, ReduceOp, TcpTransport};
use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{AutoShardPolicy, Dataset, InputContext, distribute};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs};
use lockstep_nn::{
    Adam, ForwardContext, Mean, Metric, Optimizer, Reduction, Sequential,
    SparseCategoricalAccuracy, SparseCategoricalCrossentropy, models,
};
use lockstep_tensor::Tensor;

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

fn labels(y: &ndarray::Array1<u8>) -> Vec<usize> {
    y.iter().map(|&l| usize::from(l)).collect()
}

fn images(x: ndarray::Array4<f32>) -> anyhow::Result<Tensor> {
    let shape = x.shape().to_vec();
    Ok(Tensor::from_vec(x.into_raw_vec_and_offset().0, &shape)?)
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    let Some(rank) = cluster.rank() else {
        println!(
            "task {} has no training role in this example",
            cluster.task()
        );
        return Ok(());
    };
    let workers = cluster.world_size();
    lockstep_examples::start_kernel_threads(
        args.training.threads,
        cluster.group_tasks_on_this_host(),
    )?;
    let mut comm: Communicator<TcpTransport> = Communicator::from_cluster_with(
        &cluster,
        CommunicationOptions::default(),
        &args.cluster.transport(),
    )?;
    let mnist = Mnist::embedded()?;

    let mut model = models::mnist_cnn(args.training.seed)?;
    // Same seed, same weights; the broadcast makes it so even if a worker's seed differed.
    comm.broadcast(model.parameters_mut().values_mut(), 0)?;
    if rank == 0 {
        eprintln!("{}", model.summary());
    }
    let started = Instant::now();
    let steps = train(&mut model, &mut comm, &mnist, &args, rank)?;
    let elapsed = started.elapsed().as_secs_f64();

    let checksum = model
        .parameters()
        .values()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
    println!(
        "test_accuracy={:.4} weights_checksum={checksum:016x} steps={steps} examples_per_s={:.0}",
        evaluate(&model, &mnist)?,
        (steps as f64 * (args.training.batch_per_worker * workers) as f64) / elapsed
    );
    Ok(())
}

/// The training loop; returns the number of steps taken.
fn train(
    model: &mut Sequential,
    comm: &mut Communicator<TcpTransport>,
    mnist: &Mnist,
    args: &Args,
    rank: usize,
) -> anyhow::Result<u64> {
    let workers = comm.world_size();
    let ctx = InputContext::new(workers, rank, workers)?;
    let train = mnist
        .train
        .dataset()?
        // The tutorial's `map(scale).cache().shuffle()` reordered: the digits are in memory
        // already, so the bytes are shuffled and each is scaled as its batch is made (a
        // 4-byte `f32` cache would cost 19 MB of memory for ~1 ms of work an epoch).
        .shuffle(10_000, args.training.seed, true)
        .map(|(x, y)| (scale(&x), y));
    let steps = distribute(
        train,
        args.training.batch_per_worker * workers,
        &ctx,
        AutoShardPolicy::Data,
    )?
    .prefetch(2);
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let mut adam = Adam::default();
    let mut grads = vec![0.0_f32; model.parameters().len()];
    let mut step = 0_u64;
    for epoch in 0..args.training.epochs {
        let (mut loss_metric, mut accuracy) =
            (Mean::default(), SparseCategoricalAccuracy::default());
        let mut epoch_steps = 0;
        for batches in steps.iter_epoch(epoch)? {
            let (x, y) = batches?
                .into_iter()
                .next()
                .context("one replica per worker")?;
            let y = labels(&y);
            let forward = model.forward(&images(x)?, ForwardContext::training(step, rank))?;
            let loss = loss_fn.call(&forward.output, &y)?;
            model.gradients(&forward, &loss.backward()?, &mut grads)?;
            // Equal per-worker batches: the mean of the workers' mean gradients is the gradient
            // of the mean loss over the global batch.
            comm.all_reduce(&mut grads, ReduceOp::Mean)?;
            adam.apply(model.parameters_mut().values_mut(), &grads)?;
            loss_metric.update(f64::from(loss.item()?), y.len() as f64);
            accuracy.update(&forward.output, &y)?;
            step += 1;
            epoch_steps += 1;
        }
        // Metrics merge across workers: sum their states.
        let mut state: Vec<f64> = loss_metric
            .state()
            .into_iter()
            .chain(accuracy.state())
            .collect();
        comm.all_reduce(&mut state, ReduceOp::Sum)?;
        loss_metric.set_state(&state[..2])?;
        accuracy.set_state(&state[2..])?;
        println!(
            "epoch={} loss={:.4} accuracy={:.4} steps={epoch_steps}",
            epoch + 1,
            loss_metric.result(),
            accuracy.result()
        );
    }
    Ok(step)
}

/// Accuracy on the whole test split.
fn evaluate(model: &Sequential, mnist: &Mnist) -> anyhow::Result<f64> {
    let mut accuracy = SparseCategoricalAccuracy::default();
    for batch in mnist
        .test
        .dataset()?
        .map(|(x, y)| (scale(&x), y))
        .batch(500, false)
        .iter()?
    {
        let (x, y) = batch?;
        accuracy.update(&model.predict(&images(x)?)?, &labels(&y))?;
    }
    Ok(accuracy.result())
}
