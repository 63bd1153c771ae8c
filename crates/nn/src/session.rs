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

use std::ops::Range;

use lockstep_cuda::nccl::NcclComm;
use lockstep_cuda::ops::{self as cuda, AdamStep};
use lockstep_cuda::{CudaBuffer, CudaDevice, CudaError};
use lockstep_tensor::{Device, Tensor, TensorError};

use crate::error::{InLayer, NnError};
use crate::layers::ForwardContext;
use crate::network::Network;
use crate::optimizers::{Optimizer, OptimizerConfig};

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
    Cuda(Box<Resident>),
    /// Written back already.
    Finished,
}

/// A model's parameters, gradients and optimizer state in one GPU's memory.
struct Resident {
    device: Device,
    values: CudaBuffer,
    grads: CudaBuffer,
    slots: Slots,
    /// Steps the optimizer has taken, this session's included.
    iterations: u64,
    /// Steps taken in this session.
    steps: u64,
}

/// The optimizer's state on the device, by update rule.
enum Slots {
    Sgd,
    Momentum {
        momentum: f32,
        nesterov: bool,
        velocity: CudaBuffer,
    },
    Adam {
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        m: CudaBuffer,
        v: CudaBuffer,
    },
}

impl Slots {
    /// The slots as the host optimizer names them ([`Optimizer::slots`]).
    fn named(&self) -> Vec<(&'static str, &CudaBuffer)> {
        match self {
            Self::Sgd => Vec::new(),
            Self::Momentum { velocity, .. } => vec![("momentum", velocity)],
            Self::Adam { m, v, .. } => vec![("m", m), ("v", v)],
        }
    }
}

/// Maps a GPU error to one naming what the session was doing.
fn on_gpu(device: Device, what: &'static str) -> impl Fn(CudaError) -> NnError {
    move |e| NnError::Tensor {
        layer: what.to_owned(),
        source: TensorError::Device {
            op: "training session",
            device,
            why: e.to_string(),
        },
    }
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
            Device::Cuda(_) if self.parameters().has_state() => {
                return Err(NnError::InvalidConfig {
                    layer: "training session".to_owned(),
                    why: "a training session on a GPU trains models without non-trainable state \
                          (batch normalization's moving statistics are updated on the CPU)"
                        .to_owned(),
                });
            }
            device @ Device::Cuda(ordinal) => {
                let failed = |what| on_gpu(device, what);
                let gpu = CudaDevice::open(ordinal).map_err(failed("opening the device"))?;
                let values = gpu
                    .upload(self.parameters().values())
                    .map_err(failed("parameters"))?;
                let grads = gpu
                    .zeros(self.parameters().len())
                    .map_err(failed("gradients"))?;
                let slots = upload_slots(&gpu, &*optimizer, self.parameters().len())?;
                State::Cuda(Box::new(Resident {
                    device,
                    values,
                    grads,
                    slots,
                    iterations: optimizer.iterations(),
                    steps: 0,
                }))
            }
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

/// The optimizer's slots on `gpu`: its saved values, or zeros before its first step.
fn upload_slots(gpu: &CudaDevice, optimizer: &dyn Optimizer, len: usize) -> Result<Slots, NnError> {
    let device = Device::Cuda(gpu.ordinal());
    let saved = optimizer.slots();
    let slot = |name: &'static str| -> Result<CudaBuffer, NnError> {
        let failed = on_gpu(device, "optimizer state");
        match saved
            .iter()
            .find(|(n, values)| *n == name && !values.is_empty())
        {
            None => gpu.zeros(len).map_err(failed),
            Some((_, values)) if values.len() == len => gpu.upload(values).map_err(failed),
            Some((_, values)) => Err(NnError::Length {
                what: "optimizer slots and parameters",
                left: values.len(),
                right: len,
            }),
        }
    };
    if optimizer.schedule().is_some() || !optimizer.clipping().is_none() {
        return Err(NnError::InvalidConfig {
            layer: optimizer.name().to_owned(),
            why: "a training session on a GPU runs optimizers without a schedule or clipping"
                .to_owned(),
        });
    }
    Ok(match optimizer.config() {
        OptimizerConfig::Sgd {
            momentum, nesterov, ..
        } if momentum != 0.0 => Slots::Momentum {
            momentum,
            nesterov,
            velocity: slot("momentum")?,
        },
        OptimizerConfig::Sgd { .. } => Slots::Sgd,
        OptimizerConfig::Adam {
            beta_1,
            beta_2,
            epsilon,
            ..
        } => Slots::Adam {
            beta_1,
            beta_2,
            epsilon,
            m: slot("m")?,
            v: slot("v")?,
        },
        other @ (OptimizerConfig::AdamW { .. }
        | OptimizerConfig::RmsProp { .. }
        | OptimizerConfig::Adagrad { .. }) => {
            let name = other.build().name();
            return Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: "a training session on a GPU runs SGD and Adam; this optimizer runs on the \
                      CPU"
                .to_owned(),
            });
        }
    })
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
                let value = resident.gradients(self.model, x, ctx, loss)?;
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
        let value = resident.gradients(self.model, x, ctx, loss)?;
        let failed = on_gpu(resident.device, "all-reduce of the gradients");
        comm.all_reduce_sum(&mut resident.grads).map_err(&failed)?;
        let ranks = comm.world_size();
        if ranks > 1 {
            resident.grads = cuda::scale(&resident.grads, 1.0 / ranks as f32).map_err(&failed)?;
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
            State::Cuda(resident) => {
                let variables = resident.variables(self.model, Tensor::from_cuda)?;
                let x = x.to_device(resident.device).in_layer("input")?;
                self.model.run(&x, &variables, ForwardContext::default())
            }
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
        if resident.steps == 0 {
            return Ok(());
        }
        let failed = |what| on_gpu(resident.device, what);
        let values = resident.values.to_host().map_err(failed("parameters"))?;
        let slots = resident
            .slots
            .named()
            .into_iter()
            .map(|(name, buffer)| Ok((name, buffer.to_host().map_err(failed(name))?)))
            .collect::<Result<Vec<_>, NnError>>()?;
        let params = self.model.parameters_mut().values_mut();
        if params.len() != values.len() {
            return Err(NnError::Length {
                what: "session parameters and model parameters",
                left: values.len(),
                right: params.len(),
            });
        }
        let slots: Vec<(&str, &[f32])> = slots.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        self.optimizer.restore(resident.iterations, &slots)?;
        params.copy_from_slice(&values);
        Ok(())
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

impl Resident {
    /// The model's variables cut out of the parameter buffer, made tensors by `make`.
    fn variables(
        &self,
        model: &Network,
        make: fn(CudaBuffer, &[usize]) -> Result<Tensor, TensorError>,
    ) -> Result<Vec<Tensor>, NnError> {
        model
            .parameters()
            .specs()
            .iter()
            .map(|spec| {
                let part = self
                    .values
                    .copy_range(spec.range())
                    .map_err(on_gpu(self.device, "parameters"))?;
                make(part, &spec.shape).in_layer(&spec.name)
            })
            .collect()
    }

    /// The forward and backward passes, leaving the gradients in the gradient buffer.
    fn gradients(
        &mut self,
        model: &Network,
        x: &Tensor,
        ctx: ForwardContext<'_>,
        loss: impl FnOnce(&Tensor) -> Result<Tensor, NnError>,
    ) -> Result<Tensor, NnError> {
        let variables = self.variables(model, Tensor::parameter_from_cuda)?;
        let x = x.to_device(self.device).in_layer("input")?;
        let output = model.run(&x, &variables, ctx)?;
        let value = loss(&output)?;
        let gradients = value.backward().in_layer("loss")?;
        let failed = on_gpu(self.device, "gradients");
        // Variables the loss does not depend on get no gradient: zero, as on the CPU.
        self.grads.fill_zero().map_err(&failed)?;
        for (spec, variable) in model.parameters().specs().iter().zip(&variables) {
            let Some(g) = gradients.get(variable) else {
                continue;
            };
            let g = g.to_device(self.device).in_layer(&spec.name)?;
            let buffer = g.cuda_buffer().ok_or_else(|| NnError::Tensor {
                layer: spec.name.clone(),
                source: TensorError::Device {
                    op: "training session",
                    device: self.device,
                    why: "the gradient was not left on the GPU".into(),
                },
            })?;
            check_fits(&spec.range(), buffer)?;
            self.grads.write_at(spec.offset, buffer).map_err(&failed)?;
        }
        Ok(value.detach())
    }

    /// The optimizer's update of the whole parameter buffer: one kernel.
    fn update(&mut self, learning_rate: f32) -> Result<(), NnError> {
        let failed = on_gpu(self.device, "optimizer update");
        let (values, grads) = (&mut self.values, &self.grads);
        match &mut self.slots {
            Slots::Sgd => cuda::sgd(values, grads, learning_rate),
            Slots::Momentum {
                momentum,
                nesterov,
                velocity,
            } => cuda::sgd_momentum(
                values,
                grads,
                velocity,
                (learning_rate, *momentum, *nesterov),
            ),
            Slots::Adam {
                beta_1,
                beta_2,
                epsilon,
                m,
                v,
            } => {
                // As the CPU's Adam computes it, in f64 on the host: no read-back.
                let t = (self.iterations + 1) as f64;
                let alpha = (f64::from(learning_rate) * (1.0 - f64::from(*beta_2).powf(t)).sqrt()
                    / (1.0 - f64::from(*beta_1).powf(t))) as f32;
                let step = AdamStep {
                    alpha,
                    beta_1: *beta_1,
                    beta_2: *beta_2,
                    epsilon: *epsilon,
                };
                cuda::adam(values, grads, (m, v), step)
            }
        }
        .map_err(failed)?;
        self.iterations += 1;
        self.steps += 1;
        Ok(())
    }
}

/// A gradient holds as many values as its variable.
fn check_fits(range: &Range<usize>, gradient: &CudaBuffer) -> Result<(), NnError> {
    if range.len() == gradient.len() {
        Ok(())
    } else {
        Err(NnError::Length {
            what: "a gradient and its variable",
            left: gradient.len(),
            right: range.len(),
        })
    }
}
