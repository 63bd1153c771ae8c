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
            Self::Softmax => ops::softmax(&x).in_layer(layer),
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
}
