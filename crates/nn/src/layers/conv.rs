use super::config::{BuiltinLayerConfig, LayerConfig};
use lockstep_tensor::Tensor;
use lockstep_tensor::ops::{self, MaxPool, Padding};

use super::{Activation, ForwardContext, Layer, NormalizationStep};
use crate::error::{InLayer, NnError};
use crate::initializers::Initializer;
use crate::params::ParamBuilder;

/// Keras' `Conv2D` on NHWC input: `activation(conv(x, kernel) + bias)`.
///
/// ```
/// use lockstep_nn::{Activation, Conv2D};
///
/// let conv = Conv2D::new(32, (3, 3)).activation(Activation::Relu); // valid padding, stride 1
/// # let _ = conv;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2D {
    filters: usize,
    kernel_size: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
    activation: Activation,
    use_bias: bool,
    kernel_initializer: Initializer,
    bias_initializer: Initializer,
}

impl Conv2D {
    /// `filters` output channels, a `kernel_size` window, stride 1, valid padding, linear.
    pub fn new(filters: usize, kernel_size: (usize, usize)) -> Self {
        Self {
            filters,
            kernel_size,
            strides: (1, 1),
            padding: Padding::Valid,
            activation: Activation::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform,
            bias_initializer: Initializer::Zeros,
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

    /// Sets the strides.
    #[must_use]
    pub fn strides(mut self, strides: (usize, usize)) -> Self {
        self.strides = strides;
        self
    }

    /// Sets the padding.
    #[must_use]
    pub fn padding(mut self, padding: Padding) -> Self {
        self.padding = padding;
        self
    }

    /// Sets the activation.
    #[must_use]
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Leaves out the bias.
    #[must_use]
    pub fn without_bias(mut self) -> Self {
        self.use_bias = false;
        self
    }
}

/// Output size of one spatial axis, as [`ops::conv2d`] computes it.
pub(crate) fn spatial_out(
    input: usize,
    window: usize,
    stride: usize,
    padding: Padding,
) -> Option<usize> {
    if window == 0 || stride == 0 {
        return None;
    }
    match padding {
        Padding::Valid => input.checked_sub(window).map(|d| d / stride + 1),
        Padding::Same => Some(input.div_ceil(stride)),
    }
}

impl Layer for Conv2D {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Conv2D {
            filters: self.filters,
            kernel_size: self.kernel_size,
            strides: self.strides,
            padding: self.padding.into(),
            activation: self.activation.into(),
            use_bias: self.use_bias,
            kernel_initializer: self.kernel_initializer,
            bias_initializer: self.bias_initializer,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Conv2D"
    }

    fn stem(&self) -> &'static str {
        "conv2d"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        let &[h, w, c] = input_shape else {
            return Err(NnError::Shape {
                what: format!("layer {name} input"),
                expected: "(None, height, width, channels)".into(),
                got: input_shape.to_vec(),
            });
        };
        let (kh, kw) = self.kernel_size;
        let out = spatial_out(h, kh, self.strides.0, self.padding).zip(spatial_out(
            w,
            kw,
            self.strides.1,
            self.padding,
        ));
        let Some((oh, ow)) = out.filter(|_| self.filters > 0) else {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!(
                    "{} filters of {kh}×{kw}, strides {:?}, {:?} padding cannot apply to a {h}×{w} input",
                    self.filters, self.strides, self.padding
                ),
            });
        };
        params.add(
            format!("{name}/kernel"),
            vec![kh, kw, c, self.filters],
            self.kernel_initializer,
        )?;
        if self.use_bias {
            params.add(
                format!("{name}/bias"),
                vec![self.filters],
                self.bias_initializer,
            )?;
        }
        Ok(vec![oh, ow, self.filters])
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let bias = self.use_bias.then(|| &params[1]);
        let relu = self.activation == Activation::Relu;
        let y = ops::conv2d_bias_relu(x, &params[0], bias, relu, self.strides, self.padding)
            .in_layer(name)?;
        if relu {
            Ok(y)
        } else {
            self.activation.apply(y, name)
        }
    }

    fn forward_then_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        pool: MaxPool,
        _ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        let relu = match self.activation {
            Activation::Relu => true,
            Activation::Linear => false,
            Activation::Softmax | Activation::Sigmoid => return None,
        };
        let bias = self.use_bias.then(|| &params[1]);
        Some(
            ops::conv2d_bias_relu_max_pool(
                x,
                &params[0],
                bias,
                relu,
                self.strides,
                self.padding,
                pool,
            )
            .in_layer(name),
        )
    }

    /// Without an activation of its own, and with a relu (or none) after the normalization:
    /// [`ops::conv2d_batch_norm_max_pool`], which folds the batch statistics into the
    /// convolution where it is a first layer with few values per patch and runs the
    /// operations apart elsewhere.
    fn forward_then_batch_norm_max_pool(
        &self,
        _name: &str,
        x: &Tensor,
        params: &[Tensor],
        norm: NormalizationStep<'_>,
        (activation, pool): (Activation, MaxPool),
    ) -> Option<Result<Tensor, NnError>> {
        let relu = match activation {
            Activation::Relu => true,
            Activation::Linear => false,
            Activation::Softmax | Activation::Sigmoid => return None,
        };
        if self.activation != Activation::Linear {
            return None;
        }
        let bias = self.use_bias.then(|| &params[1]);
        norm.layer.fused_training_pass(
            norm.name,
            norm.params,
            norm.ctx,
            |affine, epsilon, replicas| {
                ops::conv2d_batch_norm_max_pool(
                    x,
                    (&params[0], bias),
                    (self.strides, self.padding),
                    affine,
                    epsilon,
                    replicas,
                    relu,
                    pool,
                )
            },
        )
    }
}
