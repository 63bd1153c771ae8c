//! One replica: its copy of the model and optimizer, its collective handle, and the work it
//! does in a step. Replicas of one process run on threads of their own for each step.

use std::cell::OnceCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_collective::{Compression, ReduceOp};
use lockstep_nn::{
    DeviceState, Forward, ForwardContext, Loss, Network, NnError, Optimizer, PredictionMetric,
};
use lockstep_tensor::ops::AllReduceSum;
use lockstep_tensor::{Device, Tensor};

use crate::batch::LabeledParts;
use crate::error::TrainError;
use crate::packs::{self, Arrivals, Packs, Residuals, Wire};
use crate::stragglers::Waits;
use crate::strategy::ReplicaLink;
use crate::update_in_flight::{PackThread, UpdateInFlight};

/// Statistics of one step (or evaluation batch) summed over every replica in sync: the
/// weighted loss, the examples, the replicas whose worker's input holds another step, and
/// each compiled metric's state, one after another.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepTotals {
    pub(crate) loss_sum: f64,
    pub(crate) examples: f64,
    /// Replicas whose worker's input holds data for another step ([`Objective::more_data`],
    /// counted once per replica, with or without a batch in this step): 0 when this step
    /// was the last of its pass over the data on every worker.
    pub(crate) more_data: f64,
    pub(crate) metrics: Vec<f64>,
}

impl StepTotals {
    pub(crate) fn add(&mut self, other: &StepTotals) {
        self.loss_sum += other.loss_sum;
        self.examples += other.examples;
        self.more_data += other.more_data;
        if self.metrics.len() < other.metrics.len() {
            self.metrics.resize(other.metrics.len(), 0.0);
        }
        for (a, b) in self.metrics.iter_mut().zip(&other.metrics) {
            *a += b;
        }
    }
}

/// One replica's part of a step: inputs, targets and weights, or nothing once its data has
/// run out.
pub(crate) type ReplicaBatch = Option<LabeledParts>;

/// What a step computes besides the gradients: the loss and the metrics, as compiled.
#[derive(Clone, Copy)]
pub(crate) struct Objective<'a> {
    pub(crate) loss: &'a dyn Loss,
    pub(crate) metrics: &'a [Box<dyn PredictionMetric>],
    /// Whether this replica's worker's input holds data for the step after this one (the
    /// same for every replica of a process, with or without a batch now). It travels in the
    /// step's own all-reduce, so that `fit` learns that a pass over the data has ended on
    /// every worker with its last step, not from a step of its own that no replica has data
    /// for (a collective, and the update in flight landed, at every epoch's end).
    pub(crate) more_data: bool,
}

impl Objective<'_> {
    /// The values appended to a step's all-reduce: the loss, the examples, whether there is
    /// more data, every metric's state.
    fn totals_len(&self) -> usize {
        3 + self.metrics.iter().map(|m| m.state().len()).sum::<usize>()
    }

    /// The totals of a replica without data for this step: nothing, but whether it has data
    /// for the next.
    fn empty_totals(&self) -> Vec<f64> {
        let mut totals = vec![0.0; self.totals_len()];
        totals[2] = f64::from(u8::from(self.more_data));
        totals
    }

    /// The summed loss of a batch (per-example losses times their weights), with its
    /// gradient recorded, and the batch's totals.
    pub(crate) fn measure(
        &self,
        output: &lockstep_tensor::Tensor,
        parts: &LabeledParts,
    ) -> Result<(lockstep_tensor::Tensor, Vec<f64>), TrainError> {
        let targets = parts.targets.as_targets();
        let weights = parts.sample_weight.as_deref();
        let per_example = self.loss.per_example(output, targets)?;
        let summed = lockstep_nn::reduce_loss(
            self.loss.name(),
            &per_example,
            weights,
            lockstep_nn::Reduction::Sum,
        )?;
        let mut totals = vec![
            f64::from(summed.item()?),
            parts.targets.len() as f64,
            f64::from(u8::from(self.more_data)),
        ];
        for template in self.metrics {
            let mut metric = template.fresh();
            metric.update_state(output, targets, weights)?;
            totals.extend(metric.state());
        }
        Ok((summed, totals))
    }
}

impl StepTotals {
    /// Totals from the all-reduced values `measure` laid out.
    pub(crate) fn from_values(values: impl Iterator<Item = f64>) -> Self {
        let values: Vec<f64> = values.collect();
        Self {
            loss_sum: values.first().copied().unwrap_or(0.0),
            examples: values.get(1).copied().unwrap_or(0.0),
            more_data: values.get(2).copied().unwrap_or(0.0),
            metrics: values.get(3..).map(<[f64]>::to_vec).unwrap_or_default(),
        }
    }
}

/// Where the replicas of the whole group sit, learnt by every replica when the model is built
/// (in the all-reduce that checks the architecture), so that what only some devices can do is
/// decided alike by all: every replica must issue the same collectives in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Every replica on a CPU.
    AllOnCpus,
    /// Every replica on a GPU.
    AllOnGpus,
    /// Some on GPUs, the others on CPUs.
    Mixed,
}

impl Placement {
    /// The placement of a group in which `any` replica, or `every` one, is on a GPU.
    pub(crate) fn of(any_on_gpu: bool, every_on_gpu: bool) -> Self {
        match (any_on_gpu, every_on_gpu) {
            (false, _) => Self::AllOnCpus,
            (true, true) => Self::AllOnGpus,
            (true, false) => Self::Mixed,
        }
    }
}

pub(crate) struct Replica {
    pub(crate) link: ReplicaLink,
    /// Where the group's replicas sit (all of them, this one's among them).
    pub(crate) placement: Placement,
    pub(crate) net: Network,
    pub(crate) optimizer: Option<Box<dyn Optimizer>>,
    /// Gradients, then the step's totals.
    pub(crate) buffer: Vec<f32>,
    /// The link as layers reduce with inside a pass.
    pub(crate) across: Arc<dyn AllReduceSum>,
    /// The kernel threads a process's single replica runs its steps on (made at its first
    /// step; see [`on_replicas`]).
    /// `None` inside when they could not start: the steps then run on the calling thread, and
    /// no step tries again.
    kernels: OnceCell<Option<crate::kernel_threads::KernelThreads>>,
    /// The gradient buffer's packs, how they travel, and whether the steps leave their update
    /// in flight (made at the first step; shared, so a step holds them while it borrows the
    /// replica).
    packs: Option<(Arc<Packs>, Wire, bool)>,
    /// The last step's update, still being summed, when its packs overlap the next forward
    /// pass (the `bool` above): the weights are those before it until it lands.
    in_flight: Option<UpdateInFlight>,
    /// The communication thread that sums this replica's packs (made at the first step with
    /// several).
    pack_thread: Option<PackThread>,
    /// Why landing the update in flight failed where no error could be returned (a learning
    /// rate set between steps): the next step's error.
    landing_failed: Option<TrainError>,
    /// This replica's rounding errors under error feedback (empty without it).
    pub(crate) residuals: Residuals,
    /// The steps' time and the part blocked in their collectives, since the last report.
    pub(crate) waits: Waits,
    /// A GPU replica's parameters, gradients and optimizer state on its device between the
    /// steps of `fit` (made at the first step): `None` on the CPU, before the first step, or
    /// for a model and optimizer the device state cannot hold (those steps upload the
    /// variables and read the gradients back each time).
    resident: Option<DeviceState>,
    /// Whether `resident` holds newer values than `net` and `optimizer` (steps since the last
    /// [`Replica::sync_host`]).
    host_stale: bool,
    /// Whether the device state was tried and refused for this model (said once in the log).
    resident_refused: bool,
}

impl Replica {
    /// Whether this replica's steps keep error-feedback residuals.
    pub(crate) fn keeps_residuals(&self) -> bool {
        Wire::new(&self.link.options(), self.link.world_size()).keeps_residuals()
    }

    pub(crate) fn new(link: ReplicaLink, net: Network) -> Self {
        let placement = if net.device() == Device::Cpu {
            Placement::AllOnCpus
        } else {
            Placement::AllOnGpus
        };
        Self {
            across: link.sum_across(),
            link,
            placement,
            net,
            optimizer: None,
            buffer: Vec::new(),
            kernels: OnceCell::new(),
            packs: None,
            in_flight: None,
            pack_thread: None,
            landing_failed: None,
            residuals: Residuals::default(),
            waits: Waits::default(),
            resident: None,
            host_stale: false,
            resident_refused: false,
        }
    }

    /// Copies a GPU replica's newer values (its device state's) into `net` and `optimizer`,
    /// and lands the update in flight of a replica whose packs overlap the next pass.
    pub(crate) fn sync_host(&mut self) -> Result<(), TrainError> {
        if let Some(e) = self.landing_failed.take() {
            return Err(e);
        }
        // The wait belongs to the last step: the straggler report and `comm_wait_share` count
        // it (at 1 Gbit/s, 0.6–5.8 ms at each epoch's end of the tutorial's CNN).
        let landed = self.land_in_flight()?;
        self.waits.add_wait(landed);
        if self.host_stale
            && let (Some(state), Some(optimizer)) = (&self.resident, &mut self.optimizer)
        {
            state.write_back(&mut self.net, &mut **optimizer)?;
        }
        self.host_stale = false;
        Ok(())
    }

    /// [`Replica::sync_host`], then forgets the device state: `net` and `optimizer` are the
    /// values from here on (the next step uploads them again).
    pub(crate) fn leave_device(&mut self) -> Result<(), TrainError> {
        self.sync_host()?;
        self.resident = None;
        self.resident_refused = false;
        Ok(())
    }

    /// Whether this step runs on the device state: a GPU replica whose model and optimizer it
    /// can hold, made here at the first step.
    fn on_device_state(&mut self) -> bool {
        if self.resident.is_some() {
            return true;
        }
        if self.net.device() == Device::Cpu || self.resident_refused {
            return false;
        }
        let Some(optimizer) = self.optimizer.as_deref() else {
            return false;
        };
        // Any number of packs: NCCL sums the whole buffer in one call, and the CPU's path
        // reads it back and reduces it pack by pack as `reduce_after` does on the CPU.
        let made = if self.net.synchronizes_replicas() {
            Err(NnError::InvalidConfig {
                layer: "device state".into(),
                why: "its layers reduce across replicas inside the pass".into(),
            })
        } else {
            DeviceState::new(&self.net, optimizer)
        };
        match made {
            Ok(state) => {
                self.resident = Some(state);
                true
            }
            Err(e) => {
                tracing::info!(device = %self.net.device(), reason = %e, "this replica's steps upload its variables and read its gradients back each step");
                self.resident_refused = true;
                false
            }
        }
    }

    /// Compiles the replica with `optimizer` (after [`Replica::sync_host`]): its steps decide
    /// again whether they can leave their update in flight.
    pub(crate) fn set_optimizer(&mut self, optimizer: Box<dyn Optimizer>) {
        self.optimizer = Some(optimizer);
        self.packs = None;
    }

    /// Sets the learning rate, once the update in flight has landed with the rate it was
    /// computed under.
    pub(crate) fn set_learning_rate(&mut self, learning_rate: f32) {
        match self.land_in_flight() {
            Ok(landed) => self.waits.add_wait(landed),
            Err(e) => {
                tracing::error!(error = %e, "the last step's update could not be applied");
                self.landing_failed = Some(e);
            }
        }
        if let Some(optimizer) = &mut self.optimizer {
            optimizer.set_learning_rate(learning_rate);
        }
    }

    /// Waits for the update in flight, applies what is left of it and counts the step.
    /// Returns the time spent waiting for its sums.
    fn land_in_flight(&mut self) -> Result<Duration, TrainError> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(Duration::ZERO);
        };
        let n = self.net.parameters().len();
        if self.buffer.len() < n {
            self.buffer.resize(n, 0.0);
        }
        let optimizer = self.optimizer.as_deref_mut().ok_or_else(not_compiled)?;
        let landed = flight.finish(self.net.parameters_mut(), optimizer, &mut self.buffer[..n]);
        self.link.set_spinning(true);
        let (residuals, blocked) = landed?;
        self.residuals.set(residuals);
        Ok(blocked)
    }

    /// Whether this replica's steps leave their update in flight (`None` before its first
    /// step decided it).
    #[cfg(test)]
    pub(crate) fn overlaps(&self) -> Option<bool> {
        self.packs.as_ref().map(|(_, _, overlap)| *overlap)
    }

    /// Whether this replica's steps can leave their update in flight, or why not: the same
    /// answer on every replica of the group, which must issue the same collectives. Each
    /// reason is a fact of the model, its options, or the group's [`Placement`], never of the
    /// replica alone (a GPU replica cannot overlap, so no replica overlaps beside one).
    fn overlap_refused(&self, packs: &Packs) -> Option<&'static str> {
        if packs.len() < 2 {
            Some("its gradients make one pack (see bytes_per_pack)")
        } else if self.placement != Placement::AllOnCpus {
            Some("a replica of the group runs on a GPU")
        } else if self.net.synchronizes_replicas() {
            Some("its layers reduce across replicas inside the pass")
        } else if !self
            .optimizer
            .as_deref()
            .is_some_and(|o| o.applies_ranges() && o.clipping().is_per_variable())
        {
            Some("its optimizer or its clipping needs the whole step's gradients at once")
        } else {
            None
        }
    }

    /// This replica's own kernel threads, as many as rayon's global pool has (made once);
    /// `None` when they cannot start, and the step runs on the calling thread as before.
    fn kernel_threads(&self) -> Option<Arc<rayon::ThreadPool>> {
        let kernels = self.kernels.get_or_init(crate::kernel_threads::own_pool);
        kernels.as_ref().map(|k| Arc::clone(&k.pool))
    }

    /// Forward and backward on this replica's batch (none when it has run out of data), the
    /// all-reduce of gradients and totals, and the update every replica applies alike.
    ///
    /// Losses are summed per replica (each example's weighted by its sample weight) and the
    /// summed gradients divided by the number of examples in the whole step, so the update is
    /// the gradient of the mean loss over the global batch (Keras' `sum_over_batch_size`),
    /// exactly, also for a last batch that is short or missing on some replicas. The metrics'
    /// states travel in the same all-reduce.
    pub(crate) fn train_step(
        &mut self,
        batch: ReplicaBatch,
        objective: Objective<'_>,
        step: u64,
    ) -> Result<StepTotals, TrainError> {
        let started = Instant::now();
        let n = self.net.parameters().len();
        self.clear_sums(n, objective);
        if let Some(e) = self.landing_failed.take() {
            return Err(e);
        }
        if self.packs.is_none() {
            let options = self.link.options();
            let specs = self.net.parameters().specs();
            let packs = Packs::new(specs, options.bytes_per_pack);
            let wire = Wire::new(&options, self.link.world_size());
            let refused = self.overlap_refused(&packs);
            if let (true, Some(why)) = (options.overlap_update, refused) {
                tracing::info!(
                    reason = why,
                    "each step applies its whole update before it returns"
                );
            }
            let overlap = options.overlap_update && refused.is_none();
            let packs = if overlap {
                Packs::overlapping(specs, options.bytes_per_pack, self.link.processes() <= 2)
            } else {
                packs
            };
            self.packs = Some((Arc::new(packs), wire, overlap));
        }
        let Some((packs, wire, overlap)) = &self.packs else {
            return Err(not_compiled());
        };
        let (packs, wire, overlap) = (Arc::clone(packs), *wire, *overlap);
        let packs = &packs;
        if overlap {
            return self.overlapped_step(batch, objective, step, (packs, wire), started);
        }
        if self.on_device_state() {
            return self.train_step_on_device(batch, objective, step, (packs, wire), started);
        }
        let ctx =
            ForwardContext::training(step, self.link.replica_id()).with_replicas(&self.across);
        match batch.filter(|parts| !parts.targets.is_empty()) {
            // Several packs, and no collective inside the pass to keep in order with them: each
            // pack is reduced while the backward pass goes on.
            Some(parts) if packs.len() > 1 && !self.net.synchronizes_replicas() => {
                let forward = self.net.forward(&parts.inputs, ctx)?;
                let (value, totals) = objective.measure(&forward.output, &parts)?;
                let flight =
                    self.sum_during_backward((&forward, &value), &totals, (packs, wire))?;
                let waiting = Instant::now();
                let collected = flight.collect(&mut self.buffer[..n]);
                self.link.set_spinning(true);
                let (totals, residuals) = collected?;
                self.residuals.set(residuals);
                self.buffer[n..].copy_from_slice(&totals);
                let blocked = waiting.elapsed();
                let totals = self.update(n)?;
                self.waits.add_step(started.elapsed(), blocked);
                return Ok(totals);
            }
            Some(parts) => {
                let forward = self.net.forward(&parts.inputs, ctx)?;
                let (value, totals) = objective.measure(&forward.output, &parts)?;
                self.net
                    .gradients(&forward, &value.backward()?, &mut self.buffer[..n])?;
                for (slot, total) in self.buffer[n..].iter_mut().zip(totals) {
                    *slot = total as f32;
                }
            }
            // Layers that reduce across replicas inside the pass need every replica there: one
            // without data passes an empty batch, which adds nothing.
            None if self.net.synchronizes_replicas() => {
                let empty = empty_batch(&self.net)?;
                let forward = self.net.forward_inputs(&empty, ctx)?;
                let axes: Vec<usize> = (0..forward.output.rank()).collect();
                let nothing = lockstep_tensor::ops::sum(&forward.output, &axes, false)?;
                self.net
                    .gradients(&forward, &nothing.backward()?, &mut self.buffer[..n])?;
            }
            None => {}
        }
        self.sum_after_and_update((packs, wire), started, Duration::ZERO)
    }

    /// The end of a step whose gradients are in the buffer: [`packs::reduce_after`], the
    /// whole update, and the step's times (`blocked` already before the sums).
    fn sum_after_and_update(
        &mut self,
        (packs, wire): (&Packs, Wire),
        started: Instant,
        blocked: Duration,
    ) -> Result<StepTotals, TrainError> {
        let n = self.net.parameters().len();
        let reducing = Instant::now();
        let residuals = self.residuals.for_step(n, wire);
        packs::reduce_after(
            &mut self.link,
            &mut self.buffer,
            n,
            (packs, wire, residuals),
        )?;
        let blocked = blocked + reducing.elapsed();
        let totals = self.update(n)?;
        self.waits.add_step(started.elapsed(), blocked);
        Ok(totals)
    }

    /// [`Replica::train_step`] whose update is left in flight: the forward pass lands the last
    /// step's update layer by layer as it reaches each layer's variables, the backward pass
    /// hands each pack to the thread that sums it, and the step returns once the totals are
    /// summed (see `update_in_flight.rs`). A replica without data lands the last update, then
    /// issues the same collectives as the others, in the same order, and applies the whole
    /// update: the same values.
    fn overlapped_step(
        &mut self,
        batch: ReplicaBatch,
        objective: Objective<'_>,
        step: u64,
        (packs, wire): (&Arc<Packs>, Wire),
        started: Instant,
    ) -> Result<StepTotals, TrainError> {
        let n = self.net.parameters().len();
        let Some(parts) = batch.filter(|parts| !parts.targets.is_empty()) else {
            let landed = self.land_in_flight()?;
            // Landing used the buffer.
            self.clear_sums(n, objective);
            return self.sum_after_and_update((packs, wire), started, landed);
        };
        let ctx =
            ForwardContext::training(step, self.link.replica_id()).with_replicas(&self.across);
        let mut failure = None;
        let (in_flight, optimizer, buffer) =
            (&mut self.in_flight, &mut self.optimizer, &mut self.buffer);
        let inputs = std::slice::from_ref(&parts.inputs);
        let forward = self
            .net
            .forward_inputs_as_ready(inputs, ctx, &mut |values, params| {
                let (Some(flight), Some(optimizer)) =
                    (in_flight.as_mut(), optimizer.as_deref_mut())
                else {
                    return Ok(());
                };
                flight
                    .settle(values, params, optimizer, &mut buffer[..n])
                    .map_err(|e| {
                        let why = e.to_string();
                        failure = Some(e);
                        NnError::InvalidConfig {
                            layer: "step".into(),
                            why,
                        }
                    })
            });
        if let Some(e) = failure {
            return Err(e);
        }
        let forward = forward?;
        let mut blocked = self.land_in_flight()?;
        let (value, totals) = objective.measure(&forward.output, &parts)?;
        let mut flight = self.sum_during_backward((&forward, &value), &totals, (packs, wire))?;
        let totals = flight.totals()?;
        blocked += flight.take_blocked();
        self.in_flight = Some(flight);
        self.waits.add_step(started.elapsed(), blocked);
        Ok(StepTotals::from_values(
            totals.iter().map(|&v| f64::from(v)),
        ))
    }

    /// The backward pass of `loss`, each pack handed to this replica's communication thread
    /// as soon as the pass has finished it, to be summed in `packs`' order with `totals`
    /// (the collectives of [`packs::reduce_after`], overlapping the pass): the sums still in
    /// flight when the pass ends.
    fn sum_during_backward(
        &mut self,
        (forward, loss): (&Forward, &Tensor),
        totals: &[f64],
        (packs, wire): (&Arc<Packs>, Wire),
    ) -> Result<UpdateInFlight, TrainError> {
        let n = self.net.parameters().len();
        let totals: Vec<f32> = totals.iter().map(|&t| t as f32).collect();
        let residuals = self.residuals.take_for_step(n, wire);
        // The sums' waits leave the core to the passes.
        self.link.set_spinning(false);
        if self.pack_thread.is_none() {
            // A lone replica's kernel threads know their cores; replicas that share a process
            // run on threads of their own, and read rayon's.
            let cores = match self.kernels.get() {
                Some(Some(kernels)) => kernels.cores().copied(),
                _ => crate::kernel_threads::pinned_cores(),
            };
            self.pack_thread = Some(PackThread::start(cores)?);
        }
        let thread = self.pack_thread.as_ref().ok_or_else(not_compiled)?;
        // A piece's update applies as it lands where it cuts only trainable variables and
        // nothing is clipped (each value's update is then its own).
        let unclipped = (self.optimizer.as_deref()).is_some_and(|o| o.clipping().is_none());
        let specs = self.net.parameters().specs();
        let by_piece = packs.pieces_cut_only(specs, |spec| unclipped && spec.is_trainable());
        let (flight, to_flight) = UpdateInFlight::start(
            thread,
            self.link.pack_link(),
            Arc::clone(packs),
            wire,
            (totals, residuals),
            by_piece,
        )?;
        let mut arrivals = Arrivals::new(packs);
        let pass =
            self.net
                .gradients_streamed(forward, loss, &mut self.buffer[..n], &mut |out, range| {
                    for index in arrivals.arrived(packs, range) {
                        // A send fails only once the thread has stopped on an error, which
                        // waiting for the sums returns.
                        let values = out[packs.pieces[index].range.clone()].to_vec();
                        let _ = to_flight.send((index, values));
                    }
                });
        drop(to_flight);
        pass?;
        Ok(flight)
    }

    /// [`Replica::train_step`] on the device state: the passes and the update on the GPU with
    /// the variables and the optimizer's state already there; the gradients summed by NCCL on
    /// the device when the strategy gave this replica a communicator (the totals then over the
    /// CPU link), else read back and summed with the totals over the CPU link as on the CPU.
    fn train_step_on_device(
        &mut self,
        batch: ReplicaBatch,
        objective: Objective<'_>,
        step: u64,
        (packs, wire): (&Packs, Wire),
        started: Instant,
    ) -> Result<StepTotals, TrainError> {
        let n = self.net.parameters().len();
        let ctx =
            ForwardContext::training(step, self.link.replica_id()).with_replicas(&self.across);
        let state = self.resident.as_mut().ok_or_else(not_compiled)?;
        let mut totals = objective.empty_totals();
        match batch.filter(|parts| !parts.targets.is_empty()) {
            Some(parts) => {
                let mut measured = None;
                let inputs = std::slice::from_ref(&parts.inputs);
                let passes = state.gradients(&self.net, inputs, ctx, |output| {
                    let result = objective.measure(output, &parts);
                    let summed = result.as_ref().map(|(summed, _)| summed.clone());
                    let summed = summed.map_err(|e| NnError::InvalidConfig {
                        layer: "loss".into(),
                        why: e.to_string(),
                    });
                    measured = Some(result);
                    summed
                });
                match (passes, measured) {
                    (_, Some(Err(e))) => return Err(e),
                    (Err(e), _) => return Err(e.into()),
                    (Ok(_), Some(Ok((_, values)))) => totals = values,
                    (Ok(_), None) => {
                        return Err(TrainError::invalid("loss", "the step never computed it"));
                    }
                }
            }
            None => state.zero_gradients()?,
        }
        let reducing = Instant::now();
        let reduced: Vec<f32> = if self.link.uses_nccl() {
            if wire.compression != Compression::None {
                // NCCL sums the gradients where they are, in `f32`: said once, not ignored.
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        compression = ?wire.compression,
                        "these gradients are summed with NCCL, in f32: compression and error feedback apply only to steps that sum their gradients over the CPU links alone"
                    );
                });
            }
            // The totals first: a worker found gone here fails every replica of this process
            // together (the CPU's collectives tell each other), before any waits in NCCL.
            let mut values: Vec<f32> = totals.iter().map(|&v| v as f32).collect();
            self.link.all_reduce(&mut values, ReduceOp::Sum)?;
            let comm = self.link.nccl_mut().ok_or_else(not_compiled)?;
            state.all_reduce_gradients(comm)?;
            if self.link.nccl_within_process() {
                // NCCL summed this worker's GPUs; the first carries the sum to the other
                // workers over the ring and NCCL hands the total to the rest.
                if self.link.is_process_first() {
                    let (buffer, link) = (&mut self.buffer, &mut self.link);
                    let carried = (|| -> Result<(), TrainError> {
                        buffer.clear();
                        buffer.resize(n, 0.0);
                        state.download_gradients(buffer)?;
                        link.all_reduce_processes(buffer, ReduceOp::Sum)?;
                        state.upload_gradients(buffer)?;
                        Ok(())
                    })();
                    // The others wait in NCCL for this replica's broadcast: whatever stopped
                    // it must end their waits too.
                    if let Err(e) = carried {
                        self.link.tell_process_failed(&e);
                        return Err(e);
                    }
                }
                let comm = self.link.nccl_mut().ok_or_else(not_compiled)?;
                state.broadcast_gradients(comm, 0)?;
            }
            values
        } else {
            self.buffer.clear();
            self.buffer.resize(n + totals.len(), 0.0);
            state.download_gradients(&mut self.buffer[..n])?;
            for (slot, total) in self.buffer[n..].iter_mut().zip(&totals) {
                *slot = *total as f32;
            }
            let residuals = self.residuals.for_step(n, wire);
            packs::reduce_after(
                &mut self.link,
                &mut self.buffer,
                n,
                (packs, wire, residuals),
            )?;
            state.upload_gradients(&self.buffer[..n])?;
            self.buffer[n..].to_vec()
        };
        let blocked = reducing.elapsed();
        let totals = StepTotals::from_values(reduced.iter().map(|&v| f64::from(v)));
        if totals.examples > 0.0 {
            let optimizer = self.optimizer.as_ref().ok_or_else(not_compiled)?;
            state.scale_gradients((1.0 / totals.examples) as f32)?;
            state.update(optimizer.learning_rate())?;
            self.host_stale = true;
        }
        self.waits.add_step(started.elapsed(), blocked);
        Ok(totals)
    }

    /// The buffer as a replica without data sums it: `n` zero gradients and
    /// [`Objective::empty_totals`] (nothing but whether it has more data).
    fn clear_sums(&mut self, n: usize, objective: Objective<'_>) {
        self.buffer.clear();
        self.buffer.resize(n, 0.0);
        (self.buffer).extend(objective.empty_totals().iter().map(|&t| t as f32));
    }

    /// The step's update from the reduced buffer (gradients `..n`, then totals): every
    /// replica divides by the step's examples and applies the same update.
    fn update(&mut self, n: usize) -> Result<StepTotals, TrainError> {
        let totals = StepTotals::from_values(self.buffer[n..].iter().map(|&v| f64::from(v)));
        if totals.examples > 0.0 {
            let scale = (1.0 / totals.examples) as f32;
            for g in &mut self.buffer[..n] {
                *g *= scale;
            }
            let optimizer = self.optimizer.as_mut().ok_or_else(not_compiled)?;
            lockstep_nn::apply_update(
                &mut **optimizer,
                self.net.parameters_mut(),
                &mut self.buffer[..n],
                1.0,
            )?;
        }
        Ok(totals)
    }

    /// Loss and metrics of this replica's batch, summed over every replica.
    pub(crate) fn evaluate_batch(
        &mut self,
        batch: ReplicaBatch,
        objective: Objective<'_>,
    ) -> Result<StepTotals, TrainError> {
        // The collectives of an update in flight come before this batch's.
        self.land_in_flight()?;
        let mut totals = objective.empty_totals();
        if let Some(parts) = batch.filter(|parts| !parts.targets.is_empty()) {
            let output = self.net.predict(&parts.inputs)?;
            totals = objective.measure(&output, &parts)?.1;
        }
        self.link.all_reduce(&mut totals, ReduceOp::Sum)?;
        Ok(StepTotals::from_values(totals.into_iter()))
    }
}

/// A step's batches, one per replica of this process in replica order, `None` for a replica
/// past the end of a short last step; more batches than replicas is an error about `what`.
pub(crate) fn one_per_replica<B>(
    batches: Vec<B>,
    replicas: usize,
    what: &'static str,
) -> Result<Vec<Option<B>>, TrainError> {
    if batches.len() > replicas {
        return Err(TrainError::invalid(
            what,
            format!(
                "{} batches for {replicas} replicas in this process",
                batches.len()
            ),
        ));
    }
    let mut inputs: Vec<Option<B>> = batches.into_iter().map(Some).collect();
    inputs.resize_with(replicas, || None);
    Ok(inputs)
}

/// A batch of no examples for each of `net`'s inputs.
pub(crate) fn empty_batch(net: &Network) -> Result<Vec<Tensor>, TrainError> {
    net.input_shapes()
        .into_iter()
        .map(|shape| {
            let shape: Vec<usize> = std::iter::once(0).chain(shape.iter().copied()).collect();
            Ok(Tensor::from_vec(Vec::new(), &shape)?)
        })
        .collect()
}

pub(crate) fn not_compiled() -> TrainError {
    TrainError::invalid(
        "model",
        "compile it (optimizer, loss, metrics) before fit or evaluate",
    )
}

/// Runs `work` on every replica with its input, the first on this thread and the others on
/// threads of their own (their collectives meet in the middle); returns the first replica's
/// result, or the first error.
pub(crate) fn on_replicas<I, R>(
    replicas: &mut [Replica],
    inputs: Vec<I>,
    work: impl Fn(&mut Replica, I) -> Result<R, TrainError> + Sync,
) -> Result<R, TrainError>
where
    I: Send,
    R: Send,
{
    let mut results = on_every_replica(replicas, inputs, work)?;
    if results.is_empty() {
        return Err(TrainError::invalid("model", "it has no replicas"));
    }
    Ok(results.swap_remove(0))
}

/// [`on_replicas`], returning every replica's result in replica order.
pub(crate) fn on_every_replica<I, R>(
    replicas: &mut [Replica],
    inputs: Vec<I>,
    work: impl Fn(&mut Replica, I) -> Result<R, TrainError> + Sync,
) -> Result<Vec<R>, TrainError>
where
    I: Send,
    R: Send,
{
    if inputs.len() != replicas.len() {
        return Err(TrainError::invalid(
            "input",
            format!(
                "{} batches for {} replicas in this process",
                inputs.len(),
                replicas.len()
            ),
        ));
    }
    let mut inputs = inputs.into_iter();
    let Some((first, rest)) = replicas.split_first_mut() else {
        return Err(TrainError::invalid("model", "it has no replicas"));
    };
    let first_input = inputs
        .next()
        .ok_or_else(|| TrainError::invalid("input", "no batch for replica 0"))?;
    if rest.is_empty() {
        // A single replica runs its step on a thread of its own kernel pool
        // (`kernel_threads`: the Keras guide's MLP's step about three times faster inside). A
        // global pool's thread blocked in a collective may be the one another worker of the
        // same process needs, or may have stolen that worker's whole step while it waited in
        // a join (both deadlock).
        // A replica on a GPU only queues its kernels from the host: it runs on this thread,
        // sparing each step the two hand-offs between threads.
        let pool = if first.net.device() == Device::Cpu {
            first.kernel_threads()
        } else {
            None
        };
        let result = match pool {
            Some(pool) => pool.install(|| work(first, first_input)),
            None => work(first, first_input),
        };
        return result.map(|r| vec![r]);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .iter_mut()
            .zip(inputs)
            .map(|(replica, input)| scope.spawn(move || work(replica, input)))
            .collect();
        let result = work(first, first_input);
        let mut others = Ok(Vec::with_capacity(handles.len()));
        for (index, handle) in handles.into_iter().enumerate() {
            match handle.join() {
                Ok(Ok(value)) => {
                    if let Ok(values) = &mut others {
                        values.push(value);
                    }
                }
                Ok(Err(e)) => {
                    if others.is_ok() {
                        others = Err(e);
                    }
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(ToString::to_string)
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    others = Err(TrainError::ReplicaPanicked {
                        replica: index + 1,
                        message,
                    });
                }
            }
        }
        let value = result?;
        let mut values = others?;
        values.insert(0, value);
        Ok(values)
    })
}
