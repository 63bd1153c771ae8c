//! Keras' `LayerNormalization` (over the last axis, with a learned scale and offset) and
//! `GlobalAveragePooling2D`: layers that average over axes of each example.

use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::initializers::Initializer;
use crate::params::ParamBuilder;

/// Keras' `LayerNormalization` over the last axis: each example's features shifted to mean 0
/// and scaled to variance 1 (`(x − mean) / √(var + ε)`), then times `gamma` and plus `beta`,
/// learned per feature (initialised to 1 and 0). Runs on the CPU (the mean's subtraction
/// broadcasts over the features).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormalization {
    epsilon: f32,
}

impl LayerNormalization {
    /// With Keras' ε of 1e-3.
    pub fn new() -> Self {
        Self { epsilon: 1e-3 }
    }

    /// With another ε.
    #[must_use]
    pub fn epsilon(mut self, epsilon: f32) -> Self {
        self.epsilon = epsilon;
        self
    }
}

impl Default for LayerNormalization {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer for LayerNormalization {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::LayerNormalization {
            epsilon: self.epsilon,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "LayerNormalization"
    }

    fn stem(&self) -> &'static str {
        "layer_normalization"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let Some(&features) = input_shape.last() else {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: "LayerNormalization needs an input with at least one axis".into(),
            });
        };
        if !(self.epsilon > 0.0 && self.epsilon.is_finite()) {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!("epsilon {} must be positive", self.epsilon),
            });
        }
        params.add(format!("{name}/gamma"), vec![features], Initializer::Ones)?;
        params.add(format!("{name}/beta"), vec![features], Initializer::Zeros)?;
        Ok(input_shape.to_vec())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let last = x.rank().saturating_sub(1);
        let mean = ops::mean(x, &[last], true).in_layer(name)?;
        let centred = ops::sub(x, &mean).in_layer(name)?;
        let variance = ops::mean(&ops::mul(&centred, &centred).in_layer(name)?, &[last], true)
            .in_layer(name)?;
        let epsilon = Tensor::full(variance.shape(), self.epsilon)
            .and_then(|e| e.to_device(variance.device()))
            .in_layer(name)?;
        // 1/√(var + ε) as e^(−½·ln(var + ε)): operations every device has, var + ε > 0.
        let inverse_deviation = ops::exp(
            &ops::scale(
                &ops::log(&ops::add(&variance, &epsilon).in_layer(name)?).in_layer(name)?,
                -0.5,
            )
            .in_layer(name)?,
        )
        .in_layer(name)?;
        let normalised = ops::mul(&centred, &inverse_deviation).in_layer(name)?;
        let scaled = ops::mul(&normalised, &params[0]).in_layer(name)?;
        ops::add(&scaled, &params[1]).in_layer(name)
    }
}

/// Keras' `GlobalAveragePooling2D`: `(None, height, width, channels) → (None, channels)`, the
/// mean of each channel over the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalAveragePooling2D;

impl Layer for GlobalAveragePooling2D {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::GlobalAveragePooling2D.into()
    }

    fn kind(&self) -> &'static str {
        "GlobalAveragePooling2D"
    }

    fn stem(&self) -> &'static str {
        "global_average_pooling2d"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        match input_shape {
            &[_, _, channels] => Ok(vec![channels]),
            other => Err(NnError::Shape {
                what: format!("layer {name} input"),
                expected: "(None, height, width, channels)".into(),
                got: other.to_vec(),
            }),
        }
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        ops::mean(x, &[1, 2], false).in_layer(name)
    }
}
