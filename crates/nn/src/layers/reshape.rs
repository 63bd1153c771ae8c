use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError, count_values};
use crate::params::ParamBuilder;

/// Keras' `Flatten`: `(None, a, b, …) → (None, a·b·…)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flatten;

impl Layer for Flatten {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Flatten.into()
    }

    fn kind(&self) -> &'static str {
        "Flatten"
    }

    fn stem(&self) -> &'static str {
        "flatten"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        Ok(vec![count_values(name, input_shape)?])
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        ops::flatten(x).in_layer(name)
    }
}

/// Keras' `Reshape`: the batch axis stays, the rest takes `target` (same size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshape {
    target: Vec<usize>,
}

impl Reshape {
    /// Reshapes each example to `target`.
    pub fn new(target: &[usize]) -> Self {
        Self {
            target: target.to_vec(),
        }
    }
}

impl Layer for Reshape {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Reshape {
            target_shape: self.target.clone(),
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Reshape"
    }

    fn stem(&self) -> &'static str {
        "reshape"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let (from, to) = (
            lockstep_tensor::element_count(input_shape),
            lockstep_tensor::element_count(&self.target),
        );
        if from.is_none() || from != to {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!("cannot reshape {input_shape:?} to {:?}", self.target),
            });
        }
        Ok(self.target.clone())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let shape: Vec<usize> = x.shape()[..1].iter().chain(&self.target).copied().collect();
        ops::reshape(x, &shape).in_layer(name)
    }
}
