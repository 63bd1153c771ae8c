//! The Keras guide's fault-tolerance pattern: `make_or_restore_model()` loads the newest model
//! saved in a directory or builds a new one, and `run_training()` trains it for an epoch with a
//! `ModelCheckpoint` that saves the whole model there. Run twice, the second run resumes where
//! the first stopped.
//!
//! ```text
//! $ cargo xtask run-cluster --example keras_resume --workers 1
//! [worker:0] Creating a new model
//! [worker:0] Epoch 1/1 - 219 steps - 0.5s - accuracy: 0.8595 - loss: 0.4740 - val_accuracy: 0.9140 - val_loss: 0.2869
//! [worker:0] Restoring from the model saved at step 219
//! [worker:0] Epoch 2/2 - 219 steps - 0.4s - accuracy: 0.9477 - loss: 0.1851 - val_accuracy: 0.9210 - val_loss: 0.2619
//! ```
//!
//! (Stdout. Times depend on the machine; everything else is the same from run to run. The
//! resumed epoch prints what `mirrored_mlp`'s second epoch prints: resuming loses nothing.)

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Parser;
use lockstep_checkpoint::CheckpointError;
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_examples::KernelThreadArgs;
use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
use lockstep_train::{MirroredStrategy, Model, ModelCheckpoint, TrainError};
use ndarray::Array1;

/// Activations are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train, save, restore and train again, as the Keras guide's fault-tolerance section.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Where models are saved (a fresh temporary directory when not given).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Replicas, one thread each.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Seed of the initial weights and of the shuffle.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How many kernel threads, and on which cores.
    #[command(flatten)]
    kernels: KernelThreadArgs,
}

/// Training examples kept back for validation.
const VALIDATION: u64 = 1000;

fn flat(x: &ndarray::Array3<u8>) -> Array1<f32> {
    scale(x).into_iter().collect()
}

/// The newest model saved in `dir`, or a new compiled one.
fn make_or_restore_model(args: &Args, dir: &Path) -> anyhow::Result<Model> {
    match Model::load(MirroredStrategy::new(args.replicas)?, dir) {
        Ok(model) => {
            let step = model
                .optimizer()
                .map_or(0, lockstep_nn::Optimizer::iterations);
            println!("Restoring from the model saved at step {step}");
            Ok(model)
        }
        Err(TrainError::Checkpoint(CheckpointError::NotFound { .. })) => {
            println!("Creating a new model");
            let mut model = Model::new(MirroredStrategy::new(args.replicas)?, || {
                models::mnist_mlp(args.seed)
            })?;
            let loss = SparseCategoricalCrossentropy {
                from_logits: true,
                ..Default::default()
            };
            model.compile(Adam::default(), loss, &["accuracy"])?;
            Ok(model)
        }
        Err(e) => Err(e).context("restoring the saved model"),
    }
}

/// Epoch `epoch` (Keras' `initial_epoch`), saving the whole model into `dir` at its end: the
/// epoch selects the shuffle, so the second run sees the data as an uninterrupted run's
/// second epoch does.
fn run_training(args: &Args, dir: &Path, epoch: u64) -> anyhow::Result<()> {
    let mut model = make_or_restore_model(args, dir)?;
    let mnist = Mnist::embedded()?;
    let examples = mnist.train.dataset()?.map(|(x, y)| (flat(&x), y)).cache();
    let training = examples
        .clone()
        .skip(VALIDATION)
        .shuffle(10_000, args.seed, true);
    let validation = model.distribute_dataset(examples.take(VALIDATION), 256)?;
    let training = model.distribute_dataset(training, 32)?;
    let checkpoint = dir
        .to_str()
        .context("a checkpoint directory named in UTF-8")?;
    model
        .fit(&training)
        .initial_epoch(epoch)
        .epochs(epoch + 1)
        .validation_data(&validation)
        .callback(ModelCheckpoint::new(checkpoint).save_weights_only(false))
        .run()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    args.kernels.start(args.replicas)?;
    let temporary = tempfile::tempdir()?;
    let dir = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    // Running the first time creates the model; calling the same function again resumes.
    run_training(&args, &dir, 0)?;
    run_training(&args, &dir, 1)?;
    Ok(())
}
