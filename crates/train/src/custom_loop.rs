//! A custom training loop under a strategy, as TensorFlow's custom-training-loop tutorials
//! write one: [`Model::run`] (`strategy.run`) calls a step function on every replica of this
//! process with its part of the step's batch and a [`ReplicaContext`] — the forward pass,
//! the gradients (`GradientTape.gradient`), [`ReplicaContext::apply_gradients`]
//! (`optimizer.apply_gradients`, which sums them over every replica of every worker first),
//! and all-reduce and all-gather inside the step — and [`Model::reduce`] (`strategy.reduce`)
//! combines what the replicas returned, across every worker.
//!
//! The same loop runs under [`OneDeviceStrategy`](crate::OneDeviceStrategy),
//! [`MirroredStrategy`](crate::MirroredStrategy) and
//! [`MultiWorkerMirroredStrategy`](crate::MultiWorkerMirroredStrategy). A step that sums its
//! examples' losses, takes their gradients and applies them is `fit`'s step, term for term:
//! with the same seeds and global batch, the weights end bit-identical to `fit`'s (with up to
//! two replicas per process and two processes, where a sum's order cannot differ; with more,
//! the extra values riding in `fit`'s all-reduce can move where a ring splits the buffer).
//!
//! ```
//! use lockstep_collective::ReduceOp;
//! use lockstep_nn::{Adam, Reduction, SparseCategoricalCrossentropy, models};
//! use lockstep_tensor::Tensor;
//! use lockstep_train::{MirroredStrategy, Model};
//!
//! let mut model = Model::new(MirroredStrategy::new(2)?, || models::mnist_mlp(7))?;
//! model.set_optimizer(Adam::default());
//! // Each replica sums its examples' losses; `apply_gradients` divides by the global batch.
//! let loss = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::Sum };
//! // One step: each replica's batch of 2 images and their labels.
//! let batches: Vec<(Tensor, Vec<usize>)> = (0..2)
//!     .map(|r| Ok((Tensor::from_vec(vec![0.1 * r as f32; 2 * 784], &[2, 784])?, vec![r, 3])))
//!     .collect::<Result<_, lockstep_tensor::TensorError>>()?;
//! let losses = model.run(batches, |replica, batch| {
//!     let (x, y) = batch.expect("every replica has a batch here");
//!     let forward = replica.forward(&x)?;
//!     let summed = loss.call(&forward.output, &y)?;
//!     let gradients = replica.gradients(&forward, &summed, y.len())?;
//!     replica.apply_gradients(gradients, &mut [])?; // summed over replicas, ÷ 4 examples
//!     Ok(f64::from(summed.item()?))
//! })?;
//! let mean_loss = model.reduce(ReduceOp::Sum, &losses)? / 4.0;
//! assert!(mean_loss.is_finite());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use lockstep_collective::ReduceOp;
use lockstep_nn::{Forward, ForwardContext, Network, Optimizer};

use lockstep_tensor::Tensor;

use crate::error::TrainError;
use crate::model::Model;
use crate::replica::{Replica, empty_batch, on_every_replica, one_per_replica};

/// The gradients of a replica's summed loss with respect to every variable of the network,
/// flat in the order of its parameters, and the number of examples whose losses were summed.
/// (Non-trainable variables, such as batch normalization's moving statistics, hold what the
/// forward pass observed, which `apply_gradients` moves them towards, as `fit` does.)
#[derive(Debug, Clone, PartialEq)]
pub struct VariableGradients {
    values: Vec<f32>,
    examples: usize,
}

impl VariableGradients {
    /// The flat gradients (to clip or scale them before they are applied).
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The flat gradients, to change in place.
    pub fn values_mut(&mut self) -> &mut [f32] {
        &mut self.values
    }

    /// The examples whose summed loss these are the gradients of.
    pub fn examples(&self) -> usize {
        self.examples
    }
}

/// One replica's view of a step in [`Model::run`]: its network, its place among the replicas,
/// and the collectives it takes part in. Every replica of every worker must make the same
/// collective calls in the same order (`apply_gradients`, `all_reduce`, `all_gather`), as in
/// TensorFlow.
pub struct ReplicaContext<'a> {
    replica: &'a mut Replica,
    step: u64,
    in_sync: usize,
}

impl ReplicaContext<'_> {
    /// This replica's index among all replicas in sync (`replica_id_in_sync_group`).
    pub fn replica_id(&self) -> usize {
        self.replica.link.replica_id()
    }

    /// Replicas across all workers that run the step.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.in_sync
    }

    /// The step's number, from 0 for the model's first `run` (dropout's seeds follow it).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// This replica's network.
    pub fn network(&self) -> &Network {
        &self.replica.net
    }

    /// The forward pass in training mode (dropout on, batch statistics), recorded so that
    /// [`ReplicaContext::gradients`] can take its gradients: the `GradientTape`'s scope.
    ///
    /// # Errors
    ///
    /// When the input does not fit the network, or a synchronised layer's collective fails.
    pub fn forward(&self, x: &Tensor) -> Result<Forward, TrainError> {
        self.forward_inputs(std::slice::from_ref(x))
    }

    /// [`ReplicaContext::forward`] with one tensor per input of the network.
    ///
    /// # Errors
    ///
    /// As [`ReplicaContext::forward`].
    pub fn forward_inputs(&self, xs: &[Tensor]) -> Result<Forward, TrainError> {
        let ctx = ForwardContext::training(self.step, self.replica_id())
            .with_replicas(&self.replica.across);
        Ok(self.replica.net.forward_inputs(xs, ctx)?)
    }

    /// The gradients of `loss`, a scalar computed from `forward`'s outputs, with respect to
    /// every variable: `tape.gradient(loss, model.trainable_variables)`. `examples` is the
    /// number of examples whose losses `loss` sums: [`ReplicaContext::apply_gradients`]
    /// divides by their total over every replica, so that the update is the gradient of the
    /// mean loss over the global batch, as `fit` applies it.
    ///
    /// # Errors
    ///
    /// When `loss` is not a scalar or was not computed from this forward pass.
    pub fn gradients(
        &self,
        forward: &Forward,
        loss: &Tensor,
        examples: usize,
    ) -> Result<VariableGradients, TrainError> {
        let mut values = vec![0.0_f32; self.replica.net.parameters().len()];
        self.replica
            .net
            .gradients(forward, &loss.backward()?, &mut values)?;
        Ok(VariableGradients { values, examples })
    }

    /// What a replica without data in this step contributes: no gradient and no examples.
    /// A network that reduces across replicas inside its forward pass (a synchronised batch
    /// normalization) runs an empty batch, so that its collectives meet the others'.
    ///
    /// # Errors
    ///
    /// When the empty pass fails.
    pub fn no_gradients(&self) -> Result<VariableGradients, TrainError> {
        let net = &self.replica.net;
        let mut values = vec![0.0_f32; net.parameters().len()];
        if net.synchronizes_replicas() {
            let forward = self.forward_inputs(&empty_batch(net)?)?;
            let axes: Vec<usize> = (0..forward.output.rank()).collect();
            let nothing = lockstep_tensor::ops::sum(&forward.output, &axes, false)?;
            net.gradients(&forward, &nothing.backward()?, &mut values)?;
        }
        Ok(VariableGradients {
            values,
            examples: 0,
        })
    }

    /// `optimizer.apply_gradients`: sums `gradients` and their examples over every replica of
    /// every worker in one all-reduce (with `extra`, values of the loop's own such as a
    /// summed loss or metric states, summed in the same collective and written back), divides
    /// the gradients by the total examples, and applies the optimizer's update, the same on
    /// every replica. Returns the total examples; with none, nothing is applied.
    ///
    /// # Errors
    ///
    /// When no optimizer is set ([`Model::set_optimizer`] or `compile`), the gradients are not
    /// this network's, or the all-reduce fails.
    pub fn apply_gradients(
        &mut self,
        gradients: VariableGradients,
        extra: &mut [f64],
    ) -> Result<f64, TrainError> {
        let n = self.replica.net.parameters().len();
        if gradients.values.len() != n {
            return Err(TrainError::invalid(
                "apply_gradients",
                format!(
                    "{} gradients for a network of {n} parameters",
                    gradients.values.len()
                ),
            ));
        }
        let mut buffer = gradients.values;
        buffer.push(gradients.examples as f32);
        buffer.extend(extra.iter().map(|&v| v as f32));
        self.replica.link.all_reduce(&mut buffer, ReduceOp::Sum)?;
        let examples = f64::from(buffer[n]);
        for (value, &summed) in extra.iter_mut().zip(&buffer[n + 1..]) {
            *value = f64::from(summed);
        }
        if examples > 0.0 {
            let scale = (1.0 / examples) as f32;
            for g in &mut buffer[..n] {
                *g *= scale;
            }
            let optimizer = self.replica.optimizer.as_mut().ok_or_else(|| {
                TrainError::invalid(
                    "apply_gradients",
                    "no optimizer: set one with `Model::set_optimizer` (or `compile`) first",
                )
            })?;
            lockstep_nn::apply_update(
                &mut **optimizer,
                self.replica.net.parameters_mut(),
                &mut buffer[..n],
                1.0,
            )?;
        }
        Ok(examples)
    }

    /// Reduces `values` elementwise over every replica of every worker, in place.
    ///
    /// # Errors
    ///
    /// When the collective fails (replicas that pass different lengths fail it).
    pub fn all_reduce(&mut self, values: &mut [f32], op: ReduceOp) -> Result<(), TrainError> {
        Ok(self.replica.link.all_reduce(values, op)?)
    }

    /// Every replica's `values`, one after another in replica order (`all_gather` along
    /// axis 0). Every replica must pass as many values; a `-0.0` comes back as `0.0`.
    ///
    /// # Errors
    ///
    /// When replicas pass different lengths (every replica gets the error), or a collective
    /// fails.
    pub fn all_gather(&mut self, values: &[f32]) -> Result<Vec<f32>, TrainError> {
        let len = values.len();
        let mut bounds = [len as f64, -(len as f64)];
        self.replica.link.all_reduce(&mut bounds, ReduceOp::Max)?;
        if bounds[0] != -bounds[1] {
            return Err(TrainError::invalid(
                "all_gather",
                format!(
                    "replicas gathered between {} and {} values; each must give as many",
                    -bounds[1], bounds[0]
                ),
            ));
        }
        // Each replica writes its values into its own slot of zeros; the sum is the gather.
        let mut gathered = vec![0.0_f32; len * self.in_sync];
        let at = self.replica_id() * len;
        gathered[at..at + len].copy_from_slice(values);
        self.replica.link.all_reduce(&mut gathered, ReduceOp::Sum)?;
        Ok(gathered)
    }
}

impl Model {
    /// Sets the optimizer of a custom loop (each replica gets a copy), without the loss and
    /// metrics `compile` also sets.
    pub fn set_optimizer<O: Optimizer + Clone + 'static>(&mut self, optimizer: O) {
        let mut copies = vec![optimizer; self.replicas.len()];
        for replica in self.replicas.iter_mut().rev() {
            if let Some(copy) = copies.pop() {
                replica.set_optimizer(Box::new(copy));
            }
        }
    }

    /// `strategy.run`: calls `step` on every replica of this process, each with its batch of
    /// `batches` (one per replica, in replica order; a replica past the end of a short last
    /// step gets `None`), the first on this thread and the others on threads of their own,
    /// and returns what each returned, in replica order.
    ///
    /// Every worker must run the same steps. A worker whose part of a distributed dataset has
    /// run out (the last global batch may reach only some) keeps calling `run` with no
    /// batches until a step in which no replica of any worker had data (`apply_gradients`
    /// returns zero examples). (`fit` ends one step sooner: each of its steps' totals say
    /// whether any replica has data for another.)
    ///
    /// # Errors
    ///
    /// More batches than replicas, or the first error a replica's `step` returned.
    pub fn run<B, R>(
        &mut self,
        batches: Vec<B>,
        step: impl Fn(&mut ReplicaContext<'_>, Option<B>) -> Result<R, TrainError> + Sync,
    ) -> Result<Vec<R>, TrainError>
    where
        B: Send,
        R: Send,
    {
        let inputs = one_per_replica(batches, self.replicas.len(), "run")?;
        let (number, in_sync) = (self.steps_run, self.num_replicas_in_sync());
        let results = on_every_replica(&mut self.replicas, inputs, |replica, batch| {
            let mut ctx = ReplicaContext {
                replica,
                step: number,
                in_sync,
            };
            step(&mut ctx, batch)
        })?;
        self.steps_run += 1;
        Ok(results)
    }

    /// `strategy.reduce(op, per_replica, axis=None)`: one value per replica of this process
    /// (what [`Model::run`] returned), combined over every replica of every worker; `Mean`
    /// divides the sum by the replicas in sync. Every worker gets the same value.
    ///
    /// # Errors
    ///
    /// When `per_replica` does not hold one value per replica, or the collective fails.
    pub fn reduce(&mut self, op: ReduceOp, per_replica: &[f64]) -> Result<f64, TrainError> {
        let columns: Vec<Vec<f64>> = per_replica.iter().map(|&v| vec![v]).collect();
        Ok(self.reduce_each(op, &columns)?[0])
    }

    /// [`Model::reduce`] elementwise over equal-length vectors (metric states, say).
    ///
    /// # Errors
    ///
    /// As [`Model::reduce`], and when the vectors differ in length.
    pub fn reduce_each(
        &mut self,
        op: ReduceOp,
        per_replica: &[Vec<f64>],
    ) -> Result<Vec<f64>, TrainError> {
        if per_replica.len() != self.replicas.len() {
            return Err(TrainError::invalid(
                "reduce",
                format!(
                    "{} values for {} replicas in this process",
                    per_replica.len(),
                    self.replicas.len()
                ),
            ));
        }
        let len = per_replica.first().map_or(0, Vec::len);
        if per_replica.iter().any(|v| v.len() != len) {
            return Err(TrainError::invalid(
                "reduce",
                "the replicas' values differ in length",
            ));
        }
        let cross = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        let mut local = per_replica[0].clone();
        for values in &per_replica[1..] {
            cross.combine(&mut local, values);
        }
        self.replicas[0]
            .link
            .all_reduce_processes(&mut local, cross)?;
        if op == ReduceOp::Mean {
            let replicas = self.num_replicas_in_sync() as f64;
            for v in &mut local {
                *v /= replicas;
            }
        }
        Ok(local)
    }
}
