//! The tutorial CNN trained asynchronously under `ParameterServerStrategy`, as TensorFlow's
//! parameter-server training tutorial: the `ps` tasks hold the variables (and apply the
//! optimizer to them), the workers run steps on their own shards of the embedded MNIST
//! subset, and the chief schedules `--steps-per-epoch` steps an epoch on whichever workers
//! are free, then evaluates on the test split and ends the cluster's training.
//!
//! ```text
//! $ cargo xtask run-cluster --example mnist_parameter_server --workers 2 --ps 2 --chief
//! [chief:0] Epoch 1/3 - 124 steps - 0.8s - accuracy: 0.7975 - loss: 0.6878
//! [chief:0] Epoch 2/3 - 124 steps - 0.6s - accuracy: 0.9556 - loss: 0.1540
//! [chief:0] Epoch 3/3 - 124 steps - 0.7s - accuracy: 0.9701 - loss: 0.0994
//! [chief:0] test_accuracy=0.9626 steps=372 examples=23638 examples_per_s=11343 ps_tasks=2 workers=2
//! ```
//!
//!
//! ```text
//! $ cargo xtask run-cluster --example mnist_parameter_server --workers 2 --ps 2 --chief --evaluator
//! [evaluator:0] evaluated=3 last_checkpoint=weights-3.safetensors iterations=372 test_accuracy=0.9626 test_loss=0.1278
//! ```
//!
//! (Stdout; the chief prints, and an evaluator task evaluates each epoch's weights as the
//! chief saves them, the last one the chief's final weights. Every task also prints its
//! `peak_rss_mib`. Steps are asynchronous, so the figures vary a little from run
//! to run; times and `examples_per_s` depend on the machine.) A worker killed mid-run
//! (`--kill worker:1@STEP --keep-going`) has its step run on another and training goes on. A
//! `ps` task killed (`--kill ps:0@UPDATES`, after it applied that many gradients) is an error
//! on the chief that names it; with `--restart-on-failure 1` the restarted cluster resumes
//! from the chief's checkpoint of the last finished epoch, also on another number of `ps`
//! tasks (`--keep-backup` and `--backup-dir` carry one from run to run). So does a cluster
//! whose chief was killed (`--kill chief:0@STEPS`, once that many steps have finished).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use lockstep_cluster::{Cluster, EVALUATOR};
use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{Dataset, InputContext};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs};
use lockstep_nn::{
    Activation, Adam, Dense, Flatten, Layer, NnError, Optimizer, Sequential, Sgd,
    SparseCategoricalCrossentropy, models,
};
use lockstep_ps::FixedShardsPartitioner;
use lockstep_train::{
    Model, OneDeviceStrategy, ParameterServerModel, ParameterServerStrategy, PsRole,
    SidecarEvaluator, TrainError, serve_steps,
};

/// Activations of several MB are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train the tutorial CNN under `ParameterServerStrategy` across the tasks of `TF_CONFIG`
/// (a chief, workers and `ps` tasks).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Steps the chief schedules an epoch (default: a pass over the training subset at
    /// `--batch-per-worker` examples a step).
    #[arg(long)]
    steps_per_epoch: Option<u64>,
    /// The model: `cnn`, the tutorial's CNN, or `mlp`, the 784 → 128 → 10 network of the
    /// TensorFlow reference `tf_ps_strategy.py` measures.
    #[arg(long, default_value = "cnn", value_parser = ["cnn", "mlp"])]
    model: String,
    /// `adam` (the default) or `sgd` (the reference's).
    #[arg(long, default_value = "adam", value_parser = ["adam", "sgd"])]
    optimizer: String,
    /// The optimizer's step size.
    #[arg(long, default_value_t = 0.001)]
    learning_rate: f32,
    /// Where the chief keeps its checkpoint of every shard at each epoch's end, from which a
    /// restarted cluster (of any number of `ps` tasks) resumes; deleted when training
    /// completes. By default a directory named after the run's settings in `lockstep-<uid>`
    /// under the system's temporary directory, which only this user may use.
    #[arg(long)]
    backup_dir: Option<PathBuf>,
    /// Keep the checkpoints when training completes.
    #[arg(long)]
    keep_backup: bool,
    /// Train without checkpoints.
    #[arg(long)]
    no_backup: bool,
    /// The chief saves each epoch's weights as `DIR/weights-{epoch}.safetensors`, and a task
    /// of type `evaluator` evaluates each (the Keras guide's `SidecarEvaluator`). With an
    /// evaluator in `TF_CONFIG` and no directory given, one named after the cluster's
    /// addresses in `lockstep-<uid>` under the system's temporary directory, removed by the
    /// evaluator when it is done.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// The chief writes each epoch's logs here as `TensorBoard` scalars (`train/`).
    #[arg(long)]
    tensorboard_dir: Option<PathBuf>,
    /// The evaluator fails when the chief writes no new weights for this long.
    #[arg(long, default_value_t = 600)]
    evaluator_timeout_secs: u64,
    /// Cut every variable into this many shards along its first axis
    /// (`FixedShardsPartitioner`); by default each variable is one shard, the variables
    /// placed on the `ps` tasks in turn.
    #[arg(long)]
    shards: Option<usize>,
}

fn loss() -> SparseCategoricalCrossentropy {
    SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    }
}

fn main() -> anyhow::Result<()> {
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let mut strategy = lockstep_examples::parameter_server_strategy(&args.training, &args.cluster)?;
    if let Some(shards) = args.shards {
        strategy = strategy.with_partitioner(FixedShardsPartitioner::new(shards)?);
    }
    let seed = args.training.seed;
    let batch = args.training.batch_per_worker;
    let mlp = args.model == "mlp";
    let build = move || -> Result<Sequential, NnError> {
        if mlp {
            let layers: Vec<Box<dyn Layer>> = vec![
                Box::new(Flatten),
                Box::new(Dense::new(128).activation(Activation::Relu)),
                Box::new(Dense::new(10)),
            ];
            Sequential::new(&[28, 28, 1], layers, seed)
        } else {
            models::mnist_cnn(seed)
        }
    };
    let role = strategy.role()?;
    match role {
        PsRole::ParameterServer(_) => lockstep_examples::serve_parameters(&strategy)?,
        PsRole::Worker(_) => {
            let dataset_fn = |context: &InputContext| -> Result<_, TrainError> {
                Ok(Mnist::embedded()?
                    .train
                    .dataset()?
                    .shard(context.num_input_pipelines, context.input_pipeline_id)?
                    .shuffle(10_000, seed, true)
                    .map(|(x, y)| (scale(&x), y))
                    .batch(batch, false)
                    .repeat(None))
            };
            serve_steps(&strategy, build, loss(), &["accuracy"], dataset_fn)?;
        }
        PsRole::Coordinator => train(&args, strategy, build)?,
        PsRole::Evaluator => evaluate_beside(&args, strategy.cluster(), build)?,
    }
    if let Some(mib) = lockstep_examples::peak_rss_mib() {
        println!("peak_rss_mib={mib} role={role:?}");
    }
    Ok(())
}

/// The optimizer `args` name.
fn optimizer(args: &Args) -> Box<dyn Optimizer> {
    match args.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(args.learning_rate)),
        _ => Box::new(Adam::new(args.learning_rate)),
    }
}

/// Where the chief saves each epoch's weights for the evaluator, and whether it is the
/// default (the evaluator removes it when done).
fn weights_dir(args: &Args, cluster: &Cluster) -> anyhow::Result<Option<(PathBuf, bool)>> {
    if let Some(dir) = &args.checkpoint_dir {
        return Ok(Some((dir.clone(), false)));
    }
    if !cluster.spec().has_job(EVALUATOR) {
        return Ok(None);
    }
    // The same for every task of a cluster, and new for each start of one (its ports differ).
    let hash = lockstep_examples::fnv1a(format!("{:?}", cluster.spec()).bytes().map(u64::from));
    let dir = lockstep_examples::private_state_dir()?;
    Ok(Some((
        dir.join(format!("mnist-ps-weights-{hash:016x}")),
        true,
    )))
}

/// The evaluator task: the Keras guide's `SidecarEvaluator` over the test digits, until the
/// last epoch's weights.
fn evaluate_beside(
    args: &Args,
    cluster: &Cluster,
    build: impl Fn() -> Result<Sequential, NnError>,
) -> anyhow::Result<()> {
    let Some((dir, scratch)) = weights_dir(args, cluster)? else {
        anyhow::bail!("an evaluator needs the chief's weights: pass --checkpoint-dir");
    };
    let mut model = Model::new(OneDeviceStrategy::new(), build)?;
    // It never steps: the optimizer is only what `compile` needs.
    model.compile(Sgd::new(args.learning_rate), loss(), &["accuracy"])?;
    let test = Mnist::embedded()?
        .test
        .dataset()?
        .map(|(x, y)| (scale(&x), y));
    let test = model.distribute_dataset(test, 256)?;
    let evaluations = SidecarEvaluator::new(&mut model, &test, &dir)
        .max_evaluations(args.training.epochs)
        .timeout(Duration::from_secs(args.evaluator_timeout_secs))
        .start()
        .with_context(|| format!("evaluating the weights in {}", dir.display()))?;
    let summary = lockstep_examples::evaluation_summary(&evaluations)
        .context("the evaluator ended without evaluating")?;
    println!("{summary}");
    if scratch {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the weights in {}", dir.display()))?;
    }
    Ok(())
}

/// The chief: compile, fit, evaluate, end the cluster's training.
fn train(
    args: &Args,
    strategy: ParameterServerStrategy,
    build: impl Fn() -> Result<Sequential, NnError>,
) -> anyhow::Result<()> {
    let (workers, ps) = (strategy.num_workers(), strategy.num_ps());
    let cluster = strategy.cluster().clone();
    let strategy_cluster = &cluster;
    let mnist = Mnist::embedded()?;
    let batch = args.training.batch_per_worker;
    let steps_per_epoch = args
        .steps_per_epoch
        .unwrap_or((mnist.train.len() / batch) as u64);
    let mut model = ParameterServerModel::new(strategy, build)?;
    let weights = weights_dir(args, strategy_cluster)?;
    model.compile(&*optimizer(args), loss(), &["accuracy"])?;
    if let Some(dir) = &args.tensorboard_dir {
        model.tensorboard(dir);
    }
    if let Some((dir, _)) = weights {
        model.model_checkpoint(format!("{}/weights-{{epoch}}.safetensors", dir.display()));
    }
    if !args.no_backup {
        let dir = match &args.backup_dir {
            Some(dir) => dir.clone(),
            None => lockstep_examples::private_state_dir()?.join(format!(
                "mnist-ps-backup-{}-{}-lr{}-b{batch}-seed{}-{workers}w",
                args.model, args.optimizer, args.learning_rate, args.training.seed
            )),
        };
        model.backup_and_restore(&dir, !args.keep_backup)?;
    }
    let started = Instant::now();
    let history = match model.fit(args.training.epochs, steps_per_epoch, true) {
        Ok(history) => history,
        Err(e) => {
            // The workers and the ps tasks that still answer end their service too.
            if let Err(also) = model.shutdown_cluster() {
                eprintln!("ending the cluster's training after the failure: {also}");
            }
            return Err(e).context("training");
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let test = mnist
        .test
        .dataset()?
        .map(|(x, y)| (scale(&x), y))
        .batch(256, false);
    let logs = model.evaluate(&test)?;
    println!(
        "test_accuracy={:.4} steps={} examples={} examples_per_s={:.0} ps_tasks={ps} workers={workers}",
        logs.get("accuracy").unwrap_or(f64::NAN),
        history.steps,
        history.examples,
        history.examples as f64 / seconds
    );
    model.shutdown_cluster()?;
    Ok(())
}
