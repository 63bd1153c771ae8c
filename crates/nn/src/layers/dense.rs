use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{Activation, ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::initializers::Initializer;
use crate::params::ParamBuilder;

/// Keras' `Dense`: `activation(x · kernel + bias)` on the last axis.
///
/// ```
/// use lockstep_nn::{Activation, Dense};
///
/// let hidden = Dense::new(256).activation(Activation::Relu);
/// let logits = Dense::new(10);
/// # let _ = (hidden, logits);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    units: usize,
    activation: Activation,
    use_bias: bool,
    kernel_initializer: Initializer,
    bias_initializer: Initializer,
    input_dim: usize,
}

impl Dense {
    /// A dense layer of `units` outputs, linear, with a bias.
    pub fn new(units: usize) -> Self {
        Self {
            units,
            activation: Activation::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform,
            bias_initializer: Initializer::Zeros,
            input_dim: 0,
        }
    }

    /// Sets how the kernel's initial values are drawn (Keras' `kernel_initializer`).
    #[must_use]
    pub fn kernel_initializer(mut self, initializer: Initializer) -> Self {
        self.kernel_initializer = initializer;
        self
    }

    /// Sets how the bias's initial values are drawn (Keras' `bias_initializer`).
    #[must_use]
    pub fn bias_initializer(mut self, initializer: Initializer) -> Self {
        self.bias_initializer = initializer;
        self
    }

    /// Sets the activation.
    #[must_use]
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Drops the bias.
    #[must_use]
    pub fn without_bias(mut self) -> Self {
        self.use_bias = false;
        self
    }
}

/// A dense layer's product, as [`Layer::as_dense_product`] describes it: a `[rows, inputs]`
/// input times a `[inputs, units]` kernel, plus the bias when there is one, then a relu when
/// `relu` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseProduct {
    /// The kernel's rows: the values of each input row.
    pub inputs: usize,
    /// The kernel's columns: the outputs.
    pub units: usize,
    /// Whether a relu follows.
    pub relu: bool,
    /// Whether the layer has a bias (its second variable).
    pub bias: bool,
}

impl Layer for Dense {
    fn as_dense_product(&self) -> Option<DenseProduct> {
        let relu = match self.activation {
            Activation::Linear => false,
            Activation::Relu => true,
            Activation::Softmax | Activation::Sigmoid => return None,
        };
        Some(DenseProduct {
            inputs: self.input_dim,
            units: self.units,
            relu,
            bias: self.use_bias,
        })
    }

    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Dense {
            units: self.units,
            activation: self.activation.into(),
            use_bias: self.use_bias,
            kernel_initializer: self.kernel_initializer,
            bias_initializer: self.bias_initializer,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Dense"
    }

    fn stem(&self) -> &'static str {
        "dense"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let Some((&input_dim, leading)) = input_shape.split_last() else {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: "Dense needs an input with at least one axis".into(),
            });
        };
        if self.units == 0 {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: "units must be at least 1".into(),
            });
        }
        self.input_dim = input_dim;
        params.add(
            format!("{name}/kernel"),
            vec![input_dim, self.units],
            self.kernel_initializer,
        )?;
        if self.use_bias {
            params.add(
                format!("{name}/bias"),
                vec![self.units],
                self.bias_initializer,
            )?;
        }
        Ok(leading.iter().copied().chain([self.units]).collect())
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let Some((&last, leading)) = x
            .shape()
            .split_last()
            .filter(|(last, _)| **last == self.input_dim)
        else {
            return Err(NnError::Shape {
                what: format!("layer {name} input"),
                expected: format!("(…, {})", self.input_dim),
                got: x.shape().to_vec(),
            });
        };
        // Keras applies Dense to the last axis: fold every other axis into the rows.
        let flat = if x.rank() == 2 {
            x.clone()
        } else {
            // A tensor's shape has no sub-product that overflows (`element_count`).
            let rows = leading.iter().product();
            ops::reshape(x, &[rows, last]).in_layer(name)?
        };
        let bias = self.use_bias.then(|| &params[1]);
        let mut y = match self.activation {
            Activation::Linear | Activation::Relu => {
                ops::dense(&flat, &params[0], bias, self.activation == Activation::Relu)
                    .in_layer(name)?
            }
            other @ (Activation::Softmax | Activation::Sigmoid) => other.apply(
                ops::dense(&flat, &params[0], bias, false).in_layer(name)?,
                name,
            )?,
        };
        if x.rank() != 2 {
            let shape: Vec<usize> = x.shape()[..x.rank() - 1]
                .iter()
                .copied()
                .chain([self.units])
                .collect();
            y = ops::reshape(&y, &shape).in_layer(name)?;
        }
        Ok(y)
    }
}
