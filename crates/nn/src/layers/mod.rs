//! Keras layers. A layer declares its variables when the model is built (knowing its input
//! shape) and maps a batch to a batch in `forward`; a merge layer ([`Add`], [`Multiply`],
//! [`Concatenate`]) takes several inputs through [`Layer::build_inputs`] and
//! [`Layer::forward_inputs`].

mod activation;
mod batch_norm;
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
pub use batch_norm::BatchNormalization;
pub use config::{
    ActivationName, BuiltinLayerConfig, CustomLayerConfig, LayerConfig, LayerFactory, PaddingName,
    register_layer,
};
pub use conv::Conv2D;
pub use dense::{Dense, DenseProduct};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use merge::{Add, Concatenate, Multiply};
pub use normalization::{GlobalAveragePooling2D, LayerNormalization};
pub use pooling::{AveragePooling2D, MaxPooling2D};
pub use reshape::{Flatten, Reshape};

use std::sync::{Arc, Mutex, PoisonError};

use lockstep_tensor::Tensor;
use lockstep_tensor::ops::{AllReduceSum, MaxPool};

use crate::error::NnError;
use crate::params::ParamBuilder;

/// What a forward pass knows besides its input: whether it trains, the step and replica (for
/// dropout masks), and for layers that need them, the replicas in sync
/// ([`ForwardContext::replicas`]) and where to record observations of non-trainable state
/// ([`ForwardContext::observe`]).
#[derive(Clone, Copy, Default)]
pub struct ForwardContext<'a> {
    /// Training (dropout active, batch statistics) or inference.
    pub training: bool,
    /// Varies per step so dropout masks differ between steps yet repeat between runs.
    pub step: u64,
    /// The replica running the pass, among all replicas in sync: replicas of one step draw
    /// different dropout masks, each the same from run to run.
    pub replica: usize,
    replicas: Option<&'a Arc<dyn AllReduceSum>>,
    observations: Option<Observations<'a>>,
}

impl std::fmt::Debug for ForwardContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardContext")
            .field("training", &self.training)
            .field("step", &self.step)
            .field("replica", &self.replica)
            .field("synchronised", &self.replicas.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> ForwardContext<'a> {
    /// A training pass of `step` on replica `replica`.
    pub fn training(step: u64, replica: usize) -> Self {
        Self {
            training: true,
            step,
            replica,
            ..Self::default()
        }
    }

    /// An inference pass: no dropout, moving statistics.
    pub fn inference() -> Self {
        Self::default()
    }

    /// The same pass, with a handle on every replica in sync for layers that reduce across
    /// them (a synchronised [`BatchNormalization`]). Without one, such a layer sees only its
    /// own batch, as with a single replica.
    #[must_use]
    pub fn with_replicas(mut self, replicas: &'a Arc<dyn AllReduceSum>) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// The replicas in sync, when the pass has them.
    pub fn replicas(&self) -> Option<&'a Arc<dyn AllReduceSum>> {
        self.replicas
    }

    /// Records what this pass observed for the layer's non-trainable variable `variable` (its
    /// index among the layer's own variables, as [`Layer::forward`]'s `params`): the network
    /// moves the variable towards the mean observation of every replica after the step
    /// ([`crate::Update::MovingAverage`]). A layer with such state observes it on every
    /// training pass; outside a network's training pass this does nothing.
    pub fn observe(&self, variable: usize, value: &Tensor) {
        if let Some(observations) = self.observations {
            observations.record(observations.first + variable, value.detach());
        }
    }

    /// The pass, recording observations into `sink`.
    pub(crate) fn observing(mut self, sink: &'a ObservationSink) -> Self {
        self.observations = Some(Observations { sink, first: 0 });
        self
    }

    /// The context a network hands the layer whose variables start at index `first`.
    pub(crate) fn for_layer(mut self, first: usize) -> Self {
        if let Some(observations) = &mut self.observations {
            observations.first = first;
        }
        self
    }
}

/// Observations of non-trainable state made during one forward pass, by variable index.
#[derive(Default)]
pub(crate) struct ObservationSink(Mutex<Vec<(usize, Tensor)>>);

impl ObservationSink {
    pub(crate) fn into_inner(self) -> Vec<(usize, Tensor)> {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Clone, Copy)]
struct Observations<'a> {
    sink: &'a ObservationSink,
    first: usize,
}

impl Observations<'_> {
    fn record(self, variable: usize, value: Tensor) {
        let mut seen = self.sink.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|(v, _)| *v != variable);
        seen.push((variable, value));
    }
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
        ctx: ForwardContext<'_>,
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
        ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        match xs {
            [x] => self.forward(name, x, params, ctx),
            _ => Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!("{} takes one input, not {}", self.kind(), xs.len()),
            }),
        }
    }

    /// `true` for a layer whose one variable is a table of rows that the layer's input picks
    /// by id (an embedding lookup): given only the rows a batch names, renumbered, it computes
    /// the same output ([`Network::forward_with_rows`](crate::Network::forward_with_rows)).
    fn looks_up_rows(&self) -> bool {
        false
    }

    /// `true` for a layer that reduces across the replicas in its training pass
    /// ([`ForwardContext::replicas`]): every replica must then run every training step.
    fn synchronizes_replicas(&self) -> bool {
        false
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
        ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        let _ = (name, x, params, pool, ctx);
        None
    }

    /// The activation this layer is, when it applies one and does nothing else (Keras'
    /// `Activation` layer): the layer before it may then compute both, and a max pooling
    /// after them, in one pass ([`Layer::forward_then_activation_max_pool`]).
    fn as_activation(&self) -> Option<Activation> {
        None
    }

    /// This layer, then `activation`, then max pooling `pool`, in one pass; `None` when the
    /// layer has no such pass for that activation, and the network runs them as it would
    /// otherwise. The result must equal the three layers'.
    ///
    /// # Errors
    ///
    /// When a tensor operation fails.
    fn forward_then_activation_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        (activation, pool): (Activation, MaxPool),
        ctx: ForwardContext<'_>,
    ) -> Option<Result<Tensor, NnError>> {
        let _ = (name, x, params, activation, pool, ctx);
        None
    }

    /// The product this layer is, when it is a dense layer `relu?(x · kernel + bias)` whose
    /// variables are its kernel (and bias, after it): a pass whose variables become final
    /// piece by piece then computes it one block of the kernel's rows at a time, as each block
    /// is final ([`lockstep_tensor::ops::DenseByBlocks`], the same bits as its forward pass).
    fn as_dense_product(&self) -> Option<DenseProduct> {
        None
    }

    /// This layer when it is Keras' `BatchNormalization`: the layer before it may then compute
    /// both, and an activation and a max pooling after them, in one pass
    /// ([`Layer::forward_then_batch_norm_max_pool`]).
    fn as_batch_norm(&self) -> Option<&BatchNormalization> {
        None
    }

    /// This layer, then the batch normalization `norm`, `activation` and max pooling `pool`,
    /// in one pass; `None` when the layer has no such pass (or not for these settings), and
    /// the network runs them as it would otherwise. The result must equal the four layers'
    /// up to rounding.
    ///
    /// # Errors
    ///
    /// When a tensor operation fails.
    fn forward_then_batch_norm_max_pool(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        norm: NormalizationStep<'_>,
        (activation, pool): (Activation, MaxPool),
    ) -> Option<Result<Tensor, NnError>> {
        let _ = (name, x, params, norm, activation, pool);
        None
    }
}

/// A batch normalization layer as the layer before it sees it when the two run as one
/// ([`Layer::forward_then_batch_norm_max_pool`]): the layer, its name, its variables and the
/// context of its forward pass (where its statistics are observed).
#[derive(Clone, Copy)]
pub struct NormalizationStep<'a> {
    /// The normalization.
    pub layer: &'a BatchNormalization,
    /// Its name in the model.
    pub name: &'a str,
    /// Its own variables, in declaration order.
    pub params: &'a [Tensor],
    /// The context the network hands it.
    pub ctx: ForwardContext<'a>,
}
