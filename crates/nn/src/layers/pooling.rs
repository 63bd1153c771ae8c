use super::config::{BuiltinLayerConfig, LayerConfig};
use lockstep_tensor::Tensor;
use lockstep_tensor::ops::{self, MaxPool, Padding};

use super::conv::spatial_out;
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError};
use crate::params::ParamBuilder;

/// Keras' `MaxPooling2D`; strides default to the pool size.
///
/// ```
/// use lockstep_nn::MaxPooling2D;
///
/// let pool = MaxPooling2D::new((2, 2));
/// # let _ = pool;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MaxPooling2D {
    pool_size: (usize, usize),
    strides: Option<(usize, usize)>,
    padding: Padding,
}

/// The settings both poolings share: a window, strides defaulting to it, and a padding.
macro_rules! window_settings {
    ($($pooling:ty),*) => {$(
        impl $pooling {
            /// A `pool_size` window moved by its own size, valid padding.
            pub fn new(pool_size: (usize, usize)) -> Self {
                Self {
                    pool_size,
                    strides: None,
                    padding: Padding::Valid,
                }
            }

            /// Sets the strides.
            #[must_use]
            pub fn strides(mut self, strides: (usize, usize)) -> Self {
                self.strides = Some(strides);
                self
            }

            /// Sets the padding.
            #[must_use]
            pub fn padding(mut self, padding: Padding) -> Self {
                self.padding = padding;
                self
            }

            fn stride(&self) -> (usize, usize) {
                self.strides.unwrap_or(self.pool_size)
            }
        }
    )*};
}

window_settings!(MaxPooling2D, AveragePooling2D);

/// The output shape of pooling `input_shape` (`[height, width, channels]`).
fn pooled_shape(
    name: &str,
    input_shape: &[usize],
    p: (usize, usize),
    s: (usize, usize),
    padding: Padding,
) -> Result<Vec<usize>, NnError> {
    let &[h, w, c] = input_shape else {
        return Err(NnError::Shape {
            what: format!("layer {name} input"),
            expected: "(None, height, width, channels)".into(),
            got: input_shape.to_vec(),
        });
    };
    match (
        spatial_out(h, p.0, s.0, padding),
        spatial_out(w, p.1, s.1, padding),
    ) {
        (Some(oh), Some(ow)) => Ok(vec![oh, ow, c]),
        _ => Err(NnError::InvalidConfig {
            layer: name.into(),
            why: format!("a {p:?} pool with strides {s:?} cannot apply to a {h}×{w} input"),
        }),
    }
}

impl Layer for MaxPooling2D {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::MaxPooling2D {
            pool_size: self.pool_size,
            strides: self.strides,
            padding: self.padding.into(),
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "MaxPooling2D"
    }

    fn stem(&self) -> &'static str {
        "max_pooling2d"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        pooled_shape(
            name,
            input_shape,
            self.pool_size,
            self.stride(),
            self.padding,
        )
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        ops::max_pool2d(x, self.pool_size, self.stride(), self.padding).in_layer(name)
    }

    fn as_max_pool(&self) -> Option<MaxPool> {
        Some(MaxPool {
            size: self.pool_size,
            stride: self.stride(),
            padding: self.padding,
        })
    }
}

/// Keras' `AveragePooling2D`: the mean of each window (with `same` padding, of its inputs
/// inside the image); strides default to the pool size. Runs on the CPU.
///
/// ```
/// use lockstep_nn::AveragePooling2D;
/// use lockstep_tensor::ops::Padding;
///
/// let pool = AveragePooling2D::new((2, 2)).strides((1, 1)).padding(Padding::Same);
/// # let _ = pool;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AveragePooling2D {
    pool_size: (usize, usize),
    strides: Option<(usize, usize)>,
    padding: Padding,
}

impl Layer for AveragePooling2D {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::AveragePooling2D {
            pool_size: self.pool_size,
            strides: self.strides,
            padding: self.padding.into(),
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "AveragePooling2D"
    }

    fn stem(&self) -> &'static str {
        "average_pooling2d"
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        _params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        pooled_shape(
            name,
            input_shape,
            self.pool_size,
            self.stride(),
            self.padding,
        )
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        _params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        ops::avg_pool2d(x, self.pool_size, self.stride(), self.padding).in_layer(name)
    }
}
