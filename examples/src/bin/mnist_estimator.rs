//! The multi-worker Estimator tutorial in Rust: its `model_fn` (`Conv2D` 32 3×3 relu → max
//! pooling → Flatten → Dense 64 relu → Dense 10; gradient descent, learning rate 1e-4; the
//! summed loss × 1/64) and `input_fn`, run by `train_and_evaluate` under
//! `MultiWorkerMirroredStrategy` from `TF_CONFIG`. With an evaluator task, it evaluates each
//! checkpoint the chief writes; without one, the chief evaluates the last.
//!
//! ```text
//! $ cargo xtask run-cluster --example mnist_estimator --workers 2 --evaluator
//! [evaluator:0] {'loss': 2.2669, 'global_step': 62}
//! ```
//!
//! (Stdout of the task that evaluated last; the loss depends on nothing but the seed.) Run it
//! again and training is skipped: the global step in the model directory has reached
//! `--max-steps`, as in TensorFlow.

use std::path::PathBuf;

use clap::Parser;
use lockstep_collective::CommunicationOptions;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{Dataset, InputContext};
use lockstep_examples::{ClusterArgs, KernelThreadArgs};
use lockstep_nn::layers::{Activation, Conv2D, Dense, Flatten, Layer, MaxPooling2D};
use lockstep_nn::{NnError, Reduction, Sequential, Sgd, SparseCategoricalCrossentropy};
use lockstep_tensor::Tensor;
use lockstep_tensor::ops::scale as scale_tensor;
use lockstep_train::{
    Estimator, EstimatorSpec, EvalSpec, ModeKeys, MultiWorkerMirroredStrategy, Params, RunConfig,
    TrainError, TrainSpec, Variables, train_and_evaluate,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The tutorial's batch per worker, which its loss is scaled by.
const BATCH_SIZE: usize = 64;
const LEARNING_RATE: f32 = 1e-4;

/// Train the Estimator tutorial's model with `train_and_evaluate` across `TF_CONFIG`'s tasks.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Where the chief writes checkpoints and event files (default: a directory named after
    /// the settings in `lockstep-<uid>` under the system's temporary directory, which only
    /// this user may use).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Train until the global step reaches this (default: one pass over the training digits).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Save a checkpoint every this many steps (and at the end).
    #[arg(long, default_value_t = 20)]
    save_checkpoints_steps: u64,
    /// Batches per evaluation (0: the whole test split).
    #[arg(long, default_value_t = 0)]
    eval_steps: u64,
    /// Seconds at least between two evaluations on the evaluator.
    #[arg(long, default_value_t = 1)]
    throttle_secs: u64,
    /// Seed of the initial weights and the shuffle.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How many kernel threads, and on which cores.
    #[command(flatten)]
    kernels: KernelThreadArgs,
}

/// The tutorial's model.
fn network(seed: u64) -> Result<Sequential, NnError> {
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Conv2D::new(32, (3, 3)).activation(Activation::Relu)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Flatten),
        Box::new(Dense::new(64).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    Sequential::new(&[28, 28, 1], layers, seed)
}

/// The tutorial's `model_fn`.
fn model_fn(
    features: &Tensor,
    labels: Option<&[usize]>,
    mode: ModeKeys,
    _params: &Params,
    variables: &mut Variables<'_>,
) -> Result<EstimatorSpec, TrainError> {
    let seed = variables.random_seed();
    let logits = variables.apply(|| network(seed), features)?;
    if mode == ModeKeys::Predict {
        return Ok(EstimatorSpec::predict(logits));
    }
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::Sum,
    };
    let loss = scale_tensor(
        &loss_fn.call(&logits, labels.unwrap_or_default())?,
        1.0 / BATCH_SIZE as f32,
    )?;
    if mode == ModeKeys::Eval {
        return Ok(EstimatorSpec::eval(loss));
    }
    Ok(EstimatorSpec::train(loss, Sgd::new(LEARNING_RATE)))
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    args.kernels.start(cluster.group_tasks_on_this_host())?;
    let workers = cluster.world_size().max(1);
    let mnist = Mnist::embedded()?;
    let max_steps = args
        .max_steps
        .unwrap_or((mnist.train.len() / (BATCH_SIZE * workers)) as u64);
    let model_dir = match args.model_dir.clone() {
        Some(dir) => dir,
        None => lockstep_examples::private_state_dir()?.join(format!(
            "mnist-estimator-{workers}w-seed{}-{max_steps}steps",
            args.seed
        )),
    };
    let mut config = RunConfig::new(model_dir).cluster(cluster.clone());
    config.save_checkpoints_steps = Some(args.save_checkpoints_steps);
    config.random_seed = Some(args.seed);
    if cluster.rank().is_some() {
        config = config.train_distribute(MultiWorkerMirroredStrategy::with_transport_options(
            &cluster,
            CommunicationOptions::default(),
            1,
            &args.cluster.transport(),
        )?);
    }
    let seed = args.seed;
    // The tutorial's input_fn: this worker's shard, scaled, shuffled, in batches of 64;
    // training repeats it so that every worker takes exactly max_steps steps.
    let input_fn = |mode: ModeKeys, context: &InputContext| {
        let split = if mode == ModeKeys::Train {
            &mnist.train
        } else {
            &mnist.test
        };
        let passes = (mode != ModeKeys::Train).then_some(1);
        Ok::<_, TrainError>(
            split
                .dataset()?
                .shard(context.num_input_pipelines, context.input_pipeline_id)?
                .shuffle(10_000, seed, true)
                .map(|(x, y)| (scale(&x), y))
                .repeat(passes)
                .batch(BATCH_SIZE, false),
        )
    };
    let mut estimator = Estimator::new(model_fn, config);
    let mut eval_spec = EvalSpec::new(&input_fn);
    eval_spec.steps = (args.eval_steps > 0).then_some(args.eval_steps);
    eval_spec.start_delay_secs = 0;
    eval_spec.throttle_secs = args.throttle_secs;
    let result = train_and_evaluate(
        &mut estimator,
        &TrainSpec::new(&input_fn, Some(max_steps)),
        &eval_spec,
    )?;
    if let Some(logs) = result {
        println!(
            "{{'loss': {:.4}, 'global_step': {}}}",
            logs.get("loss").unwrap_or(f64::NAN),
            logs.get("global_step").unwrap_or(0.0)
        );
    }
    Ok(())
}
