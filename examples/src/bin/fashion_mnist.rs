//! Fashion-MNIST (the full 60,000 + 10,000 images Debian's `dataset-fashion-mnist` installs)
//! under `MultiWorkerMirroredStrategy`, with models written in the functional API: the Keras
//! guide's `get_compiled_model()` MLP (`--model mlp`), the tutorial's CNN (`--model cnn`, the
//! default: `models::mnist_cnn_functional`), or that CNN with synchronised batch normalization
//! after each convolution (`--model cnn-bn`: `models::cnn_batch_norm`). Every worker prints the
//! test accuracy and the same weight checksum.
//!
//! ```text
//! $ cargo xtask run-cluster --example fashion_mnist -- --epochs 12
//! [worker:0] Epoch 1/12 - 469 steps - 2.9s - loss: 0.5388 - sparse_categorical_accuracy: 0.8080
//! …
//! [worker:0] test_accuracy=0.9132 test_loss=0.2609 weights_checksum=1971b1b0b0527ae0 model=cnn epochs=12 examples_per_s=20638 loop_examples_per_s=20911 comm_wait_share=0.04 first_step_s=0.67
//! ```
//!
//! (Stdout; only the chief prints the epoch lines. `examples_per_s` is every example of `fit`
//! and the test set's evaluation over their wall time; `loop_examples_per_s` is the steady
//! speed as `benches/` measures the references', the examples of steps 2..N over the time
//! from the end of step 1 to the end of step N; `comm_wait_share` is the share of the steps'
//! time this worker spent blocked in their collectives. Times depend on the machine.) The bar to meet is the accuracy Fashion-MNIST's own
//! benchmark gives TensorFlow's tutorial CNN, 0.916 (after 20,000 steps of 100, 33 epochs);
//! `docs/PERFORMANCE.md` has the runs.

use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs, CommunicationArgs};
use lockstep_nn::{
    Activation, Adam, Dense, Input, LayerCall, LearningRateSchedule, Network, NnError,
    SparseCategoricalCrossentropy, models,
};
use lockstep_train::{Model, MultiWorkerMirroredStrategy};
use ndarray::Array1;

/// Activations are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train a functional model on Fashion-MNIST across the workers of `TF_CONFIG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// `cnn` (the tutorial CNN: two convolutions and poolings, `Dense` 128, 10), `cnn-bn` (the
    /// same with synchronised batch normalization after each convolution) or `mlp` (the Keras
    /// guide's 784 → 64 → 64 → 10).
    #[arg(long, default_value = "cnn")]
    model: String,
    /// Units of `cnn-bn`'s hidden dense layer (128; 2048 makes it a model of 3.3 M
    /// parameters, for benchmarks of slow links).
    #[arg(long, default_value_t = 128)]
    dense_units: usize,
    /// `cnn-bn` normalizes with each replica's own batch statistics, as PyTorch's
    /// `BatchNorm2d` under DDP does, instead of statistics over every replica's batch.
    #[arg(long)]
    local_batch_norm: bool,
    /// Train on N images an epoch only (all 60,000 by default): the first N of the training set
    /// as each epoch shuffles it, so each epoch draws another N (for benchmarks, which need the
    /// step's speed, not the whole set).
    #[arg(long, value_name = "N")]
    train_examples: Option<u64>,
    /// Decay Adam's learning rate (1e-3) along a cosine to zero over the whole run (Keras'
    /// `CosineDecay`, stepped every batch) instead of keeping it constant.
    #[arg(long)]
    cosine_decay: bool,
    #[command(flatten)]
    communication: CommunicationArgs,
}

/// The Keras guide's `get_compiled_model()` network, in the functional API.
fn guide_mlp(seed: u64) -> Result<Network, NnError> {
    let inputs = Input::named(&[784], "digits");
    let x = Dense::new(64)
        .activation(Activation::Relu)
        .named("dense_1")
        .call(&inputs)?;
    let x = Dense::new(64)
        .activation(Activation::Relu)
        .named("dense_2")
        .call(&x)?;
    let outputs = Dense::new(10).named("predictions").call(&x)?;
    Network::new(&[&inputs], &[&outputs], seed)
}

/// The model `args` name, built under `strategy`.
fn build(strategy: MultiWorkerMirroredStrategy, args: &Args) -> anyhow::Result<Model> {
    let seed = args.training.seed;
    Ok(match args.model.as_str() {
        "mlp" => Model::new(strategy, || guide_mlp(seed))?,
        "cnn-bn" => Model::new(strategy, || {
            models::cnn_batch_norm_with_dense_units(seed, !args.local_batch_norm, args.dense_units)
        })?,
        _ => Model::new(strategy, || models::mnist_cnn_functional(seed))?,
    })
}

/// Adam at Keras' defaults; with `decay_steps`, its rate (1e-3) follows a cosine to zero over
/// that many steps.
fn adam(decay_steps: Option<u64>) -> Adam {
    let adam = Adam::default();
    match decay_steps {
        Some(decay_steps) => adam.with_schedule(LearningRateSchedule::CosineDecay {
            initial_learning_rate: 1e-3,
            decay_steps,
            alpha: 0.0,
            warmup_target: None,
            warmup_steps: 0,
        }),
        None => adam,
    }
}

/// FNV-1a over the bits of every weight: equal on every worker, and across runs with the same
/// seeds and layout.
fn checksum(model: &Model) -> u64 {
    model
        .network()
        .parameters()
        .values()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
        })
}

fn main() -> anyhow::Result<()> {
    let process_started = Instant::now();
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    args.training
        .start_kernel_threads(cluster.group_tasks_on_this_host())?;
    if cluster.rank().is_none() {
        println!(
            "task {} has no training role in this example",
            cluster.task()
        );
        return Ok(());
    }
    let flat = match args.model.as_str() {
        "mlp" => true,
        "cnn" | "cnn-bn" => false,
        other => anyhow::bail!("unknown model {other:?}: use cnn, cnn-bn or mlp"),
    };
    let workers = cluster.world_size().max(1);
    let strategy = MultiWorkerMirroredStrategy::with_transport_options(
        &cluster,
        args.communication.options(),
        1,
        &args.cluster.transport(),
    )?;
    let seed = args.training.seed;
    let mut model = build(strategy, &args)?;
    let loss = SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    };
    let fashion = Mnist::fashion().context("loading Fashion-MNIST")?;
    let global_batch = args.training.global_batch(workers);
    let examples = args.train_examples.map_or(fashion.train.len() as u64, |n| {
        n.min(fashion.train.len() as u64)
    });
    let steps = examples.div_ceil(global_batch as u64) * args.training.epochs;
    let optimizer = adam(args.cosine_decay.then_some(steps));
    model.compile(optimizer, loss, &["sparse_categorical_accuracy"])?;
    if model.is_chief() {
        eprintln!("{}", model.summary());
    }
    let started = Instant::now();
    let mut clock = lockstep_examples::StepClock::new(process_started);
    // The guide flattens the images for its MLP; the CNN takes them as they are.
    let (history, logs) = if flat {
        // A 28×28×1 image is 784 values in a row: flattened without a copy.
        let to_flat = |(x, y): (ndarray::Array3<u8>, u8)| -> (Array1<f32>, u8) {
            let flat = Array1::from_vec(scale(&x).into_raw_vec_and_offset().0);
            (flat, y)
        };
        let train = fashion
            .train
            .dataset()?
            .shuffle(60_000, seed, true)
            .take(examples)
            .map(to_flat);
        let train = model.distribute_dataset(train, global_batch)?;
        let test = model.distribute_dataset(fashion.test.dataset()?.map(to_flat), global_batch)?;
        let history = model
            .fit(&train)
            .epochs(args.training.epochs)
            .callback(&mut clock)
            .run()?;
        (history, model.evaluate(&test)?)
    } else {
        let to_scaled = |(x, y): (ndarray::Array3<u8>, u8)| (scale(&x), y);
        let train = fashion
            .train
            .dataset()?
            .shuffle(60_000, seed, true)
            .take(examples)
            .map(to_scaled);
        let train = model.distribute_dataset(train, global_batch)?;
        let test =
            model.distribute_dataset(fashion.test.dataset()?.map(to_scaled), global_batch)?;
        let history = model
            .fit(&train)
            .epochs(args.training.epochs)
            .callback(&mut clock)
            .run()?;
        (history, model.evaluate(&test)?)
    };
    let elapsed = started.elapsed().as_secs_f64();
    let checksum = checksum(&model);
    println!(
        "test_accuracy={:.4} test_loss={:.4} weights_checksum={checksum:016x} model={} epochs={} examples_per_s={:.0} loop_examples_per_s={:.0} comm_wait_share={:.2} first_step_s={:.2}",
        logs.get("sparse_categorical_accuracy").unwrap_or(0.0),
        logs.get("loss").unwrap_or(0.0),
        args.model,
        history.epochs.len(),
        history.examples as f64 / elapsed,
        clock.loop_examples_per_s(history.examples, global_batch as u64),
        history.comm_wait.as_secs_f64() / history.step_time.as_secs_f64().max(f64::MIN_POSITIVE),
        clock.first_step_s(),
    );
    Ok(())
}
