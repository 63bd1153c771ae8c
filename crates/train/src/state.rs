//! Where training stands, and the state a checkpoint holds: saving it, restoring it, and
//! making every worker's state the chief's.

use lockstep_checkpoint::{Checkpoint, NamedTensor, Progress};
use lockstep_collective::ReduceOp;
use lockstep_nn::{LossConfig, ModelConfig, OptimizerConfig};
use serde::{Deserialize, Serialize};

use crate::callbacks::CallbackState;
use crate::error::TrainError;
use crate::model::{Model, ResidualSets};
use crate::replica::{Replica, StepTotals, not_compiled, on_replicas};
use crate::stragglers::Straggler;

/// The position of training: what a resumed run needs besides weights and optimizer state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Position {
    /// Optimizer steps taken.
    pub(crate) step: u64,
    /// The epoch in progress.
    pub(crate) epoch: u64,
    /// Steps of `epoch` taken: the distributed dataset's element index, the same on any
    /// number of workers for one global batch size.
    pub(crate) steps_into_epoch: u64,
    /// The epoch's totals so far, so a resumed epoch logs what an uninterrupted one would.
    pub(crate) loss_sum: f64,
    pub(crate) examples: f64,
    /// The compiled metrics' states, one after another.
    #[serde(default)]
    pub(crate) metrics: Vec<f64>,
    /// Whether training was asked to stop (`EarlyStopping`, input that ran out) by the time
    /// of the save: a run resumed from a backup of a finished run ends at once.
    #[serde(default)]
    pub(crate) stopped: bool,
    /// Whether the last step taken was the last of its pass over the data on every worker
    /// (its totals said no replica has data for another): a run resumed from a backup of
    /// that step ends the epoch without a step, as the uninterrupted run did.
    #[serde(default)]
    pub(crate) pass_over: bool,
}

impl Position {
    pub(crate) fn totals(&self) -> StepTotals {
        StepTotals {
            loss_sum: self.loss_sum,
            examples: self.examples,
            more_data: 0.0,
            metrics: self.metrics.clone(),
        }
    }

    pub(crate) fn add(&mut self, step: &StepTotals) {
        self.step += 1;
        self.steps_into_epoch += 1;
        let mut totals = self.totals();
        totals.add(step);
        self.loss_sum = totals.loss_sum;
        self.examples = totals.examples;
        self.metrics = totals.metrics;
        self.pass_over = step.more_data == 0.0;
    }

    pub(crate) fn next_epoch(&mut self) {
        *self = Self {
            step: self.step,
            epoch: self.epoch + 1,
            ..Self::default()
        };
    }
}

/// What the manifest's `meta` holds for a model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    optimizer: String,
    iterations: u64,
    /// Saved because a schedule may have changed it, as Keras saves it with the optimizer.
    learning_rate: f32,
    position: Position,
    /// What rebuilds the model and compiles it: a checkpoint is also a whole-model save.
    pub(crate) architecture: ModelConfig,
    pub(crate) optimizer_config: OptimizerConfig,
    /// The sparse cross-entropy's setting, as the first versions saved the loss.
    #[serde(default)]
    pub(crate) from_logits: bool,
    /// The loss's settings; `None` for a user's loss (named in `loss_name`), or in a
    /// checkpoint of a version that saved only `from_logits`.
    #[serde(default)]
    pub(crate) loss: Option<LossConfig>,
    #[serde(default)]
    pub(crate) loss_name: Option<String>,
    pub(crate) metrics: Vec<String>,
    /// The stateful callbacks' states, in the order `fit` runs them.
    #[serde(default)]
    pub(crate) callbacks: Vec<CallbackState>,
}

const MODEL: &str = "model";
const OPTIMIZER: &str = "optimizer";
/// Every replica's error-feedback residuals (`replica_0`, `replica_1`, …), when a step keeps
/// them.
const ERROR_FEEDBACK: &str = "error_feedback";

/// The whole state of `model` as a checkpoint: weights, optimizer state and settings, the
/// architecture and compile settings (so the checkpoint also loads as a whole model), and
/// `position` and the `callbacks`' states.
pub(crate) fn checkpoint_of(
    model: &Model,
    position: Position,
    workers: usize,
    callbacks: &[CallbackState],
) -> Result<Checkpoint, TrainError> {
    let net = model.network();
    let optimizer = model.optimizer().ok_or_else(not_compiled)?;
    // An Estimator's model has an optimizer but no Keras compile settings.
    let compiled = model.compiled.as_ref();
    let specs = net.parameters().specs();
    let values = net.parameters().values();
    let mut checkpoint = Checkpoint::new(Progress {
        step: position.step,
        epoch: position.epoch,
        examples_into_epoch: position.examples as u64,
        worker_count: workers,
        seed: 0,
    });
    let mut weights = Vec::with_capacity(specs.len());
    for spec in specs {
        weights.push(NamedTensor::new(
            spec.name.clone(),
            spec.shape.clone(),
            values[spec.range()].to_vec(),
        )?);
    }
    let mut slots = Vec::new();
    for (slot, flat) in optimizer.slots() {
        if flat.len() != values.len() {
            continue; // not yet allocated: the optimizer has taken no step
        }
        for spec in specs {
            slots.push(NamedTensor::new(
                format!("{slot}/{}", spec.name),
                spec.shape.clone(),
                flat[spec.range()].to_vec(),
            )?);
        }
    }
    checkpoint.files.insert(MODEL.into(), weights);
    checkpoint.files.insert(OPTIMIZER.into(), slots);
    if let Some(sets) = &model.residual_sets {
        let n = values.len();
        let residuals = sets
            .values
            .chunks(n.max(1))
            .enumerate()
            .map(|(r, values)| NamedTensor::new(format!("replica_{r}"), vec![n], values.to_vec()))
            .collect::<Result<Vec<_>, _>>()?;
        checkpoint.files.insert(ERROR_FEEDBACK.into(), residuals);
    }
    checkpoint.meta = serde_json::to_value(Meta {
        optimizer: optimizer.name().into(),
        iterations: optimizer.iterations(),
        learning_rate: optimizer.learning_rate(),
        position,
        architecture: net.config(),
        optimizer_config: optimizer.config(),
        from_logits: matches!(
            compiled.and_then(|c| c.loss.config()),
            Some(LossConfig::SparseCategoricalCrossentropy { from_logits: true })
        ),
        loss: compiled.and_then(|c| c.loss.config()),
        loss_name: compiled.map(|c| c.loss.name().to_owned()),
        metrics: compiled
            .map(super::model::Compiled::metric_names)
            .unwrap_or_default(),
        callbacks: callbacks.to_vec(),
    })
    .map_err(|e| TrainError::invalid("checkpoint", e.to_string()))?;
    Ok(checkpoint)
}

/// The trainer state a checkpoint holds.
pub(crate) fn meta_of(checkpoint: &Checkpoint) -> Result<Meta, TrainError> {
    serde_json::from_value(checkpoint.meta.clone()).map_err(|e| {
        TrainError::invalid(
            "checkpoint",
            format!("its trainer state is unreadable: {e}"),
        )
    })
}

/// Restores only the weights of `checkpoint` into every replica of `model` (for evaluation,
/// which needs no optimizer) and returns where training stood when it was saved.
pub(crate) fn restore_weights(
    model: &mut Model,
    checkpoint: &Checkpoint,
) -> Result<Position, TrainError> {
    let weights = checked_weights(model, checkpoint)?;
    let meta = meta_of(checkpoint)?;
    for replica in &mut model.replicas {
        replica
            .net
            .parameters_mut()
            .values_mut()
            .copy_from_slice(&weights);
    }
    Ok(meta.position)
}

/// The weights of `checkpoint` laid out as `model`'s parameters, after checking that it holds
/// exactly the model's variables.
fn checked_weights(model: &Model, checkpoint: &Checkpoint) -> Result<Vec<f32>, TrainError> {
    let specs = model.network().parameters().specs();
    let want: Vec<(&str, &[usize])> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.shape.as_slice()))
        .collect();
    checkpoint.check_variables(MODEL, &want)?;
    let mut weights = vec![0.0; model.network().parameters().len()];
    for spec in specs {
        weights[spec.range()].copy_from_slice(&checkpoint.tensor(MODEL, &spec.name)?.values);
    }
    Ok(weights)
}

/// Restores `checkpoint` into every replica of `model` (weights, optimizer state, learning
/// rate) and returns where training stood.
pub(crate) fn restore_into(
    model: &mut Model,
    checkpoint: &Checkpoint,
) -> Result<Position, TrainError> {
    model.leave_devices()?;
    let specs = model.network().parameters().specs().to_vec();
    let weights = checked_weights(model, checkpoint)?;
    let meta = meta_of(checkpoint)?;
    let name = model.optimizer().ok_or_else(not_compiled)?.name();
    if meta.optimizer != name {
        return Err(lockstep_checkpoint::CheckpointError::Mismatch {
            what: "optimizer".into(),
            expected: name.into(),
            found: meta.optimizer,
        }
        .into());
    }
    let total = model.network().parameters().len();
    let mut slots: Vec<(String, Vec<f32>)> = Vec::new();
    for tensor in checkpoint.file(OPTIMIZER)? {
        let (slot, variable) = tensor.name.split_once('/').unwrap_or((&tensor.name, ""));
        let Some(spec) = specs
            .iter()
            .find(|s| s.name == variable && s.shape == tensor.shape)
        else {
            return Err(TrainError::invalid(
                "checkpoint",
                format!(
                    "optimizer slot {} matches no variable of the model",
                    tensor.name
                ),
            ));
        };
        if !slots.iter().any(|(s, _)| s == slot) {
            slots.push((slot.to_owned(), vec![0.0; total]));
        }
        if let Some((_, flat)) = slots.iter_mut().find(|(s, _)| s == slot) {
            flat[spec.range()].copy_from_slice(&tensor.values);
        }
    }
    let view: Vec<(&str, &[f32])> = slots
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    // Handed to every replica by `fit` (`sync_from_chief`).
    model.residual_sets = residual_sets_of(checkpoint, total)?;
    for replica in &mut model.replicas {
        replica
            .net
            .parameters_mut()
            .values_mut()
            .copy_from_slice(&weights);
        let optimizer = replica.optimizer.as_mut().ok_or_else(not_compiled)?;
        optimizer.restore(meta.iterations, &view)?;
        // A schedule's rate follows the restored step count by itself.
        if optimizer.schedule().is_none() {
            optimizer.set_learning_rate(meta.learning_rate);
        }
    }
    Ok(meta.position)
}

/// The error-feedback residuals `checkpoint` holds for a gradient buffer of `n` values, in
/// replica order; `None` when it holds none.
fn residual_sets_of(checkpoint: &Checkpoint, n: usize) -> Result<Option<ResidualSets>, TrainError> {
    let Some(tensors) = checkpoint.files.get(ERROR_FEEDBACK) else {
        return Ok(None);
    };
    // Grown as each tensor is found whole: a checkpoint's count of tensors sizes nothing.
    let mut values = Vec::new();
    for (r, tensor) in tensors.iter().enumerate() {
        let name = format!("replica_{r}");
        let found = checkpoint
            .tensor(ERROR_FEEDBACK, &name)
            .ok()
            .filter(|t| t.values.len() == n);
        let Some(found) = found else {
            return Err(TrainError::invalid(
                "checkpoint",
                format!(
                    "its error-feedback residuals hold {} ({} values) where {name} of {n} \
                     was expected",
                    tensor.name,
                    tensor.values.len()
                ),
            ));
        };
        values.extend_from_slice(&found.values);
    }
    Ok(Some(ResidualSets {
        replicas: tensors.len(),
        values,
    }))
}

/// Gathers every replica's error-feedback residuals into `model.residual_sets` on every
/// process (one all-reduce of `replicas × n` values, each replica's own run filled in), for
/// a backup to hold; `None` when the steps keep none.
fn gather_residuals(model: &mut Model) -> Result<(), TrainError> {
    model.residual_sets = None;
    let Some(first) = model.replicas.first() else {
        return Ok(());
    };
    if !first.keeps_residuals() {
        return Ok(());
    }
    let replicas = first.link.world_size();
    let n = model.network().parameters().len();
    let local = model.replicas.len();
    let values = on_replicas(&mut model.replicas, vec![(); local], |r, ()| {
        let mut all = vec![0.0_f32; replicas * n];
        let own = r.residuals.values();
        let at = r.link.replica_id() * n;
        if own.len() == n {
            all[at..at + n].copy_from_slice(own);
        }
        r.link.all_reduce(&mut all, ReduceOp::Sum)?;
        Ok(all)
    })?;
    model.residual_sets = Some(ResidualSets { replicas, values });
    Ok(())
}

/// The chief's `sets` replicas' residuals (`restored`, on the chief) broadcast to `replica`,
/// which keeps its own ([`own_residuals`]); nothing when there are none.
fn receive_residuals(
    replica: &mut Replica,
    restored: &[f32],
    sets: usize,
) -> Result<(), TrainError> {
    if sets == 0 {
        return Ok(());
    }
    let n = replica.net.parameters().len();
    let mut flat = restored.to_vec();
    flat.resize(sets * n, 0.0);
    replica.link.broadcast(&mut flat)?;
    let (me, world) = (replica.link.replica_id(), replica.link.world_size());
    replica.residuals.set(own_residuals(&flat, n, me, world));
    Ok(())
}

/// The residuals replica `me` of `world` takes from the saved replicas' `sets` (each `n`
/// long): the saved replica of its index, plus those of the saved replicas past `world` whose
/// index falls to it round-robin, so that what every replica still owes is carried whole to a
/// cluster of fewer replicas.
fn own_residuals(sets: &[f32], n: usize, me: usize, world: usize) -> Vec<f32> {
    let mut own = vec![0.0; n];
    for (saved, values) in sets.chunks(n.max(1)).enumerate() {
        if saved == me {
            own.copy_from_slice(values);
        } else if saved % world.max(1) == me {
            for (o, v) in own.iter_mut().zip(values) {
                *o += v;
            }
        }
    }
    own
}

/// What a callback sees of training: the model, where training stands, and the means to save,
/// restore and agree with the other workers.
pub struct TrainingContext<'m> {
    pub(crate) model: &'m mut Model,
    pub(crate) position: Position,
    pub(crate) stop: bool,
    pub(crate) workers: usize,
    /// The stateful callbacks' states: as `fit` last gathered them before a callback that
    /// saves the training state ran, or as a restored backup held them.
    pub(crate) callbacks: Vec<CallbackState>,
    /// The chief's straggler report of the epoch that ended last.
    pub(crate) straggler: Option<Straggler>,
}

impl TrainingContext<'_> {
    /// Whether this process writes checkpoints and logs.
    pub fn is_chief(&self) -> bool {
        self.model.is_chief()
    }

    /// This process's task, as `worker:1`.
    pub fn task(&self) -> &str {
        self.model.task()
    }

    /// On the chief, from the end of an epoch of `fit` on: whom the replicas waited for in that
    /// epoch's collectives, and how long (the straggler report `fit` logs). `None` on the other
    /// tasks, with one replica in sync, and before the first epoch's end.
    pub fn straggler(&self) -> Option<&Straggler> {
        self.straggler.as_ref()
    }

    /// The model. Replicas training on a GPU keep their newest values on it, and replicas
    /// whose update overlaps the next forward pass
    /// (`CommunicationOptions::overlap_update`) hold the last step's update in flight: in the
    /// middle of an epoch the model's weights and optimizer state are then those of the last
    /// sync (the last epoch's end, or the last [`chief_writes`](Self::chief_writes)) until
    /// [`sync_model`](Self::sync_model) brings them up to date; otherwise they are always
    /// current.
    pub fn model(&self) -> &Model {
        self.model
    }

    /// Copies the newest weights and optimizer state of replicas training on a GPU into the
    /// model that [`model`](Self::model) shows, and lands an update in flight (nothing to do
    /// otherwise).
    ///
    /// # Errors
    ///
    /// When the copy from the GPU fails.
    pub fn sync_model(&mut self) -> Result<(), TrainError> {
        self.model.sync_host()
    }

    /// Optimizer steps taken so far.
    pub fn step(&self) -> u64 {
        self.position.step
    }

    /// The epoch in progress (after an epoch's end: the next one).
    pub fn epoch(&self) -> u64 {
        self.position.epoch
    }

    /// Sets every local replica's learning rate (every worker must set the same).
    pub fn set_learning_rate(&mut self, learning_rate: f32) {
        for replica in &mut self.model.replicas {
            replica.set_learning_rate(learning_rate);
        }
    }

    /// Asks `fit` to stop after this step or epoch, as setting `model.stop_training`.
    pub fn stop_training(&mut self) {
        self.stop = true;
    }

    /// The whole training state as a checkpoint: weights, optimizer state and iterations,
    /// position (step, epoch, examples of the epoch consumed over all workers), and the
    /// stateful callbacks' states ([`Callback::state`](crate::Callback::state)).
    ///
    /// # Errors
    ///
    /// When the model is not compiled.
    pub fn checkpoint(&self) -> Result<Checkpoint, TrainError> {
        let position = Position {
            stopped: self.stop,
            ..self.position.clone()
        };
        checkpoint_of(self.model, position, self.workers, &self.callbacks)
    }

    /// Restores a checkpoint into this process's replicas and moves training to where it
    /// stood. Meant for [`Callback::on_train_begin`](crate::Callback::on_train_begin); `fit`
    /// then gives every worker the chief's state.
    ///
    /// # Errors
    ///
    /// For a checkpoint of another model or optimizer, naming the difference.
    pub fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), TrainError> {
        self.position = restore_into(self.model, checkpoint)?;
        self.stop = self.position.stopped;
        self.callbacks = meta_of(checkpoint)?.callbacks;
        Ok(())
    }

    /// Whether every worker says `ok`: a phase that every worker enters together, bounded by
    /// the collective timeout (the chief saves, then all learn whether it could).
    ///
    /// # Errors
    ///
    /// When the workers cannot agree (a peer is gone).
    pub fn agree(&mut self, ok: bool) -> Result<bool, TrainError> {
        let mut vote = [f64::from(u8::from(ok))];
        let leader = self
            .model
            .replicas
            .first_mut()
            .ok_or_else(|| TrainError::invalid("model", "it has no replicas"))?;
        leader.link.all_reduce_processes(&mut vote, ReduceOp::Min)?;
        Ok(vote[0] == 1.0)
    }

    /// The phase in which the chief writes something and every worker learns whether it
    /// could: `write` runs on the chief only, then all workers [`agree`](Self::agree). A
    /// failure is an error on every worker: the chief's own error there, a message naming
    /// `what` (from the `callback`) on the others.
    ///
    /// # Errors
    ///
    /// When the chief could not write, or the workers cannot agree.
    pub fn chief_writes(
        &mut self,
        callback: &'static str,
        what: &str,
        write: impl FnOnce(&Self) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        // Replicas on a GPU hold newer values than the host's between syncs; every
        // replica's residuals reach the chief for a backup to hold.
        let written = self
            .model
            .sync_host()
            .and_then(|()| gather_residuals(self.model))
            .and_then(|()| if self.is_chief() { write(self) } else { Ok(()) });
        self.model.residual_sets = None;
        if let Err(e) = &written {
            tracing::error!("{callback}: writing {what}: {e}");
        }
        if self.agree(written.is_ok())? {
            return Ok(());
        }
        written?;
        Err(TrainError::invalid(
            callback,
            format!("the chief could not write {what}"),
        ))
    }

    /// Gives every replica of every worker the state of the chief's first replica: weights,
    /// optimizer state, position and callback states (a backup restored on the chief reaches
    /// all).
    pub(crate) fn sync_from_chief(&mut self) -> Result<(), TrainError> {
        self.model.leave_devices()?;
        let n = self.model.network().parameters().len();
        let (iterations, slot_names, slots_ready, learning_rate) = {
            let optimizer = self.model.optimizer().ok_or_else(not_compiled)?;
            let slots = optimizer.slots();
            let ready = !slots.is_empty() && slots.iter().all(|(_, s)| s.len() == n);
            (
                optimizer.iterations(),
                slots.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
                ready,
                optimizer.learning_rate(),
            )
        };
        // Every worker compiled the same metrics, so their states have one length everywhere.
        let metric_len: usize = self
            .model
            .compiled
            .as_ref()
            .map_or(0, |c| c.metrics.iter().map(|m| m.state().len()).sum());
        // Callback states travel as their JSON's bytes, each exact in an f32.
        let states = serde_json::to_vec(&self.callbacks)
            .map_err(|e| TrainError::invalid("callback state", e.to_string()))?;
        let p = &self.position;
        let mut header = vec![
            p.step as f64,
            p.epoch as f64,
            p.steps_into_epoch as f64,
            p.loss_sum,
            p.examples,
            iterations as f64,
            f64::from(u8::from(slots_ready)),
            f64::from(learning_rate),
            states.len() as f64,
            f64::from(u8::from(self.stop)),
        ];
        // Residuals a restored backup held (on the chief): how many replicas' there are.
        let restored = self.model.residual_sets.take();
        header.push(restored.as_ref().map_or(0.0, |sets| sets.replicas as f64));
        header.push(f64::from(u8::from(p.pass_over)));
        let restored = restored.map(|sets| sets.values).unwrap_or_default();
        let mut metrics = p.metrics.clone();
        metrics.resize(metric_len, 0.0);
        header.extend(metrics);
        let replicas = self.model.replicas.len();
        let mut received = Vec::new();
        on_replicas(&mut self.model.replicas, vec![(); replicas], |r, ()| {
            let mut header = header.clone();
            r.link.broadcast(&mut header)?;
            let mut bytes: Vec<f32> = states.iter().map(|&b| f32::from(b)).collect();
            bytes.resize(header[8] as usize, 0.0);
            r.link.broadcast(&mut bytes)?;
            r.link.broadcast(r.net.parameters_mut().values_mut())?;
            let optimizer = r.optimizer.as_mut().ok_or_else(not_compiled)?;
            if optimizer.schedule().is_none() {
                optimizer.set_learning_rate(header[7] as f32);
            }
            if header[6] == 1.0 {
                let mut flat: Vec<f32> = optimizer
                    .slots()
                    .iter()
                    .flat_map(|(_, s)| s.iter().copied())
                    .collect();
                flat.resize(slot_names.len() * n, 0.0);
                r.link.broadcast(&mut flat)?;
                let view: Vec<(&str, &[f32])> = slot_names
                    .iter()
                    .zip(flat.chunks(n.max(1)))
                    .map(|(name, values)| (*name, values))
                    .collect();
                optimizer.restore(header[5] as u64, &view)?;
            } else {
                optimizer.restore(header[5] as u64, &[])?;
            }
            receive_residuals(r, &restored, header[10] as usize)?;
            Ok((header, bytes))
        })
        .map(|(h, bytes)| {
            header = h;
            received = bytes;
        })?;
        self.position = Position {
            step: header[0] as u64,
            epoch: header[1] as u64,
            steps_into_epoch: header[2] as u64,
            loss_sum: header[3],
            examples: header[4],
            metrics: header[12..].to_vec(),
            stopped: false,
            pass_over: header[11] == 1.0,
        };
        self.stop = header[9] == 1.0;
        let bytes: Vec<u8> = received.iter().map(|&b| b as u8).collect();
        self.callbacks = serde_json::from_slice(&bytes).map_err(|e| {
            TrainError::invalid(
                "callback state",
                format!("the chief's callback states are unreadable: {e}"),
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::own_residuals;

    #[test]
    fn each_replica_takes_its_saved_residuals_and_fewer_replicas_take_the_rest_round_robin() {
        // Three saved replicas of two values each.
        let sets = [1.0, 2.0, 10.0, 20.0, 100.0, 200.0];
        assert_eq!(own_residuals(&sets, 2, 1, 3), [10.0, 20.0]);
        // On two replicas, the third's go to the first: nothing owed is lost.
        assert_eq!(own_residuals(&sets, 2, 0, 2), [101.0, 202.0]);
        assert_eq!(own_residuals(&sets, 2, 1, 2), [10.0, 20.0]);
        // On four, the fourth starts from zero.
        assert_eq!(own_residuals(&sets, 2, 3, 4), [0.0, 0.0]);
    }
}
