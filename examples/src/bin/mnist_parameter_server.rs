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
//! (Stdout; the chief prints. Steps are asynchronous, so the figures vary a little from run
//! to run; times and `examples_per_s` depend on the machine.) A worker killed mid-run
//! (`--kill worker:1@STEP --keep-going`) has its step run on another and training goes on. A
//! `ps` task killed (`--kill ps:0@UPDATES`, after it applied that many gradients) is an error
//! on the chief that names it; with `--restart-on-failure 1` the restarted cluster resumes
//! from the chief's checkpoint of the last finished epoch, also on another number of `ps`
//! tasks (`--keep-backup` and `--backup-dir` carry one from run to run).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use lockstep_collective::ClusterSecret;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{Dataset, InputContext};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs};
use lockstep_nn::{
    Activation, Adam, Dense, Flatten, Layer, NnError, Optimizer, Sequential, Sgd,
    SparseCategoricalCrossentropy, models,
};
use lockstep_ps::FixedShardsPartitioner;
use lockstep_train::{
    ParameterServerModel, ParameterServerStrategy, PsRole, TrainError, serve_steps,
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
    let cluster = args.cluster.resolve()?;
    lockstep_examples::start_kernel_threads(args.training.threads, cluster.spec().tasks().count())?;
    let mut strategy = ParameterServerStrategy::new(cluster, ClusterSecret::from_env()?)?
        .with_timeout(args.cluster.rendezvous_timeout());
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
        PsRole::ParameterServer(_) => strategy.serve_parameters()?,
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
        PsRole::Evaluator => println!("an evaluator has no part in this example"),
    }
    if let Some(mib) = peak_rss_mib() {
        println!("peak_rss_mib={mib} role={role:?}");
    }
    Ok(())
}

/// This process's peak resident memory in MiB (`VmHWM`), when the system tells.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The chief: compile, fit, evaluate, end the cluster's training.
fn train(
    args: &Args,
    strategy: ParameterServerStrategy,
    build: impl Fn() -> Result<Sequential, NnError>,
) -> anyhow::Result<()> {
    let (workers, ps) = (strategy.num_workers(), strategy.num_ps());
    let mnist = Mnist::embedded()?;
    let batch = args.training.batch_per_worker;
    let steps_per_epoch = args
        .steps_per_epoch
        .unwrap_or((mnist.train.len() / batch) as u64);
    let mut model = ParameterServerModel::new(strategy, build)?;
    let optimizer: Box<dyn Optimizer> = match args.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(args.learning_rate)),
        _ => Box::new(Adam::new(args.learning_rate)),
    };
    model.compile(&*optimizer, loss(), &["accuracy"])?;
    if !args.no_backup {
        let dir = match &args.backup_dir {
            Some(dir) => dir.clone(),
            None => lockstep_examples::private_state_dir()?.join(format!(
                "mnist-ps-backup-lr{}-b{batch}-seed{}-{workers}w",
                args.learning_rate, args.training.seed
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
