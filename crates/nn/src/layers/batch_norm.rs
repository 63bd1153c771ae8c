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
//! backward pass's two per-channel sums in one all-reduce inside the backward pass, as
//! PyTorch's `SyncBatchNorm` does ([`ops::batch_norm`]). The variance is `E[x²] − E[x]²` from
//! sums accumulated in `f64` (Keras 3 computes it so when synchronised): the biased variance,
//! which the moving variance follows too (Keras'; PyTorch's running variance is the unbiased
//! one).

use std::sync::Arc;

use lockstep_tensor::ops::{self, AllReduceSum, MaxPool};
use lockstep_tensor::{Tensor, TensorError};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{Activation, ForwardContext, Layer};
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

    fn affine<'p>(&self, params: &'p [Tensor]) -> ops::Affine<'p> {
        let slots = self.slots();
        ops::Affine {
            gamma: slots.gamma.map(|i| &params[i]),
            beta: slots.beta.map(|i| &params[i]),
        }
    }
}

impl BatchNormalization {
    /// A training pass through `normalize` (given the affine parameters and the replicas to
    /// synchronise with), its batch statistics observed for the moving averages.
    fn training_pass(
        &self,
        name: &str,
        params: &[Tensor],
        ctx: ForwardContext<'_>,
        normalize: impl FnOnce(
            ops::Affine<'_>,
            Option<&Arc<dyn AllReduceSum>>,
        ) -> Result<(Tensor, ops::Moments), TensorError>,
    ) -> Result<Tensor, NnError> {
        let slots = self.slots();
        let replicas = if self.synchronized {
            ctx.replicas()
        } else {
            None
        };
        let (y, moments) = normalize(self.affine(params), replicas).in_layer(name)?;
        let channels = moments.mean.len();
        let observed = |values: Vec<f32>| Tensor::from_vec(values, &[channels]).in_layer(name);
        ctx.observe(slots.moving_mean, &observed(moments.mean)?);
        ctx.observe(slots.moving_variance, &observed(moments.variance)?);
        Ok(y)
    }
}

impl BatchNormalization {
    /// In a training pass, `normalize` (given the affine parameters, ε and the replicas to
    /// synchronise with) as this layer's pass, its statistics observed: for the layer before
    /// this one computing both in one pass. `None` in inference, where the moving statistics
    /// normalise.
    pub(crate) fn fused_training_pass(
        &self,
        name: &str,
        params: &[Tensor],
        ctx: ForwardContext<'_>,
        normalize: impl FnOnce(
            ops::Affine<'_>,
            f32,
            Option<&Arc<dyn AllReduceSum>>,
        ) -> Result<(Tensor, ops::Moments), TensorError>,
    ) -> Option<Result<Tensor, NnError>> {
        ctx.training.then(|| {
            self.training_pass(name, params, ctx, |affine, replicas| {
                normalize(affine, self.epsilon, replicas)
            })
        })
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
            return ops::batch_norm_inference(
                x,
                self.affine(params),
                &params[slots.moving_mean],
                &params[slots.moving_variance],
                self.epsilon,
            )
            .in_layer(name);
        }
        self.training_pass(name, params, ctx, |parts, replicas| {
            ops::batch_norm(x, parts, self.epsilon, replicas)
        })
    }

    /// Training passes only: inference normalises with fixed statistics, one pass either way.
    fn forward_then_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        pool: MaxPool,
        ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        self.forward_then_activation_max_pool(name, x, params, (Activation::Linear, pool), ctx)
    }

    /// In a training pass, the normalization, a relu (or the identity) and non-overlapping max
    /// pooling run as one pass that never stores the full-size normalised activation or its
    /// gradient ([`ops::batch_norm_max_pool`]): the same values as the layers apart.
    fn forward_then_activation_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        (activation, pool): (Activation, MaxPool),
        ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        let relu = match activation {
            Activation::Relu => true,
            Activation::Linear => false,
            Activation::Softmax | Activation::Sigmoid => return None,
        };
        if !ctx.training {
            return None;
        }
        Some(self.training_pass(name, params, ctx, |parts, replicas| {
            ops::batch_norm_max_pool(x, parts, self.epsilon, replicas, relu, pool)
        }))
    }
    fn synchronizes_replicas(&self) -> bool {
        self.synchronized
    }

    fn as_batch_norm(&self) -> Option<&BatchNormalization> {
        Some(self)
    }
}
