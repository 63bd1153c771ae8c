//! The Estimator API of `tf.estimator` (removed from TensorFlow in 2.16) on Lockstep's
//! strategies and checkpoints: a `model_fn` returning an [`EstimatorSpec`], a [`RunConfig`],
//! `train`/`evaluate`/`predict`, and [`train_and_evaluate`] with an evaluator task.

pub(crate) mod finished_marker;
mod run_config;
mod spec;
mod steps;
mod train_and_evaluate;
mod variables;

use std::path::{Path, PathBuf};
use std::time::Instant;

use lockstep_checkpoint::{Checkpoint, CheckpointError, CheckpointManager};
use lockstep_data::{Dataset, ElementStream, InputContext, Iter};
use lockstep_nn::ForwardContext;
use lockstep_tensor::Tensor;

pub use run_config::RunConfig;
pub use spec::{EstimatorSpec, EvalMetricOp, ModeKeys};
pub use train_and_evaluate::{EvalSpec, TrainSpec, train_and_evaluate};
pub use variables::Variables;

use crate::batch::LabeledBatch;
use crate::error::TrainError;
use crate::history::Logs;
use crate::kill_switch::KillSwitch;
use crate::model::Model;
use crate::state::{Position, TrainingContext, restore_into, restore_weights};
use crate::strategy::{OneDeviceStrategy, Strategy};
use crate::tensorboard::EventWriter;
use steps::ReplicaBatch;
use steps::{EvalTotals, evaluate_batches, split_batch, train_step};

/// The `params` handed to every `model_fn` call, as TensorFlow's `params` dict.
pub type Params = serde_json::Map<String, serde_json::Value>;

/// A `model_fn(features, labels, mode, params)`, as TensorFlow's, with one more argument:
/// the [`Variables`] through which it builds and applies its network. Any closure of that
/// shape is one.
pub trait ModelFn: Send + Sync {
    /// The spec for one batch: `labels` is `None` in `Predict`.
    ///
    /// # Errors
    ///
    /// Whatever stops the model: a shape mismatch, a failed layer.
    fn call(
        &self,
        features: &Tensor,
        labels: Option<&[usize]>,
        mode: ModeKeys,
        params: &Params,
        variables: &mut Variables<'_>,
    ) -> Result<EstimatorSpec, TrainError>;
}

impl<F> ModelFn for F
where
    F: Fn(
            &Tensor,
            Option<&[usize]>,
            ModeKeys,
            &Params,
            &mut Variables<'_>,
        ) -> Result<EstimatorSpec, TrainError>
        + Send
        + Sync,
{
    fn call(
        &self,
        features: &Tensor,
        labels: Option<&[usize]>,
        mode: ModeKeys,
        params: &Params,
        variables: &mut Variables<'_>,
    ) -> Result<EstimatorSpec, TrainError> {
        self(features, labels, mode, params, variables)
    }
}

/// `tf.estimator.Estimator`: a `model_fn` trained, evaluated and used for prediction under
/// the [`RunConfig`]'s strategy, with a persistent `global_step` and checkpoints in
/// `model_dir` (the chief writes them; a new `train` resumes from the newest).
///
/// ```
/// use lockstep_data::{Dataset, mnist::{Mnist, scale}};
/// use lockstep_nn::{Reduction, Sgd, SparseCategoricalCrossentropy, models};
/// use lockstep_train::{Estimator, EstimatorSpec, ModeKeys, RunConfig};
///
/// let model_fn = |features: &lockstep_tensor::Tensor, labels: Option<&[usize]>, mode, _params: &_, vars: &mut lockstep_train::Variables<'_>| {
///     let logits = vars.apply(|| models::mnist_mlp(1), features)?;
///     if mode == ModeKeys::Predict {
///         return Ok(EstimatorSpec::predict(logits));
///     }
///     let loss_fn = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::Sum };
///     let loss = lockstep_tensor::ops::scale(&loss_fn.call(&logits, labels.unwrap_or_default())?, 1.0 / 32.0)?;
///     Ok(match mode {
///         ModeKeys::Train => EstimatorSpec::train(loss, Sgd::new(0.1)),
///         _ => EstimatorSpec::eval(loss),
///     })
/// };
/// let dir = tempfile::tempdir()?;
/// let mut estimator = Estimator::new(model_fn, RunConfig::new(dir.path()));
/// let mnist = Mnist::embedded()?;
/// let input_fn = |_mode, _ctx: &_| {
///     Ok(mnist.train.dataset()?.take(320)
///         .map(|(x, y)| (scale(&x).into_iter().collect::<ndarray::Array1<f32>>(), y))
///         .batch(32, false))
/// };
/// assert_eq!(estimator.train(input_fn, None, Some(10))?, 10);
/// let metrics = estimator.evaluate(input_fn, Some(5))?;
/// assert_eq!(metrics.get("global_step"), Some(10.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Estimator {
    model_fn: Box<dyn ModelFn>,
    config: RunConfig,
    model_dir: PathBuf,
    params: Params,
    /// The strategy until the model is built from the first batch.
    strategy: Option<Box<dyn Strategy>>,
    context: InputContext,
    model: Option<Model>,
    global_step: u64,
}

impl Estimator {
    /// An estimator of `model_fn` run as `config` says.
    pub fn new(model_fn: impl ModelFn + 'static, mut config: RunConfig) -> Self {
        let strategy = config
            .train_distribute
            .take()
            .unwrap_or_else(|| Box::new(OneDeviceStrategy::new()));
        let model_dir = config.model_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("lockstep-estimator-{}", std::process::id()))
        });
        Self {
            model_fn: Box::new(model_fn),
            context: strategy.input_context(),
            strategy: Some(strategy),
            config,
            model_dir,
            params: Params::new(),
            model: None,
            global_step: 0,
        }
    }

    /// Hands `params` to every `model_fn` call.
    #[must_use]
    pub fn params(mut self, params: Params) -> Self {
        self.params = params;
        self
    }

    /// Where checkpoints and event files go.
    pub fn model_dir(&self) -> &Path {
        &self.model_dir
    }

    /// The run's settings.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Steps trained so far (after `train`; restored from `model_dir` when it starts).
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// The directory of the newest intact checkpoint in `model_dir`, if any.
    ///
    /// # Errors
    ///
    /// When `model_dir` cannot be read.
    pub fn latest_checkpoint(&self) -> Result<Option<PathBuf>, TrainError> {
        if !self.model_dir.is_dir() {
            return Ok(None);
        }
        let manager = CheckpointManager::new(&self.model_dir, None)?;
        Ok(manager
            .latest()?
            .map(|c| self.model_dir.join(format!("ckpt-{}", c.progress.step))))
    }

    /// Trains on `input_fn(ModeKeys::Train, &input_context)` (one batch of this worker per
    /// element) for `steps` more steps, or until the global step reaches `max_steps`, or
    /// until the input ends on every worker; resumes first from the newest checkpoint in
    /// `model_dir`; saves one at the end. Returns the global step.
    ///
    /// Every replica's gradients of its own loss are summed over all replicas before the
    /// update, as `tf.distribute` does for Estimators: a `model_fn` scales its loss by the
    /// global batch size itself. The logged loss is the sum over replicas likewise.
    ///
    /// # Errors
    ///
    /// When both or neither-positive `steps` and `max_steps` are given, the `model_fn` returns
    /// no loss or `train_op`, the input fails, or a checkpoint cannot be read or written.
    pub fn train<F, D, B>(
        &mut self,
        input_fn: F,
        steps: Option<u64>,
        max_steps: Option<u64>,
    ) -> Result<u64, TrainError>
    where
        F: Fn(ModeKeys, &InputContext) -> Result<D, TrainError>,
        D: Dataset<Item = B>,
        B: LabeledBatch,
    {
        if steps.is_some() && max_steps.is_some() {
            return Err(TrainError::invalid(
                "Estimator::train",
                "give steps or max_steps, not both",
            ));
        }
        if steps == Some(0) || max_steps == Some(0) {
            return Err(TrainError::invalid(
                "Estimator::train",
                "steps and max_steps must be positive",
            ));
        }
        let data = input_fn(ModeKeys::Train, &self.context)?;
        let mut batches = data.iter()?;
        let replicas = self.local_replicas();
        let first = next_batches(&mut batches, replicas)?;
        self.build(first.as_deref(), ModeKeys::Train)?;
        self.take_optimizers(first.as_deref())?;
        self.resume()?;
        let target = match (steps, max_steps) {
            (Some(steps), _) => self.global_step.saturating_add(steps),
            (None, Some(max_steps)) => max_steps,
            (None, None) => u64::MAX,
        };
        if self.global_step >= target {
            tracing::info!(
                global_step = self.global_step,
                "skipping training: the global step has reached max_steps already"
            );
            return Ok(self.global_step);
        }
        if self.is_chief() {
            finished_marker::clear(&self.model_dir)?;
        }
        let mut pending = first;
        let kill_switch = KillSwitch::from_env()?;
        let mut loop_state = TrainLoop::new(&self.config, self.global_step, self.is_chief());
        let mut saved_at = self.global_step;
        while self.global_step < target {
            let inputs = match pending.take() {
                Some(inputs) => Some(inputs),
                None => next_batches(&mut batches, replicas)?,
            };
            let inputs = inputs.unwrap_or_else(|| (0..replicas).map(|_| None).collect::<Vec<_>>());
            let save_for_time = loop_state.checkpoint_due_by_time();
            let step = self.global_step;
            let seed = self.config.random_seed.unwrap_or(0);
            let (model_fn, params) = (&*self.model_fn, &self.params);
            let model = self.model.as_mut().ok_or_else(not_built)?;
            let chief = model.is_chief();
            let totals =
                crate::replica::on_replicas(&mut model.replicas, inputs, |replica, batch| {
                    let flag = chief && replica.link.replica_id() == 0 && save_for_time;
                    train_step(replica, batch, model_fn, params, step, seed, flag)
                })?;
            if totals.examples == 0.0 {
                tracing::info!(
                    global_step = self.global_step,
                    "the input ended on every worker"
                );
                break;
            }
            self.global_step += 1;
            loop_state.after_step(self.global_step, totals.loss_sum, &self.model_dir)?;
            let due_by_steps = self
                .config
                .save_checkpoints_steps
                .is_some_and(|n| n > 0 && self.global_step.is_multiple_of(n));
            if due_by_steps || totals.save_requested {
                self.save(kill_switch)?;
                saved_at = self.global_step;
                loop_state.saved();
            }
            kill_switch.after_step(self.global_step);
        }
        if saved_at != self.global_step {
            self.save(kill_switch)?;
        }
        if self.is_chief() {
            // An evaluator waiting for max_steps learns that training ended here.
            finished_marker::write(&self.model_dir, self.global_step)?;
        }
        loop_state.finish()?;
        Ok(self.global_step)
    }

    /// Evaluates the newest checkpoint in `model_dir` on `input_fn(ModeKeys::Eval, …)` for
    /// `steps` batches (all when `None`): `loss` (the mean of the batches' losses, as
    /// TensorFlow's `tf.metrics.mean(loss)`), each `eval_metric_ops` result, and
    /// `global_step`. Evaluates on this process alone, or across the training group when
    /// `RunConfig::eval_distribute` is set (then every worker calls it).
    ///
    /// # Errors
    ///
    /// When `model_dir` holds no checkpoint, the `model_fn` returns no loss, or the input
    /// fails.
    pub fn evaluate<F, D, B>(&mut self, input_fn: F, steps: Option<u64>) -> Result<Logs, TrainError>
    where
        F: Fn(ModeKeys, &InputContext) -> Result<D, TrainError>,
        D: Dataset<Item = B>,
        B: LabeledBatch,
    {
        let checkpoint = self.newest_checkpoint()?;
        self.evaluate_checkpoint(&input_fn, steps, &checkpoint)
    }

    /// Evaluates the weights of `checkpoint`, as [`evaluate`](Self::evaluate).
    pub(crate) fn evaluate_checkpoint<F, D, B>(
        &mut self,
        input_fn: &F,
        steps: Option<u64>,
        checkpoint: &Checkpoint,
    ) -> Result<Logs, TrainError>
    where
        F: Fn(ModeKeys, &InputContext) -> Result<D, TrainError>,
        D: Dataset<Item = B>,
        B: LabeledBatch,
    {
        let distributed = self.config.eval_distribute;
        let context = if distributed {
            self.context
        } else {
            InputContext::local(1)?
        };
        let data = input_fn(ModeKeys::Eval, &context)?;
        let mut batches = data.iter()?;
        let replicas = if distributed {
            self.local_replicas()
        } else {
            1
        };
        let mut inputs: Vec<Vec<(Tensor, Vec<usize>)>> =
            (0..replicas).map(|_| Vec::new()).collect();
        let mut taken = 0_u64;
        while steps.is_none_or(|s| taken < s) {
            let Some(step) = next_batches(&mut batches, replicas)? else {
                break;
            };
            for (slot, batch) in inputs.iter_mut().zip(step) {
                slot.extend(batch);
            }
            taken += 1;
        }
        let first: Vec<ReplicaBatch> = inputs.iter().map(|b| b.first().cloned()).collect();
        self.build(Some(&first), ModeKeys::Eval)?;
        let model = self.model.as_mut().ok_or_else(not_built)?;
        let position = restore_weights(model, checkpoint)?;
        let (model_fn, params) = (&*self.model_fn, &self.params);
        let seed = self.config.random_seed.unwrap_or(0);
        let totals: EvalTotals = if distributed {
            crate::replica::on_replicas(&mut model.replicas, inputs, |replica, batches| {
                let mut totals = evaluate_batches(replica, &batches, model_fn, params, seed)?;
                totals.all_reduce(replica)?;
                Ok(totals)
            })?
        } else {
            let replica = model.replicas.first_mut().ok_or_else(not_built)?;
            let batches = inputs.into_iter().next().unwrap_or_default();
            evaluate_batches(replica, &batches, model_fn, params, seed)?
        };
        // The weights of training come back: evaluating a checkpoint must not change them.
        self.reload_training_state()?;
        let mut logs = totals.logs()?;
        logs.0.insert("global_step".into(), position.step as f64);
        Ok(logs)
    }

    /// The predictions of the newest checkpoint for each batch of `input_fn(ModeKeys::Predict,
    /// …)`, in order, on this process, in host memory.
    ///
    /// # Errors
    ///
    /// When `model_dir` holds no checkpoint, the `model_fn` returns no predictions, or the
    /// input fails.
    pub fn predict<F, D, B>(&mut self, input_fn: F) -> Result<Vec<Tensor>, TrainError>
    where
        F: Fn(ModeKeys, &InputContext) -> Result<D, TrainError>,
        D: Dataset<Item = B>,
        B: LabeledBatch,
    {
        let checkpoint = self.newest_checkpoint()?;
        let data = input_fn(ModeKeys::Predict, &InputContext::local(1)?)?;
        let mut batches = data.iter()?;
        let mut outputs = Vec::new();
        let mut restored = false;
        while let Some(step) = next_batches(&mut batches, 1)? {
            let Some((x, _)) = step.into_iter().next().flatten() else {
                continue;
            };
            if !restored {
                self.build(Some(&[Some((x.clone(), Vec::new()))]), ModeKeys::Predict)?;
                restore_weights(self.model.as_mut().ok_or_else(not_built)?, &checkpoint)?;
                restored = true;
            }
            let model = self.model.as_ref().ok_or_else(not_built)?;
            let replica = model.replicas.first().ok_or_else(not_built)?;
            let mut variables = Variables::of(
                &replica.net,
                ForwardContext::default(),
                false,
                self.config.random_seed.unwrap_or(0),
            );
            let spec =
                self.model_fn
                    .call(&x, None, ModeKeys::Predict, &self.params, &mut variables)?;
            let predictions = spec.predictions.ok_or_else(|| {
                TrainError::invalid(
                    "model_fn",
                    "it returned no predictions in PREDICT mode (EstimatorSpec::predict)",
                )
            })?;
            // A replica on a GPU predicts there; the values come back to host memory, as
            // TensorFlow's Estimator yields NumPy arrays.
            outputs.push(predictions.to_device(lockstep_tensor::Device::Cpu)?);
        }
        Ok(outputs)
    }

    fn is_chief(&self) -> bool {
        self.model.as_ref().map_or_else(
            || self.strategy.as_ref().is_some_and(Strategy::is_chief),
            Model::is_chief,
        )
    }

    fn local_replicas(&self) -> usize {
        self.context.local_replicas().max(1)
    }

    /// Builds the model from each local replica's first batch (the `model_fn` creates the
    /// network on its first call), once; every replica then holds the chief's variables.
    fn build(&mut self, first: Option<&[ReplicaBatch]>, mode: ModeKeys) -> Result<(), TrainError> {
        if self.model.is_some() {
            return Ok(());
        }
        let mut strategy = self.strategy.take().ok_or_else(not_built)?;
        let links = strategy.take_replicas()?;
        let seed = self.config.random_seed.unwrap_or(0);
        let mut nets = Vec::with_capacity(links.len());
        for (index, link) in links.iter().enumerate() {
            let Some((x, labels)) = first.and_then(|f| f.get(index)).and_then(Option::as_ref)
            else {
                return Err(TrainError::invalid(
                    "input_fn",
                    format!(
                        "it gave replica {index} of this worker no batch in {mode} mode: the model is built from the first batch"
                    ),
                ));
            };
            let mut context = ForwardContext::inference();
            context.step = 0;
            context.replica = link.replica_id();
            let mut variables = Variables::to_build(context, seed);
            let labels = (mode != ModeKeys::Predict).then_some(labels.as_slice());
            self.model_fn
                .call(x, labels, mode, &self.params, &mut variables)?;
            nets.push(variables.into_built().ok_or_else(|| {
                TrainError::invalid("model_fn", "it never built its network (Variables::apply)")
            })?);
        }
        self.model = Some(Model::assemble(&*strategy, links, nets)?);
        Ok(())
    }

    /// Gives every replica the optimizer of its `model_fn`'s training spec, once.
    fn take_optimizers(&mut self, first: Option<&[ReplicaBatch]>) -> Result<(), TrainError> {
        let seed = self.config.random_seed.unwrap_or(0);
        let step = self.global_step;
        let model = self.model.as_mut().ok_or_else(not_built)?;
        for (index, replica) in model.replicas.iter_mut().enumerate() {
            if replica.optimizer.is_some() {
                continue;
            }
            let Some((x, labels)) = first.and_then(|f| f.get(index)).and_then(Option::as_ref)
            else {
                return Err(TrainError::invalid(
                    "input_fn",
                    format!("it gave replica {index} of this worker no batch to train on"),
                ));
            };
            let mut context = ForwardContext::inference();
            context.step = step;
            context.replica = replica.link.replica_id();
            let mut variables = Variables::of(&replica.net, context, false, seed);
            let spec = self.model_fn.call(
                x,
                Some(labels),
                ModeKeys::Train,
                &self.params,
                &mut variables,
            )?;
            steps::check_train_spec(&spec)?;
            replica.optimizer = spec.train_op;
        }
        Ok(())
    }

    /// Restores the newest checkpoint on the chief and gives every worker the chief's state.
    fn resume(&mut self) -> Result<(), TrainError> {
        let chief = self.is_chief();
        let checkpoint = if chief && self.model_dir.is_dir() {
            CheckpointManager::new(&self.model_dir, None)?.latest()?
        } else {
            None
        };
        let workers = self.context.num_input_pipelines.max(1);
        let model = self.model.as_mut().ok_or_else(not_built)?;
        let position = match &checkpoint {
            Some(checkpoint) => {
                let position = restore_into(model, checkpoint)?;
                tracing::info!(
                    global_step = position.step,
                    dir = %self.model_dir.display(),
                    "restored the newest checkpoint"
                );
                position
            }
            None => Position {
                step: self.global_step,
                ..Position::default()
            },
        };
        let mut context = TrainingContext {
            model,
            position,
            stop: false,
            workers,
            callbacks: Vec::new(),
            straggler: None,
        };
        context.sync_from_chief()?;
        self.global_step = context.position.step;
        Ok(())
    }

    /// After an evaluation replaced the weights: the newest checkpoint's full state again
    /// (training always ends with one), on this process only.
    fn reload_training_state(&mut self) -> Result<(), TrainError> {
        let Some(model) = self.model.as_mut() else {
            return Ok(());
        };
        if model.optimizer().is_none() || !self.model_dir.is_dir() {
            return Ok(());
        }
        if let Some(checkpoint) = CheckpointManager::new(&self.model_dir, None)?.latest()? {
            self.global_step = restore_into(model, &checkpoint)?.step;
        }
        Ok(())
    }

    /// The chief saves a checkpoint at the global step; every worker learns whether it could.
    /// Saves a checkpoint of the global step on the chief; `kill_switch` may kill the process
    /// once its files are written and before it is published (`LOCKSTEP_KILL_IN_SAVE`).
    fn save(&mut self, kill_switch: KillSwitch) -> Result<(), TrainError> {
        let workers = self.context.num_input_pipelines.max(1);
        let keep = self.config.keep_checkpoint_max;
        let dir = self.model_dir.clone();
        let model = self.model.as_mut().ok_or_else(not_built)?;
        let mut context = TrainingContext {
            model,
            position: Position {
                step: self.global_step,
                ..Position::default()
            },
            stop: false,
            workers,
            callbacks: Vec::new(),
            straggler: None,
        };
        context.chief_writes("Estimator", "a checkpoint", |context| {
            let manager = CheckpointManager::new(&dir, (keep > 0).then_some(keep))?;
            let step = context.step();
            let path =
                manager.save_with_hook(&context.checkpoint()?, || kill_switch.in_save(step))?;
            tracing::info!(global_step = context.step(), path = %path.display(), "saved a checkpoint");
            Ok(())
        })
    }

    fn newest_checkpoint(&self) -> Result<Checkpoint, TrainError> {
        let not_found = || {
            TrainError::Checkpoint(CheckpointError::NotFound {
                dir: self.model_dir.clone(),
            })
        };
        if !self.model_dir.is_dir() {
            return Err(not_found());
        }
        CheckpointManager::new(&self.model_dir, None)?
            .latest()?
            .ok_or_else(not_found)
    }
}

fn not_built() -> TrainError {
    TrainError::invalid("Estimator", "its model is not built")
}

/// This worker's next batch split among its `replicas` local replicas; `None` at the end of
/// the input.
fn next_batches<S, B>(
    batches: &mut Iter<S>,
    replicas: usize,
) -> Result<Option<Vec<ReplicaBatch>>, TrainError>
where
    S: ElementStream<Item = B>,
    B: LabeledBatch,
{
    let Some(batch) = batches.next() else {
        return Ok(None);
    };
    let parts = batch?.into_parts()?;
    let labels = parts.targets.into_class_ids()?;
    Ok(Some(split_batch(parts.inputs, labels, replicas)?))
}

/// Logging, summaries and the time-based checkpoint clock of one `train` call.
struct TrainLoop {
    chief: bool,
    log_every: u64,
    summary_every: u64,
    checkpoint_secs: Option<u64>,
    last_save: Instant,
    last_log: (Instant, u64),
    writer: Option<EventWriter>,
}

impl TrainLoop {
    fn new(config: &RunConfig, global_step: u64, chief: bool) -> Self {
        Self {
            chief,
            log_every: config.log_step_count_steps,
            summary_every: config.save_summary_steps,
            checkpoint_secs: config.checkpoint_secs(),
            last_save: Instant::now(),
            last_log: (Instant::now(), global_step),
            writer: None,
        }
    }

    fn checkpoint_due_by_time(&self) -> bool {
        self.checkpoint_secs
            .is_some_and(|secs| self.last_save.elapsed().as_secs() >= secs)
    }

    fn saved(&mut self) {
        self.last_save = Instant::now();
    }

    fn after_step(
        &mut self,
        global_step: u64,
        loss: f64,
        model_dir: &Path,
    ) -> Result<(), TrainError> {
        if !self.chief {
            return Ok(());
        }
        let mut scalars = Vec::new();
        // TensorFlow's summary hook also writes at the first step.
        if self.summary_every > 0
            && (global_step == 1 || global_step.is_multiple_of(self.summary_every))
        {
            scalars.push(("loss".to_owned(), loss));
        }
        if self.log_every > 0 && (global_step == 1 || global_step.is_multiple_of(self.log_every)) {
            let (since, from) = self.last_log;
            let rate = (global_step - from) as f64 / since.elapsed().as_secs_f64().max(1e-9);
            tracing::info!(global_step, loss, "loss = {loss:.6}, step = {global_step}");
            if global_step != 1 {
                tracing::info!(global_step, "global_step/sec: {rate:.4}");
                scalars.push(("global_step/sec".to_owned(), rate));
            }
            self.last_log = (Instant::now(), global_step);
        }
        if !scalars.is_empty() {
            if self.writer.is_none() {
                self.writer = Some(EventWriter::create(model_dir)?);
            }
            if let Some(writer) = &mut self.writer {
                writer.scalars(global_step, &scalars)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TrainError> {
        match &mut self.writer {
            Some(writer) => writer.flush(),
            None => Ok(()),
        }
    }
}
