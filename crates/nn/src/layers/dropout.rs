use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::params::ParamBuilder;

/// Keras' `Dropout`: in training, zeroes a `rate` fraction of values and scales the rest up;
/// in inference, the identity. Masks are a function of `seed`, the step and the replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    rate: f32,
    seed: u64,
}

impl Dropout {
    /// Drops a `rate` fraction of values, with masks derived from `seed`.
    pub fn new(rate: f32, seed: u64) -> Self {
        Self { rate, seed }
    }
}

impl Layer for Dropout {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Dropout {
            rate: self.rate,
            seed: self.seed,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Dropout"
    }

    fn stem(&self) -> &'static str {
        "dropout"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        if !(0.0..1.0).contains(&self.rate) {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!("rate {} must be in [0, 1)", self.rate),
            });
        }
        Ok(input_shape.to_vec())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        if !ctx.training || self.rate == 0.0 {
            return Ok(x.clone());
        }
        let seed = self.seed
            ^ ctx.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (ctx.replica as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        ops::dropout(x, self.rate, seed).in_layer(name)
    }
}
