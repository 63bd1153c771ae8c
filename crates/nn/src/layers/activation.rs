use lockstep_tensor::ops::MaxPool;
use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::params::ParamBuilder;

/// An activation function, applied by layers that take one or by [`ActivationLayer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// The identity (Keras' `None` / `"linear"`).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// Softmax over the last axis.
    Softmax,
    /// The logistic function, for binary outputs.
    Sigmoid,
}

impl Activation {
    pub(crate) fn apply(self, x: Tensor, layer: &str) -> Result<Tensor, NnError> {
        match self {
            Self::Linear => Ok(x),
            Self::Relu => ops::relu(&x).in_layer(layer),
            Self::Softmax => ops::softmax(&x, -1).in_layer(layer),
            Self::Sigmoid => ops::sigmoid(&x).in_layer(layer),
        }
    }
}

/// Keras' `Activation` layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationLayer(pub Activation);

impl Layer for ActivationLayer {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Activation {
            activation: self.0.into(),
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Activation"
    }

    fn stem(&self) -> &'static str {
        "activation"
    }

    fn build(
        &mut self,
        _name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        Ok(input_shape.to_vec())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        self.0.apply(x.clone(), name)
    }

    fn as_activation(&self) -> Option<Activation> {
        Some(self.0)
    }

    /// Max pooling commutes with a non-decreasing function: `pool(relu(x)) = relu(pool(x))`,
    /// value for value and gradient for gradient (a window's maximum is where the gradient
    /// goes either way, and a window of non-positive values passes none). So the relu runs on
    /// the pooled output, a quarter of the values for a 2×2 pool, and its pass over the full
    /// input (and that pass's gradient) is saved: what batch normalization → relu → pooling
    /// spends.
    fn forward_then_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        pool: MaxPool,
        _ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        if !matches!(self.0, Activation::Relu | Activation::Linear) {
            return None;
        }
        let pooled = ops::max_pool2d(x, pool.size, pool.stride, pool.padding).in_layer(name);
        Some(pooled.and_then(|p| self.0.apply(p, name)))
    }
}
