//! Keras' `BatchNormalization`, and its synchronised form (Keras 3's `synchronized=True`,
//! TensorFlow's `SyncBatchNormalization`, PyTorch's `SyncBatchNorm`).
//!
//! In training a batch is normalised with its own statistics per channel (the last axis), and
//! the moving mean and variance, non-trainable state, move towards them
//! ([`Update::MovingAverage`](crate::Update::MovingAverage)); in inference the moving
//! statistics normalise. A replica's observations are averaged over every replica in the
//! step's one all-reduce, so every replica's moving statistics stay identical (Keras under a
//! strategy keeps one copy per replica and averages them when read: the same value).
//!
//! Synchronised, the batch statistics are those of the global batch: each replica's sums of
//! `x` and `x²` and its count travel in one all-reduce inside the forward pass, and the
//! gradient of those sums in one all-reduce inside the backward pass, as PyTorch's
//! `SyncBatchNorm` does. The variance is then `E[x²] − E[x]²`, as Keras 3 computes it
//! synchronised; unsynchronised, it is the mean squared deviation from the mean (two passes,
//! as `tf.nn.moments`). Both are the biased variance, which the moving variance follows too
//! (Keras'; PyTorch's running variance is the unbiased one).

use std::sync::Arc;

use lockstep_tensor::Tensor;
use lockstep_tensor::ops::{self, AllReduceSum};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::initializers::Initializer;
use crate::params::ParamBuilder;

/// Keras' `BatchNormalization` over the last axis: `momentum` 0.99 and `epsilon` 1e-3 by
/// default, a learned scale `gamma` and offset `beta`, the moving mean and variance as
/// non-trainable state. Runs on the CPU.
///
/// ```
/// use lockstep_nn::{BatchNormalization, Dense, Sequential};
///
/// let model = Sequential::new(
///     &[4],
///     vec![Box::new(Dense::new(8)), Box::new(BatchNormalization::new().synchronized(true))],
///     0,
/// )?;
/// assert_eq!(model.parameters().len(), 4 * 8 + 8 + 4 * 8);
/// assert_eq!(model.parameters().trainable_len(), 4 * 8 + 8 + 2 * 8);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormalization {
    momentum: f32,
    epsilon: f32,
    center: bool,
    scale: bool,
    synchronized: bool,
}

/// Where each of the layer's variables sits among its own.
#[derive(Debug, Clone, Copy)]
struct Slots {
    gamma: Option<usize>,
    beta: Option<usize>,
    moving_mean: usize,
    moving_variance: usize,
}

impl BatchNormalization {
    /// With Keras' defaults.
    pub fn new() -> Self {
        Self {
            momentum: 0.99,
            epsilon: 1e-3,
            center: true,
            scale: true,
            synchronized: false,
        }
    }

    /// The weight of the old moving statistics in each update.
    #[must_use]
    pub fn momentum(mut self, momentum: f32) -> Self {
        self.momentum = momentum;
        self
    }

    /// Added to the variance before its square root.
    #[must_use]
    pub fn epsilon(mut self, epsilon: f32) -> Self {
        self.epsilon = epsilon;
        self
    }

    /// Whether a learned offset `beta` is added.
    #[must_use]
    pub fn center(mut self, center: bool) -> Self {
        self.center = center;
        self
    }

    /// Whether a learned scale `gamma` multiplies.
    #[must_use]
    pub fn scale(mut self, scale: bool) -> Self {
        self.scale = scale;
        self
    }

    /// Batch statistics over every replica of every worker in training (Keras 3's flag).
    #[must_use]
    pub fn synchronized(mut self, synchronized: bool) -> Self {
        self.synchronized = synchronized;
        self
    }

    fn slots(&self) -> Slots {
        let gamma = self.scale.then_some(0);
        let beta = self.center.then_some(usize::from(self.scale));
        let first_state = usize::from(self.scale) + usize::from(self.center);
        Slots {
            gamma,
            beta,
            moving_mean: first_state,
            moving_variance: first_state + 1,
        }
    }

    /// `y = x̂ · γ + β` from the normalised input.
    fn affine(
        &self,
        name: &str,
        normalised: &Tensor,
        params: &[Tensor],
    ) -> Result<Tensor, NnError> {
        let slots = self.slots();
        let mut y = normalised.clone();
        if let Some(gamma) = slots.gamma {
            y = ops::mul(&y, &params[gamma]).in_layer(name)?;
        }
        if let Some(beta) = slots.beta {
            y = ops::add(&y, &params[beta]).in_layer(name)?;
        }
        Ok(y)
    }

    /// `1/√(variance + ε)`, as `e^(−½·ln(variance + ε))`.
    fn inverse_deviation(&self, name: &str, variance: &Tensor) -> Result<Tensor, NnError> {
        let epsilon = Tensor::full(variance.shape(), self.epsilon)
            .and_then(|e| e.to_device(variance.device()))
            .in_layer(name)?;
        let log = ops::log(&ops::add(variance, &epsilon).in_layer(name)?).in_layer(name)?;
        ops::exp(&ops::scale(&log, -0.5).in_layer(name)?).in_layer(name)
    }

    /// The batch's mean and (biased) variance per channel, each `[channels]`: over this
    /// replica's batch, or over every replica's when synchronised.
    fn batch_moments(
        &self,
        name: &str,
        x: &Tensor,
        replicas: Option<&Arc<dyn AllReduceSum>>,
    ) -> Result<(Tensor, Tensor), NnError> {
        let axes: Vec<usize> = (0..x.rank() - 1).collect();
        if !self.synchronized {
            let mean = ops::mean(x, &axes, false).in_layer(name)?;
            let centred = ops::sub(x, &mean).in_layer(name)?;
            let squares = ops::mul(&centred, &centred).in_layer(name)?;
            let variance = ops::mean(&squares, &axes, false).in_layer(name)?;
            return Ok((mean, variance));
        }
        let channels = x.shape()[x.rank() - 1];
        let count = (x.len() / channels.max(1)) as f32;
        let sums = ops::sum(x, &axes, false).in_layer(name)?;
        let squares = ops::sum(&ops::mul(x, x).in_layer(name)?, &axes, false).in_layer(name)?;
        let count = Tensor::from_vec(vec![count], &[1]).in_layer(name)?;
        let mut packed = ops::concat(&[&sums, &squares, &count], 0).in_layer(name)?;
        if let Some(replicas) = replicas {
            packed = ops::all_reduce_sum(&packed, replicas).in_layer(name)?;
        }
        let total = packed.to_vec().in_layer(name)?[2 * channels];
        // Every replica without data: nothing to normalise, and no division by zero.
        let inverse = if total > 0.0 { 1.0 / total } else { 0.0 };
        let mean = ops::scale(
            &ops::narrow(&packed, 0, 0, channels).in_layer(name)?,
            inverse,
        )
        .in_layer(name)?;
        let mean_square = ops::scale(
            &ops::narrow(&packed, 0, channels, channels).in_layer(name)?,
            inverse,
        )
        .in_layer(name)?;
        // E[x²] − E[x]², never below zero (rounding can take it there).
        let variance = ops::relu(
            &ops::sub(&mean_square, &ops::mul(&mean, &mean).in_layer(name)?).in_layer(name)?,
        )
        .in_layer(name)?;
        Ok((mean, variance))
    }
}

impl Default for BatchNormalization {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer for BatchNormalization {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::BatchNormalization {
            momentum: self.momentum,
            epsilon: self.epsilon,
            center: self.center,
            scale: self.scale,
            synchronized: self.synchronized,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "BatchNormalization"
    }

    fn stem(&self) -> &'static str {
        "batch_normalization"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let Some(&channels) = input_shape.last() else {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: "BatchNormalization needs an input with at least one axis".into(),
            });
        };
        if !(self.epsilon > 0.0 && self.epsilon.is_finite()) {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!("epsilon {} must be positive", self.epsilon),
            });
        }
        if self.scale {
            params.add(format!("{name}/gamma"), vec![channels], Initializer::Ones)?;
        }
        if self.center {
            params.add(format!("{name}/beta"), vec![channels], Initializer::Zeros)?;
        }
        params.add_moving_average(
            format!("{name}/moving_mean"),
            vec![channels],
            Initializer::Zeros,
            self.momentum,
        )?;
        params.add_moving_average(
            format!("{name}/moving_variance"),
            vec![channels],
            Initializer::Ones,
            self.momentum,
        )?;
        Ok(input_shape.to_vec())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let slots = self.slots();
        if !ctx.training {
            // Per channel: x · (γ/√(var + ε)) + (β − mean · γ/√(var + ε)).
            let inverse = self.inverse_deviation(name, &params[slots.moving_variance])?;
            let factor = match slots.gamma {
                Some(gamma) => ops::mul(&inverse, &params[gamma]).in_layer(name)?,
                None => inverse,
            };
            let shift = ops::scale(
                &ops::mul(&params[slots.moving_mean], &factor).in_layer(name)?,
                -1.0,
            )
            .in_layer(name)?;
            let shift = match slots.beta {
                Some(beta) => ops::add(&shift, &params[beta]).in_layer(name)?,
                None => shift,
            };
            let y = ops::mul(x, &factor).in_layer(name)?;
            return ops::add(&y, &shift).in_layer(name);
        }
        if x.is_empty() && !self.synchronized {
            return Ok(x.clone());
        }
        let (mean, variance) = self.batch_moments(name, x, ctx.replicas())?;
        ctx.observe(slots.moving_mean, &mean);
        ctx.observe(slots.moving_variance, &variance);
        let centred = ops::sub(x, &mean).in_layer(name)?;
        let inverse = self.inverse_deviation(name, &variance)?;
        let normalised = ops::mul(&centred, &inverse).in_layer(name)?;
        self.affine(name, &normalised, params)
    }

    fn synchronizes_replicas(&self) -> bool {
        self.synchronized
    }
}
