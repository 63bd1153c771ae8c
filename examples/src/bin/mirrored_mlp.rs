//! The Keras distributed-training guide's MLP under `MirroredStrategy`: 784 → 256 → 256 → 10,
//! Adam, batch 32, 2 epochs, with validation data, then `evaluate` on the test split. Each
//! replica is a thread of this process; gradients meet in shared memory.
//!
//! ```text
//! $ cargo xtask run-cluster --example mirrored_mlp --workers 1
//! [worker:0] Epoch 1/2 - 219 steps - 0.4s - accuracy: 0.8595 - loss: 0.4740 - val_accuracy: 0.9140 - val_loss: 0.2869
//! [worker:0] Epoch 2/2 - 219 steps - 0.3s - accuracy: 0.9477 - loss: 0.1851 - val_accuracy: 0.9210 - val_loss: 0.2619
//! [worker:0] test_loss=0.2791 test_accuracy=0.9152 replicas=2
//! ```
//!
//! (Stdout; run alone, `cargo run --release -p lockstep-examples --bin mirrored_mlp`, it has
//! no task prefix. Times depend on the machine; everything else is the same from run to
//! run.)

use clap::Parser;
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_examples::KernelThreadArgs;
use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
use lockstep_train::{MirroredStrategy, Model};
use ndarray::Array1;

/// Activations are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train the Keras guide's MLP with `MirroredStrategy` on this machine's CPU.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Replicas, one thread each.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Passes over the training data.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Examples per step over all replicas.
    #[arg(long, default_value_t = 32)]
    global_batch: usize,
    /// Seed of the initial weights and of the shuffle.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How many kernel threads, and on which cores.
    #[command(flatten)]
    kernels: KernelThreadArgs,
}

/// Training examples kept back for validation, as the guide holds out part of its data.
const VALIDATION: usize = 1000;

fn flat(x: &ndarray::Array3<u8>) -> Array1<f32> {
    scale(x).into_iter().collect()
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    // The replicas share this host's cores.
    args.kernels.start(args.replicas)?;
    let mut model = Model::new(MirroredStrategy::new(args.replicas)?, || {
        models::mnist_mlp(args.seed)
    })?;
    let loss = SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    };
    model.compile(Adam::default(), loss, &["accuracy"])?;
    eprintln!("{}", model.summary());

    let mnist = Mnist::embedded()?;
    let examples = mnist.train.dataset()?.map(|(x, y)| (flat(&x), y)).cache();
    let training = examples
        .clone()
        .skip(VALIDATION as u64)
        .shuffle(10_000, args.seed, true);
    let validation = examples.take(VALIDATION as u64);
    let test = mnist.test.dataset()?.map(|(x, y)| (flat(&x), y));
    let training = model.distribute_dataset(training, args.global_batch)?;
    let validation = model.distribute_dataset(validation, 256)?;
    let test = model.distribute_dataset(test, 256)?;

    model
        .fit(&training)
        .epochs(args.epochs)
        .validation_data(&validation)
        .run()?;
    let logs = model.evaluate(&test)?;
    println!(
        "test_loss={:.4} test_accuracy={:.4} replicas={}",
        logs.get("loss").unwrap_or(f64::NAN),
        logs.get("accuracy").unwrap_or(f64::NAN),
        model.num_replicas_in_sync()
    );
    Ok(())
}
