//! `Model::fit`: the training loop, as Keras runs it under a strategy.

use lockstep_data::{Dataset, IterState};

use crate::batch::LabeledBatch;
use crate::callbacks::{Callback, CallbackList};
use crate::error::TrainError;
use crate::history::{History, Logs};
use crate::kill_switch::KillSwitch;
use crate::model::Model;
use crate::progress::EpochProgress;
use crate::replica::{Objective, not_compiled, on_replicas};
use crate::state::{Position, TrainingContext};
use crate::steps_ahead::StepsAhead;

/// A `fit` call being set up: `model.fit(&data).epochs(3).callback(…).run()`.
pub struct Fit<'m, D, V = D> {
    model: &'m mut Model,
    data: &'m D,
    validation: Option<&'m V>,
    epochs: u64,
    initial_epoch: u64,
    steps_per_epoch: Option<u64>,
    callbacks: Vec<Box<dyn Callback + 'm>>,
    verbose: bool,
}

impl Model {
    /// Starts setting up training on `data`, a distributed dataset
    /// ([`Model::distribute_dataset`]): one epoch, no validation, no callbacks, one line per
    /// epoch on the chief.
    pub fn fit<'m, D>(&'m mut self, data: &'m D) -> Fit<'m, D, D> {
        Fit {
            model: self,
            data,
            validation: None,
            epochs: 1,
            initial_epoch: 0,
            steps_per_epoch: None,
            callbacks: Vec::new(),
            verbose: true,
        }
    }
}

impl<'m, D, V, B, VB> Fit<'m, D, V>
where
    D: Dataset<Item = Vec<B>>,
    B: LabeledBatch,
    V: Dataset<Item = Vec<VB>>,
    VB: LabeledBatch,
{
    /// Passes over the data.
    #[must_use]
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.epochs = epochs;
        self
    }

    /// The epoch to start at (from 0), as Keras' `initial_epoch`: training runs epochs
    /// `initial_epoch..epochs`, each reading its own pass of the data.
    #[must_use]
    pub fn initial_epoch(mut self, epoch: u64) -> Self {
        self.initial_epoch = epoch;
        self
    }

    /// This many steps per epoch, with one iterator over the data across epochs as Keras
    /// keeps it: epoch `e` goes on where epoch `e − 1` stopped (use `repeat()` for data of
    /// `steps × epochs` steps); input that runs out stops training, with a warning.
    #[must_use]
    pub fn steps_per_epoch(mut self, steps: u64) -> Self {
        self.steps_per_epoch = Some(steps);
        self
    }

    /// Evaluates on `validation` after every epoch; its values are logged as `val_loss`, ….
    pub fn validation_data<W, WB>(self, validation: &'m W) -> Fit<'m, D, W>
    where
        W: Dataset<Item = Vec<WB>>,
        WB: LabeledBatch,
    {
        Fit {
            model: self.model,
            data: self.data,
            validation: Some(validation),
            epochs: self.epochs,
            initial_epoch: self.initial_epoch,
            steps_per_epoch: self.steps_per_epoch,
            callbacks: self.callbacks,
            verbose: self.verbose,
        }
    }

    /// Adds a callback; callbacks run in the order added, except that those that save the
    /// training state ([`BackupAndRestore`](crate::BackupAndRestore)) run after all others.
    #[must_use]
    pub fn callback(mut self, callback: impl Callback + 'm) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Whether the chief prints one line per epoch (default `true`).
    #[must_use]
    pub fn verbose(mut self, verbose: bool) -> Self {
        self.verbose = verbose;
        self
    }

    /// Trains, and returns every epoch's logs.
    ///
    /// Each step, every replica takes its batch of the step (a replica whose worker has run
    /// out of data takes none), computes gradients, and all replicas' gradients and loss
    /// totals are summed in one all-reduce; the update divides by the examples in the step.
    /// An epoch ends after `steps_per_epoch`, with the step after which no replica of any
    /// worker has data (each worker reads its next step's batches before the step, and the
    /// step's all-reduce carries whether it found any), or at a step of no examples.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, the input fails, a collective fails (a peer died or
    /// timed out), or a callback fails; training stops at once on every worker.
    pub fn run(mut self) -> Result<History, TrainError> {
        let compiled = self.model.compiled.clone().ok_or_else(not_compiled)?;
        // The host's values are the model's until the first step puts a GPU replica's on its
        // device; from then until `fit` returns, the device's are newer between syncs.
        self.model.leave_devices()?;
        let callbacks = CallbackList::new(std::mem::take(&mut self.callbacks));
        let trained = self.train(callbacks, &compiled);
        if let Err(e) = self.model.sync_host() {
            tracing::error!(error = %e, "the weights trained on a GPU could not be copied back");
            trained?;
            return Err(e);
        }
        trained
    }

    /// The training loop of [`Fit::run`].
    fn train(
        &mut self,
        mut callbacks: CallbackList<'m>,
        compiled: &crate::model::Compiled,
    ) -> Result<History, TrainError> {
        let (data, validation, epochs) = (self.data, self.validation, self.epochs);
        let (initial_epoch, steps_per_epoch) = (self.initial_epoch, self.steps_per_epoch);
        let (verbose, model) = (self.verbose, &mut *self.model);
        let kill_switch = KillSwitch::from_env()?;
        let mut ctx = starting_context(model, initial_epoch);
        callbacks.each(&mut ctx, |c, ctx| c.on_train_begin(ctx))?;
        ctx.sync_from_chief()?;
        // A restored backup's callback states, now on every worker.
        let restored = std::mem::take(&mut ctx.callbacks);
        callbacks.restore_states(&restored)?;
        let mut history = History::default();
        let fingerprint = data.fingerprint_value();
        let replicas = ctx.model.replicas.len();
        // Epoch `e`'s input from `position` on.
        let input = |epoch, position: &Position| -> Result<_, TrainError> {
            let (epoch, offset) = where_epoch_reads(steps_per_epoch, epoch, position);
            let state = IterState {
                epoch,
                offset,
                fingerprint,
            };
            Ok(StepsAhead::new(data.iter_from(&state)?, replicas))
        };
        // A backup saved after a stop within an epoch resumes to finish that epoch's end.
        while ctx.position.epoch < epochs && !(ctx.stop && ctx.position.steps_into_epoch == 0) {
            let epoch = ctx.position.epoch;
            let show = verbose && ctx.model.is_chief();
            let total = data
                .cardinality()
                .finite()
                .map(|n| steps_per_epoch.map_or(n, |cap| cap.min(n)));
            let progress = EpochProgress::start(show, epoch, epochs, total);
            callbacks.each(&mut ctx, |c, ctx| c.on_epoch_begin(epoch, ctx))?;
            let mut batches = input(epoch, &ctx.position)?;
            let mut ran_out = false;
            while !ctx.stop
                && !ctx.position.pass_over
                && steps_per_epoch.is_none_or(|cap| ctx.position.steps_into_epoch < cap)
            {
                // A step that ends the epoch by `steps_per_epoch` reads no step ahead.
                let last =
                    steps_per_epoch.is_some_and(|cap| ctx.position.steps_into_epoch + 1 >= cap);
                let (inputs, more_data) = batches.next(!last)?;
                let here: usize = inputs
                    .iter()
                    .flatten()
                    .map(|parts| parts.targets.len())
                    .sum();
                let objective = Objective {
                    more_data,
                    ..compiled.objective()
                };
                let step = ctx.position.step;
                let totals = on_replicas(&mut ctx.model.replicas, inputs, |r, batch| {
                    r.train_step(batch, objective, step)
                })?;
                if totals.examples == 0.0 {
                    ran_out = steps_per_epoch.is_some();
                    break;
                }
                ctx.position.add(&totals);
                history.steps += 1;
                history.examples += totals.examples as u64;
                history.local_examples += here as u64;
                let logs = Logs::from_totals(&ctx.position.totals(), &compiled.metrics, "");
                progress.step(ctx.position.steps_into_epoch, &logs);
                let batch = ctx.position.steps_into_epoch - 1;
                callbacks.each(&mut ctx, |c, ctx| c.on_train_batch_end(batch, &logs, ctx))?;
                kill_switch.after_step(ctx.position.step);
            }
            // Data that ran out before `steps_per_epoch` (a step capped by it reads none ahead).
            ran_out |= ctx.position.pass_over && steps_per_epoch.is_some();
            let steps = ctx.position.steps_into_epoch;
            if ran_out {
                input_ran_out(epoch, steps);
                ctx.stop = true;
                if steps == 0 {
                    break;
                }
            }
            settle_epoch(&mut ctx, &mut history, epoch)?;
            let mut logs = Logs::from_totals(&ctx.position.totals(), &compiled.metrics, "");
            if let Some(validation) = validation {
                logs.extend_prefixed(ctx.model.evaluate(validation)?, "val_");
            }
            ctx.position.next_epoch();
            progress.finish(show, steps, &logs);
            history.record(epoch, &logs);
            callbacks.each(&mut ctx, |c, ctx| c.on_epoch_end(epoch, &logs, ctx))?;
        }
        callbacks.each(&mut ctx, |c, ctx| c.on_train_end(ctx))?;
        Ok(history)
    }
}

/// The end of an epoch's steps: lands the last update (validation and the epoch's callbacks
/// see the weights of its last step), adds its steps' times to `history`, and gathers the
/// straggler report.
fn settle_epoch(
    ctx: &mut TrainingContext<'_>,
    history: &mut History,
    epoch: u64,
) -> Result<(), TrainError> {
    ctx.model.sync_host()?;
    if let Some(first) = ctx.model.replicas.first() {
        let (step, blocked) = first.waits.times();
        history.step_time += step;
        history.comm_wait += blocked;
    }
    ctx.straggler = crate::stragglers::report(ctx.model, epoch)?;
    Ok(())
}

/// The context of a `fit` that starts at `initial_epoch` (a backup may move it on).
fn starting_context(model: &mut Model, initial_epoch: u64) -> TrainingContext<'_> {
    let workers = model.num_replicas_in_sync() / model.replicas.len().max(1);
    let step = model
        .optimizer()
        .map_or(0, lockstep_nn::Optimizer::iterations);
    TrainingContext {
        model,
        position: Position {
            step,
            epoch: initial_epoch,
            ..Position::default()
        },
        stop: false,
        workers,
        callbacks: Vec::new(),
        straggler: None,
    }
}

/// The pass over the data and the step within it that epoch `epoch` reads on from at
/// `position`. With `steps_per_epoch`, one iterator runs on across epochs, as Keras keeps its
/// own: epoch `e` reads from step `e · steps_per_epoch` of one pass (endless with `repeat()`).
/// Without it each epoch is a pass of its own.
fn where_epoch_reads(steps_per_epoch: Option<u64>, epoch: u64, position: &Position) -> (u64, u64) {
    match steps_per_epoch {
        Some(cap) => (0, epoch * cap + position.steps_into_epoch),
        None => (epoch, position.steps_into_epoch),
    }
}

/// Keras' "Your input ran out of data; interrupting training."
fn input_ran_out(epoch: u64, steps: u64) {
    tracing::warn!(
        epoch,
        steps,
        "the input ran out of data: training stops (a dataset for steps_per_epoch × epochs steps needs repeat())"
    );
}

#[cfg(test)]
mod tests {
    use lockstep_collective::CommunicationOptions;
    use lockstep_data::{Dataset, from_vec};
    use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
    use lockstep_tensor::{Device, Tensor};
    use lockstep_testenv::{Need, available};
    use ndarray::Array1;

    use crate::replica::Placement;
    use crate::{MirroredStrategy, Model};

    #[test]
    fn every_replica_ends_with_bit_identical_weights_and_optimizer_state() {
        every_replica_ends_bit_identical(MirroredStrategy::new(3).unwrap());
    }

    #[test]
    fn a_replica_on_a_gpu_and_one_on_the_cpu_end_with_bit_identical_weights() {
        let gpu = Device::Cuda(0);
        if available(Need::Gpu, Tensor::scalar(0.0).to_device(gpu)).is_none() {
            return;
        }
        // With each update left in flight asked for too: neither replica overlaps.
        let overlapped = CommunicationOptions {
            overlap_update: true,
            bytes_per_pack: 4096,
            ..CommunicationOptions::default()
        };
        for options in [CommunicationOptions::default(), overlapped] {
            let strategy = MirroredStrategy::with_devices(&[gpu, Device::Cpu], options).unwrap();
            let model = every_replica_ends_bit_identical(strategy);
            assert_eq!(model.replicas[0].net.device(), gpu);
            assert_eq!(model.replicas[1].net.device(), Device::Cpu);
            for replica in &model.replicas {
                assert_eq!(replica.placement, Placement::Mixed);
                assert_eq!(replica.overlaps(), Some(false));
            }
        }
    }

    #[test]
    fn a_group_on_both_kinds_of_device_decides_alike_to_apply_each_update_whole() {
        // Packs of 4 KiB with the update left in flight: replicas on CPUs alone overlap it.
        let options = CommunicationOptions {
            overlap_update: true,
            bytes_per_pack: 4096,
            ..CommunicationOptions::default()
        };
        let strategy = MirroredStrategy::with_options(2, options).unwrap();
        let model = every_replica_ends_bit_identical(strategy);
        assert!(model.replicas.iter().all(|r| r.overlaps() == Some(true)));
        // Both on the CPU, but the group told that the first sits on a GPU, as a mixed
        // group's replicas learn it: the CPU replica applies each update whole too, as the GPU
        // replica must, so both issue the same collectives and end alike.
        let strategy = MirroredStrategy::with_options(2, options).unwrap();
        let mut model = Model::new(strategy, || models::mnist_mlp(1)).unwrap();
        model
            .agree_on_architecture_and_placement(vec![true, false])
            .unwrap();
        let model = trained_bit_identical(model);
        for replica in &model.replicas {
            assert_eq!(replica.placement, Placement::Mixed);
            assert_eq!(replica.overlaps(), Some(false));
        }
    }

    /// Trains the MLP two epochs of two steps under `strategy` and checks every replica's
    /// variables and optimizer state against the first's.
    fn every_replica_ends_bit_identical(strategy: MirroredStrategy) -> Model {
        trained_bit_identical(Model::new(strategy, || models::mnist_mlp(1)).unwrap())
    }

    /// [`every_replica_ends_bit_identical`] for a model made already.
    fn trained_bit_identical(mut model: Model) -> Model {
        let loss = SparseCategoricalCrossentropy {
            from_logits: true,
            ..Default::default()
        };
        model.compile(Adam::default(), loss, &[]).unwrap();
        let examples: Vec<(Array1<f32>, u8)> = (0..96_u8)
            .map(|i| (Array1::from_elem(784, f32::from(i) / 96.0), i % 10))
            .collect();
        let data = model.distribute_dataset(from_vec(examples), 48).unwrap();
        assert_eq!(data.iter().unwrap().count(), 2);
        model.fit(&data).epochs(2).verbose(false).run().unwrap();
        let first = &model.replicas[0];
        for replica in &model.replicas[1..] {
            assert_eq!(replica.net.parameters(), first.net.parameters());
            let (a, b) = (
                first.optimizer.as_ref().unwrap(),
                replica.optimizer.as_ref().unwrap(),
            );
            assert_eq!(a.slots(), b.slots());
            assert_eq!(a.iterations(), 4);
        }
        model
    }
}
