//! Keras layers. A layer declares its variables when the model is built (knowing its input
//! shape) and maps a batch to a batch in `forward`; a merge layer ([`Add`], [`Multiply`],
//! [`Concatenate`]) takes several inputs through [`Layer::build_inputs`] and
//! [`Layer::forward_inputs`].

mod activation;
mod config;
mod conv;
mod dense;
mod dropout;
mod embedding;
mod merge;
mod normalization;
mod pooling;
mod reshape;

pub use activation::{Activation, ActivationLayer};
pub use config::{
    ActivationName, BuiltinLayerConfig, CustomLayerConfig, LayerConfig, LayerFactory, PaddingName,
    register_layer,
};
pub use conv::Conv2D;
pub use dense::Dense;
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use merge::{Add, Concatenate, Multiply};
pub use normalization::{GlobalAveragePooling2D, LayerNormalization};
pub use pooling::MaxPooling2D;
pub use reshape::{Flatten, Reshape};

use lockstep_tensor::Tensor;
use lockstep_tensor::ops::MaxPool;

use crate::error::NnError;
use crate::params::ParamBuilder;

/// What a forward pass knows besides its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForwardContext {
    /// Training (dropout active) or inference.
    pub training: bool,
    /// Varies per step so dropout masks differ between steps yet repeat between runs.
    pub step: u64,
    /// The replica running the pass, among all replicas in sync: replicas of one step draw
    /// different dropout masks, each the same from run to run.
    pub replica: usize,
}

/// One layer of a [`Network`](crate::Network): a [`Sequential`](crate::Sequential) model's
/// step, or a node of a functional graph.
pub trait Layer: Send + Sync {
    /// The Keras class name, for `summary()`: `Dense`, `Conv2D`, …
    fn kind(&self) -> &'static str;

    /// The default name stem: `dense`, `conv2d`, …
    fn stem(&self) -> &'static str;

    /// The settings that rebuild this layer ([`LayerConfig::build`]), for whole-model saves.
    fn config(&self) -> LayerConfig;

    /// Declares variables for an input of `input_shape` (batch axis excluded) and returns the
    /// output shape.
    ///
    /// # Errors
    ///
    /// When the input shape does not suit the layer or its settings are impossible.
    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError>;

    /// Computes the layer on a batch; `params` are the layer's own variables in declaration
    /// order.
    ///
    /// # Errors
    ///
    /// When a tensor operation fails.
    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        ctx: ForwardContext,
    ) -> Result<Tensor, NnError>;

    /// [`Layer::build`] for a layer called on several inputs (a merge layer overrides it):
    /// by default exactly one input is taken.
    ///
    /// # Errors
    ///
    /// Another number of inputs than the layer takes; as [`Layer::build`].
    fn build_inputs(
        &mut self,
        name: &str,
        input_shapes: &[Vec<usize>],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        match input_shapes {
            [shape] => self.build(name, shape, params),
            _ => Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!(
                    "{} takes one input, not {}",
                    self.kind(),
                    input_shapes.len()
                ),
            }),
        }
    }

    /// [`Layer::forward`] on several inputs (a merge layer overrides it): by default exactly
    /// one input is taken.
    ///
    /// # Errors
    ///
    /// Another number of inputs than the layer takes; as [`Layer::forward`].
    fn forward_inputs(
        &self,
        name: &str,
        xs: &[Tensor],
        params: &[Tensor],
        ctx: ForwardContext,
    ) -> Result<Tensor, NnError> {
        match xs {
            [x] => self.forward(name, x, params, ctx),
            _ => Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!("{} takes one input, not {}", self.kind(), xs.len()),
            }),
        }
    }

    /// The pooling this layer does, when it is max pooling: a layer before it may then compute
    /// both in one pass ([`Layer::forward_then_max_pool`]).
    fn as_max_pool(&self) -> Option<MaxPool> {
        None
    }

    /// This layer followed by max pooling `pool`, in one pass, as XLA fuses them; `None` when
    /// the layer has no such pass, and [`Sequential`](crate::Sequential) runs the two apart.
    /// The result must equal the two layers' (up to rounding).
    ///
    /// # Errors
    ///
    /// When a tensor operation fails.
    fn forward_then_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        pool: MaxPool,
        ctx: ForwardContext,
    ) -> Option<Result<Tensor, NnError>> {
        let _ = (name, x, params, pool, ctx);
        None
    }
}
