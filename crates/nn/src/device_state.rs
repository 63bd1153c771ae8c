//! `DeviceState`: a model's flat parameter, gradient and optimizer-slot buffers kept in one
//! GPU's memory between training steps (invariant 8 of `docs/ARCHITECTURE.md`).

use std::ops::Range;

use lockstep_cuda::nccl::NcclComm;
use lockstep_cuda::ops::{self as cuda, AdamStep};
use lockstep_cuda::{CudaBuffer, CudaDevice, CudaError};
use lockstep_tensor::{Device, Tensor, TensorError};

use crate::error::{InLayer, NnError};
use crate::layers::ForwardContext;
use crate::network::Network;
use crate::optimizers::{Optimizer, OptimizerConfig};

/// A model's parameters, gradients and optimizer state in one GPU's memory, between the
/// training steps of a [`TrainingSession`](crate::TrainingSession) or of a replica of a
/// strategy: a step runs the passes with the variables cut out of the parameter buffer, leaves
/// the gradients in one flat buffer (which an all-reduce may sum in place) and updates every
/// parameter with one optimizer kernel; [`DeviceState::write_back`] copies the values and the
/// optimizer's state into the host model and optimizer.
pub struct DeviceState {
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

impl DeviceState {
    /// Copies `model`'s parameters and `optimizer`'s state to the model's GPU, with a zeroed
    /// gradient buffer.
    ///
    /// # Errors
    ///
    /// When the model is not on a GPU, has non-trainable state (batch normalization's moving
    /// statistics are updated on the CPU), the optimizer is not SGD (with or without momentum)
    /// or Adam without a schedule or clipping, or the copies fail.
    pub fn new(model: &Network, optimizer: &dyn Optimizer) -> Result<Self, NnError> {
        let Device::Cuda(ordinal) = model.device() else {
            return Err(NnError::InvalidConfig {
                layer: "device state".to_owned(),
                why: format!("the model runs on {}, not a GPU", model.device()),
            });
        };
        if model.parameters().has_state() {
            return Err(NnError::InvalidConfig {
                layer: "training session".to_owned(),
                why: "a training session on a GPU trains models without non-trainable state \
                      (batch normalization's moving statistics are updated on the CPU)"
                    .to_owned(),
            });
        }
        let device = model.device();
        let failed = |what| on_gpu(device, what);
        let gpu = CudaDevice::open(ordinal).map_err(failed("opening the device"))?;
        let slots = upload_slots(&gpu, optimizer, model.parameters().len())?;
        let values = gpu
            .upload(model.parameters().values())
            .map_err(failed("parameters"))?;
        let grads = gpu
            .zeros(model.parameters().len())
            .map_err(failed("gradients"))?;
        Ok(Self {
            device,
            values,
            grads,
            slots,
            iterations: optimizer.iterations(),
            steps: 0,
        })
    }

    /// The GPU the buffers are on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Steps taken since the state was made.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sums the gradient buffer over every rank of `comm`, in place, on the device.
    ///
    /// # Errors
    ///
    /// NCCL's error, a timeout or a lost peer among them.
    pub fn all_reduce_gradients(&mut self, comm: &mut NcclComm) -> Result<(), NnError> {
        comm.all_reduce_sum(&mut self.grads)
            .map_err(on_gpu(self.device, "all-reduce of the gradients"))
    }

    /// Gives every rank of `comm` the gradient buffer of rank `root`, on the device: after
    /// `root` alone brought in the sums from beyond the group (the other workers' over the
    /// network).
    ///
    /// # Errors
    ///
    /// NCCL's error, a timeout or a lost peer among them.
    pub fn broadcast_gradients(&mut self, comm: &mut NcclComm, root: usize) -> Result<(), NnError> {
        comm.broadcast(&mut self.grads, root)
            .map_err(on_gpu(self.device, "broadcast of the gradients"))
    }

    /// Multiplies every gradient by `factor`.
    ///
    /// # Errors
    ///
    /// The device's error.
    pub fn scale_gradients(&mut self, factor: f32) -> Result<(), NnError> {
        cuda::scale_in_place(&mut self.grads, factor).map_err(on_gpu(self.device, "gradients"))
    }

    /// Sets every gradient to zero: a replica without data in a step adds nothing.
    ///
    /// # Errors
    ///
    /// The device's error.
    pub fn zero_gradients(&mut self) -> Result<(), NnError> {
        self.grads
            .fill_zero()
            .map_err(on_gpu(self.device, "gradients"))
    }

    /// Copies the gradient buffer into `host` (as long as the buffer): what an all-reduce over
    /// the CPU's transports sends.
    ///
    /// # Errors
    ///
    /// Another length; the device's error.
    pub fn download_gradients(&self, host: &mut [f32]) -> Result<(), NnError> {
        if host.len() != self.grads.len() {
            return Err(NnError::Length {
                what: "host gradients and the device's",
                left: host.len(),
                right: self.grads.len(),
            });
        }
        let values = self
            .grads
            .to_host()
            .map_err(on_gpu(self.device, "gradients"))?;
        host.copy_from_slice(&values);
        Ok(())
    }

    /// Replaces the gradient buffer with `host`'s values (the sums an all-reduce over the
    /// CPU's transports brought back).
    ///
    /// # Errors
    ///
    /// Another length; the device's error.
    pub fn upload_gradients(&mut self, host: &[f32]) -> Result<(), NnError> {
        if host.len() != self.grads.len() {
            return Err(NnError::Length {
                what: "host gradients and the device's",
                left: host.len(),
                right: self.grads.len(),
            });
        }
        self.grads
            .write_from_host(host)
            .map_err(on_gpu(self.device, "gradients"))
    }

    /// Inference with the current parameters, where they are (no copy back of them).
    ///
    /// # Errors
    ///
    /// As [`Network::predict`].
    pub fn predict(&self, model: &Network, x: &Tensor) -> Result<Tensor, NnError> {
        let variables = self.variables(model, Tensor::from_cuda)?;
        let x = x.to_device(self.device).in_layer("input")?;
        model.run(&x, &variables, ForwardContext::default())
    }

    /// Inference on one tensor per input, with the current parameters: every output.
    ///
    /// # Errors
    ///
    /// As [`Network::predict_inputs`].
    pub fn predict_inputs(&self, model: &Network, xs: &[Tensor]) -> Result<Vec<Tensor>, NnError> {
        let variables = self.variables(model, Tensor::from_cuda)?;
        let xs = xs
            .iter()
            .map(|x| x.to_device(self.device).in_layer("input"))
            .collect::<Result<Vec<_>, _>>()?;
        model.run_inputs(&xs, &variables, ForwardContext::default())
    }

    /// Copies the parameters and the optimizer's state back into `model` and `optimizer`
    /// (nothing when no step was taken).
    ///
    /// # Errors
    ///
    /// When the copy fails or the model is another; the model and optimizer then keep their
    /// values.
    pub fn write_back(
        &self,
        model: &mut Network,
        optimizer: &mut dyn Optimizer,
    ) -> Result<(), NnError> {
        if self.steps == 0 {
            return Ok(());
        }
        let failed = |what| on_gpu(self.device, what);
        let values = self.values.to_host().map_err(failed("parameters"))?;
        let slots = self
            .slots
            .named()
            .into_iter()
            .map(|(name, buffer)| Ok((name, buffer.to_host().map_err(failed(name))?)))
            .collect::<Result<Vec<_>, NnError>>()?;
        let params = model.parameters_mut().values_mut();
        if params.len() != values.len() {
            return Err(NnError::Length {
                what: "device parameters and model parameters",
                left: values.len(),
                right: params.len(),
            });
        }
        let slots: Vec<(&str, &[f32])> = slots.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        optimizer.restore(self.iterations, &slots)?;
        params.copy_from_slice(&values);
        Ok(())
    }
}

impl DeviceState {
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

    /// The forward pass on `xs` (one tensor per input of `model`, moved to the GPU), `loss`
    /// of the (first) output and the backward pass, leaving the gradients in the gradient
    /// buffer; returns the loss, detached, on the GPU.
    ///
    /// # Errors
    ///
    /// When the inputs do not fit the model, a layer or the loss fails, or the device does.
    pub fn gradients(
        &mut self,
        model: &Network,
        xs: &[Tensor],
        ctx: ForwardContext<'_>,
        loss: impl FnOnce(&Tensor) -> Result<Tensor, NnError>,
    ) -> Result<Tensor, NnError> {
        let variables = self.variables(model, Tensor::parameter_from_cuda)?;
        let xs = xs
            .iter()
            .map(|x| x.to_device(self.device).in_layer("input"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outputs = model.run_inputs(&xs, &variables, ctx)?;
        if outputs.is_empty() {
            return Err(NnError::InvalidConfig {
                layer: "device state".into(),
                why: "the model has no output".into(),
            });
        }
        let output = outputs.swap_remove(0);
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

    /// The optimizer's update of the whole parameter buffer with the gradient buffer as it
    /// stands (scaled and summed as the caller wants): one kernel.
    ///
    /// # Errors
    ///
    /// The device's error.
    pub fn update(&mut self, learning_rate: f32) -> Result<(), NnError> {
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
