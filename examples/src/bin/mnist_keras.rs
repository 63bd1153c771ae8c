//! The multi-worker Keras tutorial in Rust: the tutorial's CNN built under
//! `MultiWorkerMirroredStrategy` (from `TF_CONFIG`; one local worker without it), trained with
//! `fit` and `BackupAndRestore` (plus `TensorBoard` and `ModelCheckpoint` when asked), then
//! evaluated on the test split. A task of type `evaluator` runs the Keras guide's
//! `SidecarEvaluator` instead: it evaluates each epoch's weights as the chief saves them.
//!
//! ```text
//! $ cargo xtask run-cluster              # 2 workers, this example, 3 epochs
//! [worker:0] Epoch 1/3 - 63 steps - 0.5s - accuracy: 0.8012 - loss: 0.7554
//! [worker:0] Epoch 2/3 - 63 steps - 0.4s - accuracy: 0.9501 - loss: 0.1796
//! [worker:0] Epoch 3/3 - 63 steps - 0.4s - accuracy: 0.9654 - loss: 0.1163
//! [worker:0] test_accuracy=0.9596 weights_checksum=cdb5065ef65a75fc steps=189 examples_here=12084 examples_per_s=18279 loop_examples_per_s=20434 comm_wait_share=0.06 first_step_s=0.18 peak_rss_mib=102
//! [worker:1] test_accuracy=0.9596 weights_checksum=cdb5065ef65a75fc steps=189 examples_here=11904 examples_per_s=18453 loop_examples_per_s=20434 comm_wait_share=0.08 first_step_s=0.18 peak_rss_mib=84
//! ```
//!
//! (Stdout; only the chief prints the epoch lines. `examples_here` counts the examples this
//! worker trained on; `comm_wait_share` is the share of its steps' time blocked in their
//! collectives; `examples_per_s` counts every step of `fit` over its wall time,
//! `loop_examples_per_s` the steps after the first over the time from its end, the steady
//! speed without the first step's set-up. Times, both speeds, `comm_wait_share`, `first_step_s`
//! (process start to the end of the first step) and `peak_rss_mib` depend on the machine;
//! everything else is the same from run to run. The last step of each epoch is the
//! short remainder of the data, 7996 = 62 × 128 + 60, as Keras trains it, and falls to
//! worker 0.) Kill a worker mid-run and start the cluster
//! again: training resumes from the backup and ends with the same weights.
//!
//! ```text
//! $ cargo xtask run-cluster --evaluator  # 2 workers and an evaluator
//! [evaluator:0] evaluated=3 last_checkpoint=ckpt-3 iterations=189 test_accuracy=0.9596 test_loss=0.1487
//! ```
//!
//! (The evaluator evaluates the newest checkpoint each time it looks, so `evaluated` may be
//! fewer than the epochs; the last is always the last epoch's.)

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use lockstep_cluster::{Cluster, EVALUATOR};
use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, scale};
use lockstep_examples::{ClusterArgs, ClusterTrainingArgs, CommunicationArgs};
use lockstep_nn::{Adam, Sgd, SparseCategoricalCrossentropy, models};
use lockstep_train::{
    BackupAndRestore, Model, ModelCheckpoint, MultiWorkerMirroredStrategy, OneDeviceStrategy,
    SaveFreq, SidecarEvaluator, TensorBoard,
};

/// Activations of several MB are allocated every step; mimalloc keeps them mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train the tutorial CNN with Keras-style `fit` across the workers of `TF_CONFIG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    communication: CommunicationArgs,
    /// Where the chief keeps the backup that a restarted cluster resumes from (deleted after
    /// a run that completes). By default a directory named after the run's settings (so a run
    /// resumes only a backup of the same settings) in `lockstep-<uid>` under the system's
    /// temporary directory, which only this user may use.
    #[arg(long)]
    backup_dir: Option<PathBuf>,
    /// Train without `BackupAndRestore` (as the reference scripts measure throughput).
    #[arg(long)]
    no_backup: bool,
    /// Back up every this many steps rather than at every epoch's end.
    #[arg(long)]
    backup_every_steps: Option<u64>,
    /// `adam` (the default) or `sgd` (the tutorial's; the anchors' throughput runs use it).
    #[arg(long, default_value = "adam")]
    optimizer: String,
    /// Step size (default: Adam's 0.001, SGD's 0.001 as in the tutorial).
    #[arg(long, default_value_t = 0.001)]
    learning_rate: f32,
    /// Write event files for tensorboard here (`train/`, `validation/`), as Keras' callback does.
    #[arg(long)]
    tensorboard_dir: Option<PathBuf>,
    /// Save the weights at every epoch's end to this path (a Keras pattern such as
    /// `weights.{epoch:02d}.safetensors`).
    #[arg(long)]
    checkpoint_path: Option<String>,
    /// The chief saves the weights at every epoch's end as `DIR/ckpt-{epoch}`, and a task of
    /// type `evaluator` evaluates each. With an evaluator in `TF_CONFIG` and no directory
    /// given, one named after the cluster's addresses in `lockstep-<uid>` under the system's
    /// temporary directory, removed by the evaluator when it is done.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Units of the CNN's hidden dense layer (the tutorial's 128). Every worker must use the
    /// same: workers that build different models stop with an error saying so.
    #[arg(long, default_value_t = 128)]
    dense_units: usize,
    /// The model: `cnn`, the two-convolution CNN of Keras' multi-worker tutorial (225,034
    /// parameters), or `tutorial-literal`, the one-convolution model of its `mnist_setup.py`
    /// (2,770,634 parameters: 12× the gradient bytes a step; `--dense-units` is for `cnn`).
    #[arg(long, default_value = "cnn", value_parser = ["cnn", "tutorial-literal"])]
    model: String,
    /// The evaluator fails when the chief writes no new checkpoint for this long.
    #[arg(long, default_value_t = 600)]
    evaluator_timeout_secs: u64,
}

/// Where the chief saves `ckpt-{epoch}` for the evaluator, and whether it is the default.
fn checkpoint_dir(args: &Args, cluster: &Cluster) -> anyhow::Result<Option<(PathBuf, bool)>> {
    if let Some(dir) = &args.checkpoint_dir {
        return Ok(Some((dir.clone(), false)));
    }
    if !cluster.spec().has_job(EVALUATOR) {
        return Ok(None);
    }
    // The same for every task of a cluster and new for each start of one (its ports
    // differ): an evaluator shown an earlier run's checkpoints would report them.
    let hash = lockstep_examples::fnv1a(format!("{:?}", cluster.spec()).bytes().map(u64::from));
    let dir = lockstep_examples::private_state_dir()?;
    Ok(Some((
        dir.join(format!("mnist-keras-checkpoints-{hash:016x}")),
        true,
    )))
}

/// The tutorial's model, compiled as `args` asks.
fn compiled_model(strategy: impl lockstep_train::Strategy, args: &Args) -> anyhow::Result<Model> {
    let seed = args.training.seed;
    let mut model = match args.model.as_str() {
        "tutorial-literal" => Model::new(strategy, || models::mnist_tutorial_literal(seed))?,
        _ => Model::new(strategy, || {
            models::mnist_cnn_with_dense_units(seed, args.dense_units)
        })?,
    };
    let loss = SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    };
    match args.optimizer.as_str() {
        "adam" => model.compile(Adam::new(args.learning_rate), loss, &["accuracy"])?,
        "sgd" => model.compile(Sgd::new(args.learning_rate), loss, &["accuracy"])?,
        other => anyhow::bail!("unknown optimizer {other:?}: use adam or sgd"),
    }
    Ok(model)
}

/// The evaluator task: the Keras guide's `SidecarEvaluator` over the test digits, until the
/// last epoch's checkpoint.
fn run_evaluator(args: &Args, cluster: &Cluster) -> anyhow::Result<()> {
    let Some((dir, scratch)) = checkpoint_dir(args, cluster)? else {
        anyhow::bail!("an evaluator needs the chief's checkpoints: pass --checkpoint-dir");
    };
    let mut model = compiled_model(OneDeviceStrategy::new(), args)?;
    let test = Mnist::embedded()?
        .test
        .dataset()?
        .map(|(x, y)| (scale(&x), y));
    let test = model.distribute_dataset(test, args.training.batch_per_worker)?;
    let mut sidecar = SidecarEvaluator::new(&mut model, &test, &dir)
        .max_evaluations(args.training.epochs)
        .timeout(Duration::from_secs(args.evaluator_timeout_secs));
    if let Some(log_dir) = &args.tensorboard_dir {
        sidecar = sidecar.log_dir(log_dir);
    }
    let evaluations = sidecar
        .start()
        .with_context(|| format!("evaluating the checkpoints in {}", dir.display()))?;
    let summary = lockstep_examples::evaluation_summary(&evaluations)
        .context("the evaluator ended without evaluating")?;
    println!("{summary}");
    if scratch {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the checkpoints in {}", dir.display()))?;
    }
    Ok(())
}

/// The `BackupAndRestore` callback `args` ask for, if any.
fn backup(
    args: &Args,
    global_batch: usize,
    workers: usize,
) -> anyhow::Result<Option<BackupAndRestore>> {
    if args.no_backup {
        return Ok(None);
    }
    let backup_dir = match &args.backup_dir {
        Some(dir) => dir.clone(),
        None => lockstep_examples::private_state_dir()?.join(format!(
            "mnist-keras-backup-{}-lr{}-{}x{}-seed{}",
            args.optimizer,
            args.learning_rate,
            global_batch / workers,
            workers,
            args.training.seed
        )),
    };
    Ok(Some(
        BackupAndRestore::new(backup_dir).save_freq(
            args.backup_every_steps
                .map_or(SaveFreq::Epoch, SaveFreq::Steps),
        ),
    ))
}

fn main() -> anyhow::Result<()> {
    let process_started = Instant::now();
    lockstep_examples::init_logging();
    lockstep_examples::keep_freed_memory_mapped();
    let args = Args::parse();
    let cluster = args.cluster.resolve()?;
    args.training
        .start_kernel_threads(cluster.group_tasks_on_this_host())?;
    if cluster.task().job == EVALUATOR {
        return run_evaluator(&args, &cluster);
    }
    if cluster.rank().is_none() {
        println!(
            "task {} has no training role in this example",
            cluster.task()
        );
        return Ok(());
    }
    let workers = cluster.world_size().max(1);
    let strategy = MultiWorkerMirroredStrategy::with_transport_options(
        &cluster,
        args.communication.options(),
        1,
        &args.cluster.transport(),
    )?;
    let mut model = compiled_model(strategy, &args)?;
    if model.is_chief() {
        eprintln!("{}", model.summary());
    }

    let mnist = Mnist::embedded()?;
    let train = mnist
        .train
        .dataset()?
        // The tutorial's `map(scale).cache().shuffle()` reordered: the digits are in memory
        // already, so the bytes are shuffled and each is scaled as its batch is made (a
        // 4-byte `f32` cache would cost 19 MB of memory for ~1 ms of work an epoch).
        .shuffle(10_000, args.training.seed, true)
        .map(|(x, y)| (scale(&x), y));
    let global_batch = args.training.global_batch(workers);
    let train = model.distribute_dataset(train, global_batch)?;
    let test = mnist.test.dataset()?.map(|(x, y)| (scale(&x), y));
    let test = model.distribute_dataset(test, global_batch)?;

    let started = Instant::now();
    let mut clock = lockstep_examples::StepClock::new(process_started);
    let mut fit = model
        .fit(&train)
        .epochs(args.training.epochs)
        .callback(&mut clock);
    if let Some(backup) = backup(&args, global_batch, workers)? {
        fit = fit.callback(backup);
    }
    if let Some(dir) = &args.tensorboard_dir {
        fit = fit.callback(TensorBoard::new(dir));
    }
    if let Some(pattern) = &args.checkpoint_path {
        fit = fit.callback(ModelCheckpoint::new(pattern.as_str()).save_weights_only(true));
    }
    if let Some((dir, _)) = checkpoint_dir(&args, &cluster)? {
        let pattern = dir.join("ckpt-{epoch}");
        // Weights files, which the evaluator's SidecarEvaluator reads.
        fit = fit.callback(ModelCheckpoint::new(pattern.to_string_lossy()).save_weights_only(true));
    }
    let history = fit.run()?;
    let elapsed = started.elapsed().as_secs_f64();
    let steps = model
        .optimizer()
        .map_or(0, lockstep_nn::Optimizer::iterations);

    let checksum = lockstep_examples::fnv1a(
        model
            .network()
            .parameters()
            .values()
            .iter()
            .map(|v| u64::from(v.to_bits())),
    );
    let logs = model.evaluate(&test)?;
    println!(
        "test_accuracy={:.4} weights_checksum={checksum:016x} steps={steps} examples_here={} examples_per_s={:.0} loop_examples_per_s={:.0} comm_wait_share={:.2} first_step_s={:.2} peak_rss_mib={}",
        logs.get("accuracy").unwrap_or(0.0),
        history.local_examples,
        history.examples as f64 / elapsed,
        clock.loop_examples_per_s(history.examples, global_batch as u64),
        history.comm_wait.as_secs_f64() / history.step_time.as_secs_f64().max(f64::MIN_POSITIVE),
        clock.first_step_s(),
        lockstep_examples::peak_rss_mib().map_or_else(|| "unknown".to_owned(), |m| m.to_string()),
    );
    Ok(())
}
