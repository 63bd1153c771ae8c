//! `tf.estimator.train_and_evaluate`: workers train, the evaluator task evaluates the
//! chief's checkpoints as they appear.

use std::time::{Duration, Instant};

use lockstep_cluster::{Cluster, EVALUATOR};
use lockstep_data::{Dataset, InputContext};

use super::{Estimator, ModeKeys};
use crate::batch::LabeledBatch;
use crate::checkpoint_watcher::{CheckpointWatcher, ManagedCheckpoints};
use crate::error::TrainError;
use crate::history::Logs;
use crate::tensorboard::EventWriter;

/// What to train on and for how long, as `tf.estimator.TrainSpec`.
#[derive(Debug, Clone)]
pub struct TrainSpec<F> {
    /// `input_fn(mode, input_context)`: this worker's batches.
    pub input_fn: F,
    /// Train until the global step reaches this (`None`: until the input ends).
    pub max_steps: Option<u64>,
}

impl<F> TrainSpec<F> {
    /// Trains on `input_fn` until `max_steps`.
    pub fn new(input_fn: F, max_steps: Option<u64>) -> Self {
        Self {
            input_fn,
            max_steps,
        }
    }
}

/// What to evaluate on and when, as `tf.estimator.EvalSpec`, with TensorFlow's defaults:
/// 100 batches, no name, 120 s before the first evaluation, at least 600 s between two.
#[derive(Debug, Clone)]
pub struct EvalSpec<F> {
    /// `input_fn(mode, input_context)`: the evaluation batches.
    pub input_fn: F,
    /// Batches per evaluation (`None`: until the input ends).
    pub steps: Option<u64>,
    /// Names the evaluation: its summaries go to `model_dir/eval_<name>` (`eval` without).
    pub name: Option<String>,
    /// The evaluator waits this long before its first evaluation.
    pub start_delay_secs: u64,
    /// The evaluator starts evaluations at least this far apart.
    pub throttle_secs: u64,
}

impl<F> EvalSpec<F> {
    /// Evaluates on `input_fn` with TensorFlow's defaults.
    pub fn new(input_fn: F) -> Self {
        Self {
            input_fn,
            steps: Some(100),
            name: None,
            start_delay_secs: 120,
            throttle_secs: 600,
        }
    }

    fn summary_dir(&self) -> String {
        self.name
            .as_ref()
            .map_or_else(|| "eval".to_owned(), |name| format!("eval_{name}"))
    }
}

/// Trains and evaluates as TensorFlow's distributed `train_and_evaluate`: every worker
/// trains in lockstep to `train_spec.max_steps` and the chief writes checkpoints; a task of
/// type `evaluator` trains nothing: it waits `start_delay_secs`, then evaluates the newest
/// checkpoint it has not evaluated, at most every `throttle_secs`, writes the metrics to
/// `model_dir/eval_<name>`, and returns after evaluating the checkpoint at `max_steps`, or
/// the last checkpoint when training ended before (the chief records where it ended).
/// Without an evaluator task the chief evaluates the final checkpoint after training
/// (TensorFlow evaluates nothing then). A task outside the collective group and not the
/// evaluator (a `ps` task) trains and writes nothing. Returns the final evaluation's metrics
/// where one ran (the evaluator, or the chief without one), `None` on the other tasks.
///
/// # Errors
///
/// What training or evaluation returns; on the evaluator, `max_steps` must be set (it is
/// how the evaluator knows training ended).
pub fn train_and_evaluate<F, G, D, E, B, C>(
    estimator: &mut Estimator,
    train_spec: &TrainSpec<F>,
    eval_spec: &EvalSpec<G>,
) -> Result<Option<Logs>, TrainError>
where
    F: Fn(ModeKeys, &InputContext) -> Result<D, TrainError>,
    D: Dataset<Item = B>,
    B: LabeledBatch,
    G: Fn(ModeKeys, &InputContext) -> Result<E, TrainError>,
    E: Dataset<Item = C>,
    C: LabeledBatch,
{
    let cluster = estimator.config().resolved_cluster()?;
    if cluster.task().job == EVALUATOR {
        let max_steps = train_spec.max_steps.ok_or_else(|| {
            TrainError::invalid(
                "train_and_evaluate",
                "the evaluator needs TrainSpec::max_steps to know when training ends",
            )
        })?;
        return run_evaluator(estimator, max_steps, eval_spec).map(Some);
    }
    if cluster.rank().is_none() {
        // A `ps` task (or any other outside the collective group) trains nothing, so it must
        // not write into the model directory the trainers share either.
        tracing::info!(
            task = %cluster.task(),
            "this task has no training role under train_and_evaluate: it writes nothing"
        );
        return Ok(None);
    }
    check_strategy_fits(estimator, &cluster)?;
    let has_evaluator = cluster.spec().has_job(EVALUATOR);
    estimator.train(&train_spec.input_fn, None, train_spec.max_steps)?;
    if has_evaluator || !estimator.is_chief() {
        return Ok(None);
    }
    let logs = estimator.evaluate(&eval_spec.input_fn, eval_spec.steps)?;
    write_eval_summaries(&mut eval_writer(estimator, eval_spec)?, &logs)?;
    tracing::info!("evaluation: {}", logs.line());
    Ok(Some(logs))
}

/// A trainer's strategy must train the cluster's workers together: one that trains this
/// process alone (the default `OneDeviceStrategy`, or `MirroredStrategy`) in a cluster of
/// several workers would write checkpoints as a second chief, or train apart from the others.
fn check_strategy_fits(estimator: &Estimator, cluster: &Cluster) -> Result<(), TrainError> {
    let workers = estimator.context.num_input_pipelines;
    if workers != cluster.world_size().max(1) || estimator.is_chief() != cluster.is_chief() {
        return Err(TrainError::invalid(
            "train_and_evaluate",
            format!(
                "task {} is one of {} workers in its cluster, but the RunConfig's train_distribute trains {workers} worker(s){}: give it a MultiWorkerMirroredStrategy of this cluster",
                cluster.task(),
                cluster.world_size(),
                if estimator.is_chief() {
                    " as the chief"
                } else {
                    ""
                },
            ),
        ));
    }
    Ok(())
}

fn run_evaluator<G, E, C>(
    estimator: &mut Estimator,
    max_steps: u64,
    eval_spec: &EvalSpec<G>,
) -> Result<Logs, TrainError>
where
    G: Fn(ModeKeys, &InputContext) -> Result<E, TrainError>,
    E: Dataset<Item = C>,
    C: LabeledBatch,
{
    std::thread::sleep(Duration::from_secs(eval_spec.start_delay_secs));
    // Looking for a new checkpoint costs a directory listing: often enough that a short
    // throttle is honoured, rarely enough to cost nothing.
    let poll = Duration::from_millis(200);
    let mut watcher = CheckpointWatcher::new(
        ManagedCheckpoints(estimator.model_dir().to_path_buf()),
        poll,
    );
    let mut writer = eval_writer(estimator, eval_spec)?;
    let throttle = Duration::from_secs(eval_spec.throttle_secs);
    let mut last: Option<(u64, Logs)> = None;
    loop {
        let Some((_, _, checkpoint)) = watcher.wait_for_new(Some(Instant::now() + poll * 5))?
        else {
            // No new checkpoint: training may have ended short of max_steps (its input ran
            // out), which the chief records once its final checkpoint is saved.
            if let (Some(end), Some((step, logs))) = (
                super::finished_marker::read(estimator.model_dir()),
                last.as_ref(),
            ) && *step >= end
            {
                tracing::info!(global_step = step, "training ended before max_steps");
                return Ok(logs.clone());
            }
            continue;
        };
        let started = Instant::now();
        let step = checkpoint.progress.step;
        let logs =
            estimator.evaluate_checkpoint(&eval_spec.input_fn, eval_spec.steps, &checkpoint)?;
        tracing::info!(
            global_step = step,
            "evaluation of ckpt-{step}: {}",
            logs.line()
        );
        write_eval_summaries(&mut writer, &logs)?;
        if step >= max_steps {
            return Ok(logs);
        }
        last = Some((step, logs));
        if let Some(rest) = throttle.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// The event file of the evaluations, in `model_dir/eval_<name>`.
fn eval_writer<G>(
    estimator: &Estimator,
    eval_spec: &EvalSpec<G>,
) -> Result<EventWriter, TrainError> {
    EventWriter::create(&estimator.model_dir().join(eval_spec.summary_dir()))
}

/// An evaluation's metrics at its global step.
fn write_eval_summaries(writer: &mut EventWriter, logs: &Logs) -> Result<(), TrainError> {
    let step = logs.get("global_step").unwrap_or(0.0) as u64;
    let scalars: Vec<(String, f64)> = logs
        .0
        .iter()
        .filter(|(name, _)| *name != "global_step")
        .map(|(name, value)| (name.clone(), *value))
        .collect();
    writer.scalars(step, &scalars)?;
    writer.flush()
}
