//! The chief's side of `ParameterServerStrategy`: a model whose variables live on the `ps`
//! tasks, trained by `fit` through the coordinator.

use std::sync::Arc;

use lockstep_data::Dataset;
use lockstep_nn::{ForwardContext, Loss, Network, NnError, Optimizer, PredictionMetric};
use lockstep_ps::{ClusterCoordinator, CoordinatorOptions, PsClient};

use super::variables::ShardedVariables;
use super::{ParameterServerStrategy, PsRole, TRAIN_STEP};
use crate::batch::LabeledBatch;
use crate::error::TrainError;
use crate::history::{History, Logs};
use crate::model::metrics_named;
use crate::replica::{Objective, StepTotals};

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
    /// The coordinator of the workers, made by the first `fit`.
    coordinator: Option<ClusterCoordinator>,
    /// Steps scheduled by every `fit` so far.
    steps: u64,
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
        let net: Network = build()?.into();
        let variables = ShardedVariables::lay_out(
            net.parameters().specs(),
            strategy.num_ps(),
            strategy.partitioner(),
        )?;
        let clients = strategy.connect_ps()?;
        Ok(Self {
            strategy,
            net,
            variables,
            clients,
            compiled: None,
            coordinator: None,
            steps: 0,
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
        optimizer: &impl Optimizer,
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
        self.compiled = Some(Compiled {
            loss: Arc::new(loss),
            metrics,
        });
        Ok(())
    }

    /// Trains for `epochs` epochs of `steps_per_epoch` steps, each run by a free worker on a
    /// batch of its own dataset; an epoch ends when all its steps have. Each epoch's logs are
    /// the mean loss and metrics over its steps' batches. A worker lost mid-step has its step
    /// run on another (at least once); `verbose` prints a line per epoch.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, a step fails on its worker, or a `ps` task fails.
    pub fn fit(
        &mut self,
        epochs: u64,
        steps_per_epoch: u64,
        verbose: bool,
    ) -> Result<History, TrainError> {
        let compiled = self.compiled.as_ref().ok_or_else(|| {
            TrainError::invalid("fit", "the model is not compiled: call compile first")
        })?;
        if self.coordinator.is_none() {
            self.coordinator = Some(self.coordinate()?);
        }
        let coordinator = self
            .coordinator
            .as_ref()
            .ok_or_else(|| TrainError::invalid("fit", "no coordinator"))?;
        let mut history = History::default();
        for epoch in 0..epochs {
            let started = std::time::Instant::now();
            let values: Vec<_> = (0..steps_per_epoch)
                .map(|_| coordinator.schedule(TRAIN_STEP, Vec::new()))
                .collect();
            coordinator.join()?;
            let mut totals = StepTotals::default();
            for value in values {
                totals.add(&decode_totals(&value.fetch()?)?);
            }
            self.steps += steps_per_epoch;
            history.steps += steps_per_epoch;
            history.examples += totals.examples as u64;
            let logs = Logs::from_totals(&totals, &compiled.metrics, "");
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
        }
        let retried = coordinator.retried();
        if retried > 0 {
            tracing::warn!(retried, "steps ran again after their worker was lost");
        }
        self.pull_weights()?;
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
        for client in &mut self.clients {
            client.shutdown()?;
        }
        Ok(())
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
