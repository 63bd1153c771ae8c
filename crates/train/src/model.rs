//! `Model`: a network (`Sequential` or functional) replicated under a strategy, Keras-style.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lockstep_checkpoint::{
    CheckpointError, CheckpointManager, NamedTensor, Progress, read_tensors,
    write_tensors_with_metadata,
};
use lockstep_collective::ReduceOp;
use lockstep_data::{AutoShardPolicy, Batchable, Dataset, InputContext, distribute};
use std::sync::Arc;

use lockstep_nn::{
    Loss, METRIC_NAMES, Network, NnError, Optimizer, ParamSpec, PredictionMetric,
    SparseCategoricalCrossentropy, metric_by_name,
};
use lockstep_tensor::{Device, Tensor};

use crate::batch::LabeledBatch;
use crate::error::TrainError;
use crate::history::Logs;
use crate::replica::{Objective, Placement, Replica, StepTotals, not_compiled, on_replicas};
use crate::state::{Position, checkpoint_of, meta_of, restore_into};
use crate::steps_ahead::StepsAhead;
use crate::strategy::{ReplicaLink, Strategy};

/// The metadata key of a weights file that holds the optimizer's step count.
pub(crate) const ITERATIONS: &str = "iterations";

/// What `compile` set: the loss, shared by the replicas, and the metrics (each replica
/// measures a fresh copy of each per batch; the states meet in the step's all-reduce).
pub(crate) struct Compiled {
    pub(crate) loss: Arc<dyn Loss>,
    pub(crate) metrics: Vec<Box<dyn PredictionMetric>>,
}

impl Clone for Compiled {
    fn clone(&self) -> Self {
        Self {
            loss: Arc::clone(&self.loss),
            metrics: self.metrics.iter().map(|m| m.fresh()).collect(),
        }
    }
}

impl Compiled {
    pub(crate) fn objective(&self) -> Objective<'_> {
        Objective {
            loss: self.loss.as_ref(),
            metrics: &self.metrics,
            more_data: false,
        }
    }

    /// The metrics' names, in the order they were given.
    pub(crate) fn metric_names(&self) -> Vec<String> {
        self.metrics.iter().map(|m| m.name().to_owned()).collect()
    }
}

/// The metrics of `names` ([`metric_by_name`]).
/// Writes `net`'s variables to `path` as one safetensors file whose metadata records
/// `iterations` (the step they are of): what [`Model::save_weights`] writes and a
/// `SidecarEvaluator` reads.
pub(crate) fn write_weights(
    net: &Network,
    iterations: u64,
    path: &std::path::Path,
) -> Result<(), TrainError> {
    let params = net.parameters();
    let tensors = params
        .specs()
        .iter()
        .map(|spec| {
            NamedTensor::new(
                spec.name.clone(),
                spec.shape.clone(),
                params.values()[spec.range()].to_vec(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = BTreeMap::from([(ITERATIONS.to_owned(), iterations.to_string())]);
    Ok(write_tensors_with_metadata(path, &tensors, &metadata)?)
}

pub(crate) fn metrics_named(names: &[&str]) -> Result<Vec<Box<dyn PredictionMetric>>, TrainError> {
    names
        .iter()
        .map(|name| {
            metric_by_name(name).ok_or_else(|| {
                TrainError::invalid(
                    "compile",
                    format!(
                        "unknown metric {name:?}; known: {}",
                        METRIC_NAMES.join(", ")
                    ),
                )
            })
        })
        .collect()
}

/// A model replicated under a [`Strategy`], as a Keras model built in `strategy.scope()`.
///
/// Every replica holds its own copy of the variables and of the optimizer state; at each
/// step their gradients are all-reduced in one flat buffer and every replica applies the same
/// update, so the copies stay bit-identical.
///
/// ```
/// use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
/// use lockstep_train::{Model, MirroredStrategy};
///
/// let mut model = Model::new(MirroredStrategy::new(2)?, || models::mnist_mlp(7))?;
/// model.compile(Adam::default(), SparseCategoricalCrossentropy { from_logits: true, ..Default::default() }, &["accuracy"])?;
/// assert_eq!(model.num_replicas_in_sync(), 2);
/// # Ok::<(), lockstep_train::TrainError>(())
/// ```
pub struct Model {
    pub(crate) replicas: Vec<Replica>,
    pub(crate) compiled: Option<Compiled>,
    pub(crate) chief: bool,
    pub(crate) task: String,
    context: InputContext,
    /// Steps run by [`Model::run`] (a custom loop's), for dropout's seeds.
    pub(crate) steps_run: u64,
    /// Every replica's error-feedback residuals, one after another: gathered for a backup,
    /// or read from one on the chief until `fit` hands them out ([`crate::state`]).
    pub(crate) residual_sets: Option<ResidualSets>,
}

/// Every replica's error-feedback residuals, in replica order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResidualSets {
    /// The replicas they are of.
    pub(crate) replicas: usize,
    /// `replicas` runs of the gradient buffer's length.
    pub(crate) values: Vec<f32>,
}

impl Model {
    /// Builds the network once per replica of this process with `build` (which must give the
    /// same architecture each time: a [`Sequential`](lockstep_nn::Sequential) model or a
    /// functional [`Network`]), then gives every replica the variables of replica 0 of the
    /// chief, as TensorFlow does when a model is created under a strategy.
    ///
    /// # Errors
    ///
    /// When `build` fails, builds different architectures, or the broadcast fails.
    pub fn new<N: Into<Network>>(
        mut strategy: impl Strategy,
        build: impl Fn() -> Result<N, NnError>,
    ) -> Result<Self, TrainError> {
        let links = strategy.take_replicas()?;
        let nets = links
            .iter()
            .map(|_| build().map(Into::into))
            .collect::<Result<Vec<Network>, _>>()?;
        Self::assemble(&strategy, links, nets)
    }

    /// A model of networks built already, one per replica link of `strategy`: checks that
    /// they agree in architecture, then gives every replica the chief's first replica's
    /// variables.
    pub(crate) fn assemble(
        strategy: &dyn Strategy,
        links: Vec<ReplicaLink>,
        nets: Vec<Network>,
    ) -> Result<Self, TrainError> {
        if links.is_empty() {
            return Err(TrainError::invalid(
                "strategy",
                "it gave the model no replicas",
            ));
        }
        if nets.len() != links.len() {
            return Err(TrainError::invalid(
                "Model",
                format!("{} networks for {} replicas", nets.len(), links.len()),
            ));
        }
        if let Some(first) = nets.first()
            && nets
                .iter()
                .any(|net| net.parameters().specs() != first.parameters().specs())
        {
            return Err(TrainError::invalid(
                "Model::new",
                "the build function made different architectures for two replicas",
            ));
        }
        // Each replica's network on its device: the passes run there, the variables and the
        // optimizer's state stay in host memory between steps.
        let replicas = links
            .into_iter()
            .zip(nets)
            .map(|(link, net)| {
                let net = match link.device() {
                    lockstep_tensor::Device::Cpu => net,
                    device => net.to_device(device).map_err(|(_, e)| e)?,
                };
                Ok(Replica::new(link, net))
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        let mut model = Self {
            replicas,
            compiled: None,
            chief: strategy.is_chief(),
            task: strategy.task(),
            context: strategy.input_context(),
            steps_run: 0,
            residual_sets: None,
        };
        model.agree_on_architecture()?;
        let inputs = vec![(); model.replicas.len()];
        on_replicas(&mut model.replicas, inputs, |replica, ()| {
            Ok(replica
                .link
                .broadcast(replica.net.parameters_mut().values_mut())?)
        })?;
        Ok(model)
    }

    /// Fails on every worker at once when some worker built another model (other variables,
    /// or other shapes with the same number of values, which the broadcast alone would not
    /// notice): the maximum and minimum of all replicas' fingerprints of their variables must
    /// be equal. The same all-reduce tells every replica where the group's replicas sit
    /// ([`Placement`]), so that what some devices cannot do is decided alike by all.
    fn agree_on_architecture(&mut self) -> Result<(), TrainError> {
        let on_gpu = self
            .replicas
            .iter()
            .map(|r| r.net.device() != Device::Cpu)
            .collect();
        self.agree_on_architecture_and_placement(on_gpu)
    }

    /// [`Model::agree_on_architecture`] with each local replica's side, `on_gpu`, given.
    pub(crate) fn agree_on_architecture_and_placement(
        &mut self,
        on_gpu: Vec<bool>,
    ) -> Result<(), TrainError> {
        let specs = self.network().parameters().specs().to_vec();
        let mine = architecture_fingerprint(&specs);
        let extremes = on_replicas(&mut self.replicas, on_gpu, |r, on_gpu| {
            let gpu = f64::from(u8::from(on_gpu));
            let mut extremes = [mine, -mine, gpu, -gpu];
            r.link.all_reduce(&mut extremes, ReduceOp::Max)?;
            Ok(extremes)
        })?;
        let (max, min) = (extremes[0], -extremes[1]);
        let placement = Placement::of(extremes[2] == 1.0, -extremes[3] == 1.0);
        for replica in &mut self.replicas {
            replica.placement = placement;
        }
        if max == min {
            return Ok(());
        }
        let values: usize = specs.iter().map(ParamSpec::len).sum();
        Err(TrainError::invalid(
            "Model::new",
            format!(
                "the workers built different models: this worker's has {} variables of {values} values in all (fingerprint {mine}), another worker's fingerprint is {}; every worker must build the same model",
                specs.len(),
                if mine == max { min } else { max },
            ),
        ))
    }

    /// Sets the optimizer (each replica gets a copy), the loss (any [`Loss`]: Keras' with
    /// their names, or a user's), and the metrics by Keras name ([`METRIC_NAMES`]; each is
    /// logged under its name, `accuracy` as `accuracy`).
    ///
    /// Under any strategy the loss is computed as `tf.distribute` prescribes: each replica sums
    /// its examples' losses (times their sample weights) and the total is divided by the
    /// number of examples in the global step, whatever `loss.reduction()` says.
    ///
    /// # Errors
    ///
    /// When a metric name is unknown.
    pub fn compile<O, L>(
        &mut self,
        optimizer: O,
        loss: L,
        metrics: &[&str],
    ) -> Result<(), TrainError>
    where
        O: Optimizer + Clone + 'static,
        L: Loss + 'static,
    {
        let mut copies: Vec<Box<dyn Optimizer>> = Vec::with_capacity(self.replicas.len());
        while copies.len() + 1 < self.replicas.len() {
            copies.push(Box::new(optimizer.clone()));
        }
        copies.push(Box::new(optimizer));
        self.compile_with(copies, Arc::new(loss), metrics)
    }

    /// `compile` with one optimizer per replica, made already.
    fn compile_with(
        &mut self,
        optimizers: Vec<Box<dyn Optimizer>>,
        loss: Arc<dyn Loss>,
        metrics: &[&str],
    ) -> Result<(), TrainError> {
        let metrics = metrics_named(metrics)?;
        self.leave_devices()?;
        for (replica, optimizer) in self.replicas.iter_mut().zip(optimizers) {
            replica.set_optimizer(optimizer);
        }
        self.compiled = Some(Compiled { loss, metrics });
        Ok(())
    }

    /// Saves the whole model (architecture, weights, optimizer settings and state, compile
    /// settings) as one more checkpoint `ckpt-<step>` in `dir`, atomically, as Keras'
    /// `model.save`; returns its directory. [`Model::load`] reads it back.
    ///
    /// # Errors
    ///
    /// When the model is not compiled or `dir` cannot be written.
    pub fn save(&self, dir: impl Into<PathBuf>) -> Result<PathBuf, TrainError> {
        let step = self.optimizer().map_or(0, Optimizer::iterations);
        let workers = self.num_replicas_in_sync() / self.replicas.len().max(1);
        let checkpoint = checkpoint_of(
            self,
            Position {
                step,
                ..Position::default()
            },
            workers,
            &[],
        )?;
        Ok(CheckpointManager::new(dir, None)?.save(&checkpoint)?)
    }

    /// The newest intact model saved in `dir` ([`Model::save`], or a backup of
    /// [`BackupAndRestore`](crate::BackupAndRestore)), rebuilt under `strategy` and compiled
    /// as it was, with its weights and optimizer state, as `keras.models.load_model`. Every
    /// worker loads the same files.
    ///
    /// ```
    /// use lockstep_checkpoint::CheckpointError;
    /// use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
    /// use lockstep_train::{Model, OneDeviceStrategy, TrainError};
    ///
    /// let dir = tempfile::tempdir()?;
    /// // The Keras guide's make_or_restore_model():
    /// let model = match Model::load(OneDeviceStrategy::new(), dir.path()) {
    ///     Ok(model) => model,
    ///     Err(TrainError::Checkpoint(CheckpointError::NotFound { .. })) => {
    ///         let mut model = Model::new(OneDeviceStrategy::new(), || models::mnist_mlp(1))?;
    ///         model.compile(Adam::default(), SparseCategoricalCrossentropy { from_logits: true, ..Default::default() }, &["accuracy"])?;
    ///         model
    ///     }
    ///     Err(e) => return Err(e.into()),
    /// };
    /// model.save(dir.path())?;
    /// let loaded = Model::load(OneDeviceStrategy::new(), dir.path())?;
    /// assert_eq!(loaded.network().parameters(), model.network().parameters());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `dir` is a directory [`Model::save`] wrote into, or a directory of such directories
    /// (the `ckpt-{epoch}` a [`ModelCheckpoint`](crate::ModelCheckpoint) writes, as in the
    /// Keras guide), of which the newest (by the number in its name) is loaded.
    ///
    /// [`CheckpointError::NotFound`](lockstep_checkpoint::CheckpointError::NotFound) when
    /// `dir` holds no intact model (or does not exist); others when the files cannot be read
    /// or the strategy cannot host the model.
    pub fn load(strategy: impl Strategy, dir: impl AsRef<Path>) -> Result<Self, TrainError> {
        let dir = dir.as_ref();
        let not_found = || {
            TrainError::Checkpoint(CheckpointError::NotFound {
                dir: dir.to_path_buf(),
            })
        };
        if !dir.is_dir() {
            return Err(not_found());
        }
        let checkpoint = CheckpointManager::new(newest_model_dir(dir), None)?
            .latest()?
            .ok_or_else(not_found)?;
        let meta = meta_of(&checkpoint)?;
        let mut model = Self::new(strategy, || Network::from_config(&meta.architecture, 0))?;
        let optimizers = model
            .replicas
            .iter()
            .map(|_| meta.optimizer_config.build())
            .collect();
        let metrics: Vec<&str> = meta.metrics.iter().map(String::as_str).collect();
        let loss: Arc<dyn Loss> = match meta.loss {
            Some(config) => Arc::from(config.build()),
            // Saved before losses were recorded: the sparse cross-entropy was the only one.
            None if meta.loss_name.is_none() => Arc::new(SparseCategoricalCrossentropy {
                from_logits: meta.from_logits,
                ..SparseCategoricalCrossentropy::default()
            }),
            None => {
                return Err(TrainError::invalid(
                    "Model::load",
                    format!(
                        "the model was compiled with the loss {:?}, which has no saved configuration (a user's loss); build the model with Model::new, restore its weights and compile it again",
                        meta.loss_name.unwrap_or_default()
                    ),
                ));
            }
        };
        model.compile_with(optimizers, loss, &metrics)?;
        restore_into(&mut model, &checkpoint)?;
        Ok(model)
    }

    /// Copies the newer values of replicas training on a GPU (their device state's) into
    /// their host networks and optimizers: what anything reading the model in the middle of
    /// `fit` needs first (`fit` does it at each epoch's end and when it returns).
    pub(crate) fn sync_host(&mut self) -> Result<(), TrainError> {
        self.replicas.iter_mut().try_for_each(Replica::sync_host)
    }

    /// [`Model::sync_host`], then makes the host values the only ones: before they change.
    pub(crate) fn leave_devices(&mut self) -> Result<(), TrainError> {
        self.replicas.iter_mut().try_for_each(Replica::leave_device)
    }

    /// Replicas across all processes.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.context.num_replicas_in_sync
    }

    /// This process's part of the input.
    pub fn input_context(&self) -> InputContext {
        self.context
    }

    /// Whether this process writes checkpoints and logs.
    pub fn is_chief(&self) -> bool {
        self.chief
    }

    /// This process's task, as `worker:0`.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The network (replica 0's copy; all copies are equal).
    ///
    /// # Panics
    ///
    /// Never: a model has at least one replica.
    pub fn network(&self) -> &Network {
        #[allow(
            clippy::indexing_slicing,
            reason = "Model::new makes at least one replica"
        )]
        &self.replicas[0].net
    }

    /// The optimizer (replica 0's copy), once compiled.
    pub fn optimizer(&self) -> Option<&dyn Optimizer> {
        self.replicas.first()?.optimizer.as_deref()
    }

    /// The table of layers, output shapes and parameter counts, as Keras prints it.
    pub fn summary(&self) -> String {
        self.network().summary()
    }

    /// Divides `dataset` (of single examples) among the workers and their replicas in global
    /// batches of `global_batch` examples, as `strategy.experimental_distribute_dataset`:
    /// auto-sharded by the policy set with [`Dataset::with_options`] (by default `Auto`: by
    /// file where the source has a file per worker, else by data), each element one step's
    /// batches for this process's replicas. The
    /// last global batch may be short: replicas past its end get no batch, and `fit` and
    /// `evaluate` let them join the step empty-handed.
    ///
    /// # Errors
    ///
    /// When `global_batch` does not divide by the replicas in sync.
    pub fn distribute_dataset<D>(
        &self,
        dataset: D,
        global_batch: usize,
    ) -> Result<impl Dataset<Item = Vec<<D::Item as Batchable>::Batched>>, TrainError>
    where
        D: Dataset,
        D::Item: Batchable,
    {
        let policy = dataset
            .options()
            .auto_shard_policy
            .unwrap_or(AutoShardPolicy::Auto);
        Ok(distribute(dataset, global_batch, &self.context, policy)?
            .keep_remainder()
            .prefetch(2))
    }

    /// As `strategy.distribute_datasets_from_function`: `make` builds this process's pipeline
    /// from its [`InputContext`] (it shards and batches per replica itself); each element of
    /// the result is one step's batches for this process's replicas.
    ///
    /// # Errors
    ///
    /// What `make` returns.
    pub fn distribute_datasets_from_function<D>(
        &self,
        make: impl FnOnce(&InputContext) -> Result<D, TrainError>,
    ) -> Result<D, TrainError> {
        make(&self.context)
    }

    /// Loss and metrics over `data` (a distributed dataset), summed over every replica of
    /// every worker: every worker gets the same figures.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, the input fails, or a collective fails.
    pub fn evaluate<D, B>(&mut self, data: &D) -> Result<Logs, TrainError>
    where
        D: Dataset<Item = Vec<B>>,
        B: LabeledBatch,
    {
        let compiled = self.compiled.clone().ok_or_else(not_compiled)?;
        self.sync_host()?;
        let mut totals = StepTotals::default();
        let mut batches = StepsAhead::new(data.iter_epoch(0)?, self.replicas.len());
        loop {
            // A worker out of data takes empty batches until every worker is: the step's
            // totals say when no replica has more.
            let (inputs, more_data) = batches.next(true)?;
            let objective = Objective {
                more_data,
                ..compiled.objective()
            };
            let step = on_replicas(&mut self.replicas, inputs, |r, batch| {
                r.evaluate_batch(batch, objective)
            })?;
            totals.add(&step);
            if step.more_data == 0.0 || step.examples == 0.0 {
                break;
            }
        }
        Ok(Logs::from_totals(&totals, &compiled.metrics, ""))
    }

    /// Writes the weights to `path` as a safetensors file named by variable (`dense/kernel`),
    /// atomically, as Keras' `save_weights`. Its metadata `iterations` is the optimizer's
    /// step count (0 before `compile`), which a [`SidecarEvaluator`](crate::SidecarEvaluator)
    /// logs its figures at.
    ///
    /// # Errors
    ///
    /// When `path` cannot be written, naming it.
    pub fn save_weights(&self, path: impl AsRef<std::path::Path>) -> Result<(), TrainError> {
        // The step the weights are of, as TensorFlow's weights checkpoints carry the
        // optimizer's `iterations`: an evaluator logs its figures at that step.
        let iterations = self.optimizer().map_or(0, Optimizer::iterations);
        write_weights(self.network(), iterations, path.as_ref())
    }

    /// Loads weights that [`Model::save_weights`] wrote into every replica of this process
    /// (call it on every worker, or before `fit`, which gives all workers the chief's).
    ///
    /// # Errors
    ///
    /// When the file is missing or damaged, or holds another model's variables (the error
    /// names the first difference).
    pub fn load_weights(&mut self, path: impl AsRef<std::path::Path>) -> Result<(), TrainError> {
        self.set_weights(read_tensors(path.as_ref())?)
    }

    /// Sets every replica's variables of this process to `tensors` (named by variable).
    pub(crate) fn set_weights(&mut self, tensors: Vec<NamedTensor>) -> Result<(), TrainError> {
        self.leave_devices()?;
        let specs = self.network().parameters().specs().to_vec();
        let mut checkpoint = lockstep_checkpoint::Checkpoint::new(Progress::default());
        checkpoint.files.insert("weights".into(), tensors);
        let want: Vec<(&str, &[usize])> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.shape.as_slice()))
            .collect();
        checkpoint.check_variables("weights", &want)?;
        for replica in &mut self.replicas {
            for spec in &specs {
                let tensor = checkpoint.tensor("weights", &spec.name)?;
                replica.net.parameters_mut().values_mut()[spec.range()]
                    .copy_from_slice(&tensor.values);
            }
        }
        Ok(())
    }

    /// Outputs for a batch of inputs, from this process's first replica (inference needs no
    /// other replica), in host memory.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the model's input shape.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        // On a GPU replica the outputs come back to host memory, as Keras returns arrays.
        let output = self.network().predict(x)?;
        Ok(output.to_device(lockstep_tensor::Device::Cpu)?)
    }
}

/// Whether `dir` holds checkpoints of [`Model::save`] (`ckpt-<step>/manifest.json`).
fn holds_checkpoints(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|entry| {
            entry.file_name().to_string_lossy().starts_with("ckpt-")
                && entry.path().join("manifest.json").is_file()
        })
    })
}

/// `dir` when it holds saved models' checkpoints; else the subdirectory of `dir` that does
/// whose name ends in the largest number (the newest `ckpt-{epoch}`), names compared when
/// the numbers tie; else `dir`.
fn newest_model_dir(dir: &Path) -> PathBuf {
    if holds_checkpoints(dir) {
        return dir.to_path_buf();
    }
    let number = |name: &str| -> u64 {
        let digits: String = name
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().unwrap_or(0)
    };
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| holds_checkpoints(path))
        .max_by_key(|path| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (number(&name), name)
        })
        .unwrap_or_else(|| dir.to_path_buf())
}

/// FNV-1a over the variables' names and shapes, cut to 48 bits so that it is exact in an
/// `f64` (the all-reduce element it travels in).
fn architecture_fingerprint(specs: &[ParamSpec]) -> f64 {
    let words = specs.iter().flat_map(|spec| {
        spec.name
            .bytes()
            .map(u64::from)
            .chain([u64::MAX])
            .chain(spec.shape.iter().map(|&d| d as u64))
            .chain([u64::MAX - 1])
    });
    let hash = words.fold(0xcbf2_9ce4_8422_2325_u64, |h, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 16) as f64
}
