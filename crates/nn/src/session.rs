//! `TrainingSession`: training steps whose parameters, gradients and optimizer state stay on
//! the model's device from one step to the next.
//!
//! On the CPU a step is the loop every trainer writes (forward, loss, backward, gradients into
//! the flat buffer, optimizer update). On a GPU the session keeps the model's flat parameter
//! buffer, a flat gradient buffer and the optimizer's slots in GPU memory: a step cuts each
//! variable out of the parameter buffer on the device, copies each gradient into the gradient
//! buffer on the device and updates the parameters with one optimizer kernel, so nothing
//! crosses to the host but the batch going in and the loss, when the caller reads it. The
//! model and the optimizer get their values back when the session finishes.

use lockstep_cuda::nccl::NcclComm;
use lockstep_tensor::{Device, Tensor};

use crate::device_state::DeviceState;
use crate::error::{InLayer, NnError};
use crate::layers::ForwardContext;
use crate::network::Network;
use crate::optimizers::Optimizer;

/// Training steps of one model with one optimizer on the model's device, as a framework's
/// training loop runs them: on a GPU the parameters, gradients and optimizer state stay there
/// between steps and a step reads nothing back.
///
/// The session borrows the model and the optimizer, so nothing can read their stale host
/// copies meanwhile; [`TrainingSession::finish`] (or dropping the session) writes the values
/// back into both.
///
/// ```
/// use lockstep_nn::{Adam, ForwardContext, Reduction, SparseCategoricalCrossentropy, models};
/// use lockstep_tensor::{Device, Tensor};
///
/// let mut model = models::mnist_cnn(0)?;
/// // On the GPU when there is one, else on the CPU: the same code below.
/// model = model.to_device(Device::Cuda(0)).unwrap_or_else(|(cpu, _)| cpu);
/// let mut adam = Adam::default();
/// let loss_fn = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::SumOverBatchSize };
/// let (x, labels) = (Tensor::full(&[8, 28, 28, 1], 0.5).unwrap(), vec![3_usize; 8]);
///
/// let mut session = model.training(&mut adam)?;
/// let mut first = None;
/// for step in 0..5 {
///     let ctx = ForwardContext::training(step, 0);
///     let loss = session.step(&x, ctx, |logits| loss_fn.call(logits, &labels))?;
///     // Reading the loss is the step's only copy back from a GPU: skip it to keep the GPU busy.
///     let loss = loss.item().unwrap();
///     assert!(loss <= *first.get_or_insert(loss));
/// }
/// session.finish()?;
/// assert_eq!(adam.iterations(), 5);
/// # use lockstep_nn::Optimizer;
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
pub struct TrainingSession<'m> {
    model: &'m mut Network,
    optimizer: &'m mut dyn Optimizer,
    state: State,
}

enum State {
    /// The model's own buffers, in host memory; gradients gathered here.
    Host { grads: Vec<f32> },
    /// Copies on a GPU, written back when the session ends.
    Cuda(Box<DeviceState>),
    /// Written back already.
    Finished,
}

impl Network {
    /// Starts training steps on the model's device with `optimizer` (see [`TrainingSession`]).
    ///
    /// # Errors
    ///
    /// On a GPU: when the parameters or the optimizer's state cannot be copied there, or the
    /// optimizer's state is laid out for another model.
    pub fn training<'m>(
        &'m mut self,
        optimizer: &'m mut dyn Optimizer,
    ) -> Result<TrainingSession<'m>, NnError> {
        let state = match self.device() {
            Device::Cuda(_) => State::Cuda(Box::new(DeviceState::new(self, &*optimizer)?)),
            _ => State::Host {
                grads: vec![0.0; self.parameters().len()],
            },
        };
        Ok(TrainingSession {
            model: self,
            optimizer,
            state,
        })
    }
}

impl TrainingSession<'_> {
    /// One training step on batch `x`: the forward pass, `loss` of the model's output, the
    /// backward pass and the optimizer's update. Returns the loss, detached, on the model's
    /// device: reading it ([`Tensor::item`]) is what waits for the GPU.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the model's input shape, a layer or the loss fails, or the
    /// device does.
    pub fn step(
        &mut self,
        x: &Tensor,
        ctx: ForwardContext<'_>,
        loss: impl FnOnce(&Tensor) -> Result<Tensor, NnError>,
    ) -> Result<Tensor, NnError> {
        match &mut self.state {
            State::Host { grads } => {
                let forward = self.model.forward(x, ctx)?;
                let value = loss(&forward.output)?;
                let gradients = value.backward().in_layer("loss")?;
                self.model.gradients(&forward, &gradients, grads)?;
                let examples = x.shape().first().copied().unwrap_or(0).max(1);
                crate::optimizers::apply_update(
                    &mut *self.optimizer,
                    self.model.parameters_mut(),
                    grads,
                    1.0 / examples as f32,
                )?;
                Ok(value.detach())
            }
            State::Cuda(resident) => {
                let value = resident.gradients(self.model, std::slice::from_ref(x), ctx, loss)?;
                resident.update(self.optimizer.learning_rate())?;
                Ok(value)
            }
            State::Finished => Err(NnError::InvalidConfig {
                layer: "training session".into(),
                why: "the session has finished".into(),
            }),
        }
    }

    /// [`TrainingSession::step`] as one replica of several, one per GPU: after the backward
    /// pass the gradient buffer is summed over every rank of `comm` on the device (one NCCL
    /// call on the device's stream, between the backward pass and the update), divided by the
    /// number of ranks, and every rank applies the same update. Each rank's `loss` is the mean
    /// over its own batch, so with batches of one size the update is the mean over all of them,
    /// as PyTorch's `DistributedDataParallel` averages. Nothing is read back.
    ///
    /// With one rank the step is [`TrainingSession::step`], bit for bit.
    ///
    /// # Errors
    ///
    /// As [`TrainingSession::step`]; a session on the CPU (NCCL sums GPU buffers) or on another
    /// GPU than `comm`'s; the all-reduce's error, a timeout or a lost peer among them (the
    /// parameters are then left as they were before the step).
    pub fn step_all_reduced(
        &mut self,
        x: &Tensor,
        ctx: ForwardContext<'_>,
        loss: impl FnOnce(&Tensor) -> Result<Tensor, NnError>,
        comm: &mut NcclComm,
    ) -> Result<Tensor, NnError> {
        let State::Cuda(resident) = &mut self.state else {
            return Err(NnError::InvalidConfig {
                layer: "training session".into(),
                why: "NCCL all-reduces GPU buffers: this session runs on the CPU or has finished"
                    .into(),
            });
        };
        let value = resident.gradients(self.model, std::slice::from_ref(x), ctx, loss)?;
        resident.all_reduce_gradients(comm)?;
        let ranks = comm.world_size();
        if ranks > 1 {
            resident.scale_gradients(1.0 / ranks as f32)?;
        }
        resident.update(self.optimizer.learning_rate())?;
        Ok(value)
    }

    /// Inference with the session's current parameters, where they are (no copy back).
    ///
    /// # Errors
    ///
    /// As [`Network::predict`].
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, NnError> {
        match &self.state {
            State::Cuda(resident) => resident.predict(self.model, x),
            State::Host { .. } | State::Finished => self.model.predict(x),
        }
    }

    /// Changes the optimizer's step size (a learning-rate schedule) from the next step on.
    pub fn set_learning_rate(&mut self, learning_rate: f32) {
        self.optimizer.set_learning_rate(learning_rate);
    }

    /// Writes the parameters and the optimizer's state back into the model and the optimizer
    /// (a copy from the GPU when the session ran there).
    ///
    /// # Errors
    ///
    /// When the copy back fails; the model and optimizer then keep their values from before
    /// the session.
    pub fn finish(mut self) -> Result<(), NnError> {
        self.write_back()
    }

    fn write_back(&mut self) -> Result<(), NnError> {
        let State::Cuda(resident) = std::mem::replace(&mut self.state, State::Finished) else {
            return Ok(());
        };
        resident.write_back(self.model, &mut *self.optimizer)
    }
}

impl Drop for TrainingSession<'_> {
    /// A session dropped without [`TrainingSession::finish`] still writes its values back; an
    /// error here can only be logged.
    fn drop(&mut self) {
        if let Err(e) = self.write_back() {
            tracing::error!(error = %e, "a training session could not write its values back");
        }
    }
}
