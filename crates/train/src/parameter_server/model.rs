//! The chief's side of `ParameterServerStrategy`: a model whose variables live on the `ps`
//! tasks, trained by `fit` through the coordinator.

use std::path::PathBuf;
use std::sync::Arc;

use lockstep_checkpoint::{CheckpointManager, Progress};
use lockstep_data::Dataset;
use lockstep_nn::{ForwardContext, Loss, Network, NnError, Optimizer, PredictionMetric};
use lockstep_ps::{ClusterCoordinator, CoordinatorOptions, PsClient, RemoteValue, StepId};

use super::checkpoint;
use super::variables::{ShardedVariables, on_ps};
use super::worker::step_args;
use super::{ParameterServerStrategy, PsRole, TRAIN_STEP};
use crate::batch::LabeledBatch;
use crate::callbacks::format_path;
use crate::error::TrainError;
use crate::history::{History, Logs};
use crate::kill_switch::KillSwitch;
use crate::model::{metrics_named, write_weights};
use crate::replica::{Objective, StepTotals};
use crate::tensorboard::EventWriter;

/// What `compile` set.
struct Compiled {
    loss: Arc<dyn Loss>,
    metrics: Vec<Box<dyn PredictionMetric>>,
}

/// A model trained under `ParameterServerStrategy`, on the chief: `compile` puts its
/// variables on the `ps` tasks with the optimizer that will train them there, `fit` schedules
/// the workers' steps, and the trained values come back to this process's network.
pub struct ParameterServerModel {
    strategy: ParameterServerStrategy,
    net: Network,
    variables: ShardedVariables,
    clients: Vec<PsClient>,
    compiled: Option<Compiled>,
    /// The optimizer's settings `compile` put on the shards (Keras' config as JSON).
    optimizer: String,
    /// The coordinator of the workers, made by the first `fit`.
    coordinator: Option<ClusterCoordinator>,
    /// Where every epoch's checkpoint of the shards goes
    /// ([`ParameterServerModel::backup_and_restore`]).
    backup: Option<CheckpointManager>,
    /// The epoch the next `fit` starts at (past those a restored checkpoint finished).
    next_epoch: u64,
    /// Whether the newest checkpoint was looked for already.
    looked_for_backup: bool,
    /// Whether a completed `fit` deletes the checkpoints.
    delete_backup: bool,
    /// Where each epoch's weights go ([`ParameterServerModel::model_checkpoint`]).
    weights_pattern: Option<String>,
    /// Where each epoch's logs go as `TensorBoard` scalars
    /// ([`ParameterServerModel::tensorboard`]).
    tensorboard: Option<PathBuf>,
    /// Steps scheduled by every `fit` so far.
    steps: u64,
    /// This coordinator's run, drawn when it starts: with a step's number, the id by which
    /// each `ps` task applies a step's push once however often the step runs.
    run: u64,
    /// Steps scheduled in this run: the next step's number.
    scheduled: u64,
}

impl ParameterServerModel {
    /// Builds the model with `build` (the workers build it with the same function) and
    /// connects to the `ps` tasks.
    ///
    /// # Errors
    ///
    /// When this task is not the chief, the model cannot be built or has variables its
    /// layers update, or a `ps` task does not answer within the strategy's timeout.
    pub fn new<N: Into<Network>>(
        strategy: ParameterServerStrategy,
        build: impl Fn() -> Result<N, NnError>,
    ) -> Result<Self, TrainError> {
        if strategy.role()? != PsRole::Coordinator {
            return Err(TrainError::invalid(
                "ParameterServerModel",
                "the chief coordinates parameter-server training; workers call serve_steps \
                 and ps tasks serve_parameters",
            ));
        }
        let (net, variables, clients) = strategy.build_sharded(build)?;
        Ok(Self {
            strategy,
            net,
            variables,
            clients,
            compiled: None,
            optimizer: String::new(),
            coordinator: None,
            backup: None,
            next_epoch: 0,
            looked_for_backup: false,
            delete_backup: true,
            weights_pattern: None,
            tensorboard: None,
            steps: 0,
            run: new_run(),
            scheduled: 0,
        })
    }

    /// Puts every variable on its `ps` task with `optimizer`, which trains it there (a shard
    /// that a `ps` task holds already keeps its values: a restarted chief goes on from them),
    /// and sets the loss and metrics that `fit`'s logs and `evaluate` report (the workers
    /// compute them with the same loss and metrics, given to `serve_steps`).
    ///
    /// # Errors
    ///
    /// An unknown metric, an optimizer a `ps` task cannot run (one with a schedule), or a
    /// `ps` task's failure.
    pub fn compile(
        &mut self,
        optimizer: &(impl Optimizer + ?Sized),
        loss: impl Loss + 'static,
        metrics: &[&str],
    ) -> Result<(), TrainError> {
        let metrics = metrics_named(metrics)?;
        let config = serde_json::to_string(&optimizer.config())
            .map_err(|e| TrainError::invalid("compile", e.to_string()))?;
        let made =
            self.variables
                .create(&mut self.clients, self.net.parameters().values(), &config)?;
        tracing::info!(
            made,
            shards = self.variables.shards.len(),
            "variables placed on the parameter servers"
        );
        self.optimizer = config;
        self.compiled = Some(Compiled {
            loss: Arc::new(loss),
            metrics,
        });
        Ok(())
    }

    /// Keeps a checkpoint of every shard in `dir` at the end of each epoch (values and the
    /// optimizer's state, joined into whole variables), and resumes from the newest one there
    /// when the next `fit` starts: TensorFlow's `BackupAndRestore` for parameter-server
    /// training. A cluster restarted after a `ps` task died, with any number of `ps` tasks,
    /// goes on from the last finished epoch. With `delete_checkpoint` (Keras' default) the
    /// checkpoints are deleted when a `fit` completes, so the next run starts afresh.
    ///
    /// # Errors
    ///
    /// When `dir` cannot be created.
    pub fn backup_and_restore(
        &mut self,
        dir: impl Into<PathBuf>,
        delete_checkpoint: bool,
    ) -> Result<(), TrainError> {
        self.backup = Some(CheckpointManager::new(dir, Some(2))?);
        self.delete_backup = delete_checkpoint;
        self.looked_for_backup = false;
        Ok(())
    }

    /// At each epoch's end, pulls the weights and saves them to `filepath`, a Keras pattern
    /// whose `{epoch}` (`{epoch:02d}`, logged values too) is filled as `ModelCheckpoint` fills
    /// it: the weights files a `SidecarEvaluator` evaluates beside training.
    pub fn model_checkpoint(&mut self, filepath: impl Into<String>) {
        self.weights_pattern = Some(filepath.into());
    }

    /// Writes each epoch's logs as `TensorBoard` scalars `epoch_<name>` at the epoch's index
    /// in `log_dir/train`, as Keras' `TensorBoard` callback does.
    pub fn tensorboard(&mut self, log_dir: impl Into<PathBuf>) {
        self.tensorboard = Some(log_dir.into());
    }

    /// Saves the weights as last pulled to `path`, in `Model::save_weights`' format, with the
    /// steps scheduled so far as their `iterations`.
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn save_weights(&self, path: impl AsRef<std::path::Path>) -> Result<(), TrainError> {
        write_weights(&self.net, self.steps, path.as_ref())
    }

    /// Restores the newest checkpoint of [`ParameterServerModel::backup_and_restore`]'s
    /// directory onto the `ps` tasks, if there is one; returns the epoch it finished.
    fn restore_backup(&mut self) -> Result<Option<u64>, TrainError> {
        let Some(manager) = &self.backup else {
            return Ok(None);
        };
        let Some(saved) = manager.latest()? else {
            return Ok(None);
        };
        let per_ps = checkpoint::restore(
            &saved,
            self.net.parameters().specs(),
            &self.variables,
            (self.clients.len(), &self.optimizer),
        )?;
        for (ps, (client, shards)) in self.clients.iter_mut().zip(per_ps).enumerate() {
            client.import(shards).map_err(|e| on_ps(ps, &e))?;
        }
        self.steps = saved.progress.step;
        Ok(Some(saved.progress.epoch))
    }

    /// Saves every shard as the checkpoint of the epochs finished so far.
    fn save_backup(&mut self, finished: u64) -> Result<(), TrainError> {
        let Some(manager) = &self.backup else {
            return Ok(());
        };
        let mut states = Vec::new();
        for (ps, client) in self.clients.iter_mut().enumerate() {
            states.extend(client.export().map_err(|e| on_ps(ps, &e))?);
        }
        let progress = Progress {
            step: self.steps,
            epoch: finished,
            examples_into_epoch: 0,
            worker_count: self.strategy.num_workers(),
            seed: 0,
        };
        manager.save(&checkpoint::save(
            self.net.parameters().specs(),
            states,
            progress,
        )?)?;
        Ok(())
    }

    /// Schedules the next `count` training steps, each with an id no step of this run had
    /// (an epoch that failed and is trained again, or steps a restore winds back, are new
    /// steps).
    fn schedule_steps(&mut self, coordinator: &ClusterCoordinator, count: u64) -> Vec<RemoteValue> {
        let first = self.scheduled;
        self.scheduled += count;
        (first..first + count)
            .map(|number| {
                let id = StepId {
                    run: self.run,
                    number,
                };
                coordinator.schedule(TRAIN_STEP, step_args(id))
            })
            .collect()
    }

    /// Trains until epoch `epochs`, each of `steps_per_epoch` steps, each run by a free
    /// worker on a batch of its own dataset; an epoch ends when all its steps have. Each
    /// epoch's logs are the mean loss and metrics over its steps' batches. A worker lost
    /// mid-step has its step run on another (at least once), and each `ps` task applies
    /// the step's gradients once however often it ran (its pushes carry the step's id). With
    /// [`ParameterServerModel::backup_and_restore`], the first `fit` starts after the epochs
    /// its newest checkpoint finished, and each epoch ends with a checkpoint. `verbose` prints
    /// a line per epoch.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, a step fails on its worker (a `ps` task it cannot
    /// reach among the causes, named), or a checkpoint cannot be read or written.
    pub fn fit(
        &mut self,
        epochs: u64,
        steps_per_epoch: u64,
        verbose: bool,
    ) -> Result<History, TrainError> {
        if self.compiled.is_none() {
            return Err(TrainError::invalid(
                "fit",
                "the model is not compiled: call compile first",
            ));
        }
        if !self.looked_for_backup {
            self.looked_for_backup = true;
            if let Some(epoch) = self.restore_backup()? {
                if verbose {
                    println!("Restored the checkpoint of epoch {epoch}");
                }
                self.next_epoch = epoch;
            }
        }
        let coordinator = match self.coordinator.take() {
            Some(coordinator) => coordinator,
            None => self.coordinate()?,
        };
        arm_kill_switch(&coordinator, self.steps)?;
        let mut history = History::default();
        let mut events = self
            .tensorboard
            .as_ref()
            .map(|dir| EventWriter::create(&dir.join("train")))
            .transpose()?;
        for epoch in self.next_epoch..epochs {
            let started = std::time::Instant::now();
            let values = self.schedule_steps(&coordinator, steps_per_epoch);
            coordinator.join()?;
            let mut totals = StepTotals::default();
            for value in values {
                totals.add(&decode_totals(&value.fetch()?)?);
            }
            self.steps += steps_per_epoch;
            history.steps += steps_per_epoch;
            history.examples += totals.examples as u64;
            let metrics = self
                .compiled
                .as_ref()
                .map(|c| c.metrics.as_slice())
                .unwrap_or_default();
            let logs = Logs::from_totals(&totals, metrics, "");
            if verbose {
                println!(
                    "Epoch {}/{epochs} - {steps_per_epoch} steps - {:.1}s - {}",
                    epoch + 1,
                    started.elapsed().as_secs_f64(),
                    logs.line()
                );
            }
            history.epochs.push(epoch);
            for (name, value) in &logs.0 {
                history
                    .history
                    .entry(name.clone())
                    .or_default()
                    .push(*value);
            }
            if let Some(events) = &mut events {
                let scalars: Vec<(String, f64)> = logs
                    .0
                    .iter()
                    .map(|(name, value)| (format!("epoch_{name}"), *value))
                    .collect();
                events.scalars(epoch, &scalars)?;
                events.flush()?;
            }
            self.next_epoch = epoch + 1;
            self.save_backup(epoch + 1)?;
            if let Some(pattern) = self.weights_pattern.clone() {
                self.pull_weights()?;
                let path = PathBuf::from(format_path(&pattern, epoch + 1, None, &logs)?);
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        TrainError::invalid(
                            "model_checkpoint",
                            format!("creating {}: {e}", dir.display()),
                        )
                    })?;
                }
                self.save_weights(&path)?;
            }
        }
        let retried = coordinator.retried();
        if retried > 0 {
            tracing::warn!(retried, "steps ran again after their worker was lost");
        }
        self.coordinator = Some(coordinator);
        self.pull_weights()?;
        if let Some(manager) = self.backup.as_ref().filter(|_| self.delete_backup) {
            manager.delete_all()?;
        }
        Ok(history)
    }

    /// A coordinator of this cluster's workers.
    fn coordinate(&self) -> Result<ClusterCoordinator, TrainError> {
        let options = CoordinatorOptions {
            secret: self.strategy.secret().cloned(),
            connect_timeout: self.strategy.timeout(),
            ..CoordinatorOptions::default()
        };
        let workers = self.strategy.addresses(lockstep_cluster::WORKER)?;
        Ok(ClusterCoordinator::new(&workers, &options)?)
    }

    /// Ends the cluster's training: every worker's and `ps` task's service ends (their
    /// `serve_steps` and `serve_parameters` return), so every task's process can exit. The
    /// values stay in this process's network (pulled at the end of `fit`).
    ///
    /// # Errors
    ///
    /// A `ps` task that cannot be told.
    pub fn shutdown_cluster(mut self) -> Result<(), TrainError> {
        let coordinator = if let Some(coordinator) = self.coordinator.take() {
            coordinator
        } else {
            // No fit ran: wait until the workers are connected, to tell them.
            let coordinator = self.coordinate()?;
            let deadline = std::time::Instant::now() + self.strategy.timeout();
            while coordinator.connected() < self.strategy.num_workers()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            coordinator
        };
        let told = coordinator.shutdown_workers();
        if told < self.strategy.num_workers() {
            tracing::warn!(
                told,
                workers = self.strategy.num_workers(),
                "not every worker could be told that training is over"
            );
        }
        // Every ps task that can be told is told, a dead one's error reported after.
        let mut first_error = None;
        for (ps, client) in self.clients.iter_mut().enumerate() {
            if let Err(e) = client.shutdown() {
                first_error.get_or_insert(on_ps(ps, &e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Reads the variables' newest values from the `ps` tasks into this process's network.
    ///
    /// # Errors
    ///
    /// A `ps` task's failure.
    pub fn pull_weights(&mut self) -> Result<(), TrainError> {
        self.variables
            .pull(&mut self.clients, self.net.parameters_mut().values_mut())
    }

    /// The loss and metrics of the variables as last pulled, over every batch of `dataset`,
    /// on this process.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, or a batch does not fit it.
    pub fn evaluate<D>(&self, dataset: &D) -> Result<Logs, TrainError>
    where
        D: Dataset,
        D::Item: LabeledBatch,
    {
        let compiled = self.compiled.as_ref().ok_or_else(|| {
            TrainError::invalid("evaluate", "the model is not compiled: call compile first")
        })?;
        let objective = Objective {
            loss: &*compiled.loss,
            metrics: &compiled.metrics,
            more_data: false,
        };
        let mut totals = StepTotals::default();
        for item in dataset.iter()? {
            let parts = item?.into_parts()?;
            let output = self.net.forward(&parts.inputs, ForwardContext::default())?;
            let (_, measured) = objective.measure(&output.output, &parts)?;
            totals.add(&StepTotals::from_values(measured.into_iter()));
        }
        Ok(Logs::from_totals(&totals, &compiled.metrics, ""))
    }

    /// The network on this process, with the values last pulled.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// Steps scheduled by every `fit` so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}

/// `--kill chief:0@N`: a watcher that SIGKILLs this process once N steps have finished,
/// counting `before` (those of earlier `fit`s or a restored checkpoint), wherever that falls
/// in an epoch. Armed once per process.
fn arm_kill_switch(coordinator: &ClusterCoordinator, before: u64) -> Result<(), TrainError> {
    static ARMED: std::sync::Once = std::sync::Once::new();
    let Some(at) = KillSwitch::from_env()?.kill_at_updates() else {
        return Ok(());
    };
    let finished = coordinator.finished_steps();
    ARMED.call_once(|| {
        std::thread::spawn(move || {
            loop {
                let steps = before + finished.load(std::sync::atomic::Ordering::Relaxed);
                if steps >= at {
                    KillSwitch::kill_now(steps);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
    });
    Ok(())
}

/// A coordinator run's id: random (std's hasher keys come from the system's randomness), and
/// mixed with the time and process, so that a restarted chief's steps are never taken for the
/// steps of the run before it.
fn new_run() -> u64 {
    use std::hash::BuildHasher as _;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::hash::RandomState::new().hash_one((now, std::process::id()))
}

/// The bytes [`TRAIN_STEP`] answers with: a step's totals, each as its eight little-endian
/// bytes ([`decode_totals`] reads them).
pub(super) fn encode_totals(totals: &[f64]) -> Vec<u8> {
    totals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A step's totals from the bytes [`TRAIN_STEP`] answers.
fn decode_totals(bytes: &[u8]) -> Result<StepTotals, TrainError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(TrainError::invalid(
            "a worker's step",
            format!("{} bytes of totals, not a whole number of f64", bytes.len()),
        ));
    }
    let values = bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    Ok(StepTotals::from_values(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn totals_read_back_as_the_worker_wrote_them(
            totals in proptest::collection::vec(-1e12_f64..1e12, 0..12),
        ) {
            let read = decode_totals(&encode_totals(&totals)).unwrap();
            prop_assert_eq!(read, StepTotals::from_values(totals.into_iter()));
        }

        #[test]
        fn any_answer_is_totals_or_an_error_naming_its_length(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            match decode_totals(&bytes) {
                Ok(_) => prop_assert!(bytes.len() % 8 == 0),
                Err(e) => {
                    prop_assert!(bytes.len() % 8 != 0);
                    prop_assert!(e.to_string().contains(&format!("{} bytes", bytes.len())), "{}", e);
                }
            }
        }
    }
}
