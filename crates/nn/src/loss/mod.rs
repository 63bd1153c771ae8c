//! Keras' losses with their names, reductions and `from_logits`: cross-entropies against class
//! ids ([`SparseCategoricalCrossentropy`]), one-hot or soft labels
//! ([`CategoricalCrossentropy`]) and binary labels ([`BinaryCrossentropy`]), and the
//! regression losses ([`MeanSquaredError`], [`MeanAbsoluteError`], [`Huber`]); a user's own
//! through [`Loss`] or [`FnLoss`].
//!
//! Each loss computes one value per example ([`Loss::per_example`], Keras' "unreduced" loss:
//! the mean or sum over the last axis as Keras takes it), then weights and reduces them
//! ([`Loss::call`]) as `tf.keras.losses.Reduction` says. Every loss is built from
//! `lockstep_tensor` operations, so it runs on the predictions' device and its gradient comes
//! from autograd.

mod crossentropy;
mod regression;
mod sparse;

use std::fmt;

use lockstep_tensor::{Device, Tensor, ops};
use serde::{Deserialize, Serialize};

pub use crossentropy::{BinaryCrossentropy, CategoricalCrossentropy};
pub use regression::{Huber, MeanAbsoluteError, MeanSquaredError};
pub use sparse::SparseCategoricalCrossentropy;

use crate::error::{InLayer, NnError};

/// How per-example losses become the loss, as `tf.keras.losses.Reduction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The sum of the (weighted) per-example losses divided by the number of examples
    /// (Keras' default; with sample weights Keras divides by the count too, not by the
    /// weights' sum).
    #[default]
    SumOverBatchSize,
    /// The sum over the batch: what distributed training divides by the global batch itself.
    Sum,
    /// No reduction: one loss per example.
    None,
}

/// What predictions are compared with: class ids (the sparse losses) or values of the
/// predictions' shape (one-hot or soft labels, binary labels, regression targets).
#[derive(Debug, Clone, Copy)]
pub enum Targets<'a> {
    /// One class id per example.
    ClassIds(&'a [usize]),
    /// A value per prediction, on any device (moved to the predictions').
    Values(&'a Tensor),
}

/// A loss: per-example values from predictions and targets, then weighting and reduction.
///
/// A user's loss implements [`Loss::per_example`] (or wraps a closure in [`FnLoss`]); the
/// weighting and the reduction come with the trait.
pub trait Loss: fmt::Debug + Send + Sync {
    /// The loss's name as Keras logs it (`sparse_categorical_crossentropy`).
    fn name(&self) -> &str;

    /// How the per-example losses are combined.
    fn reduction(&self) -> Reduction;

    /// The settings that rebuild this loss ([`LossConfig::build`]), saved with a compiled
    /// model; `None` for a user's loss, which a loaded model cannot rebuild.
    fn config(&self) -> Option<LossConfig> {
        None
    }

    /// One loss per example, `[batch]`, with its gradient recorded.
    ///
    /// # Errors
    ///
    /// Targets of a kind or shape this loss does not take; a tensor operation's error.
    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError>;

    /// The loss: per-example losses times `sample_weight` (one weight per example) where
    /// given, reduced by [`Loss::reduction`].
    ///
    /// # Errors
    ///
    /// As [`Loss::per_example`]; sample weights of another count than the examples.
    fn call(
        &self,
        predictions: &Tensor,
        targets: Targets<'_>,
        sample_weight: Option<&[f32]>,
    ) -> Result<Tensor, NnError> {
        let per_example = self.per_example(predictions, targets)?;
        reduce_loss(self.name(), &per_example, sample_weight, self.reduction())
    }
}

/// Weights per-example losses `[batch]` (from [`Loss::per_example`]) by `sample_weight` and
/// reduces them: what [`Loss::call`] does with its own reduction, for a caller (a
/// distributed step) that reduces by another.
///
/// # Errors
///
/// Weights of another count than the examples; a tensor operation's error.
pub fn reduce_loss(
    name: &str,
    per_example: &Tensor,
    sample_weight: Option<&[f32]>,
    reduction: Reduction,
) -> Result<Tensor, NnError> {
    let weighted = match sample_weight {
        None => per_example.clone(),
        Some(weights) => {
            if weights.len() != per_example.len() {
                return Err(NnError::Length {
                    what: "sample weights and examples",
                    left: weights.len(),
                    right: per_example.len(),
                });
            }
            let weights = on_device(
                Tensor::from_vec(weights.to_vec(), per_example.shape()).in_layer(name)?,
                per_example.device(),
                name,
            )?;
            ops::mul(per_example, &weights).in_layer(name)?
        }
    };
    match reduction {
        Reduction::None => Ok(weighted),
        Reduction::Sum => ops::sum(&weighted, &[0], false).in_layer(name),
        Reduction::SumOverBatchSize => ops::mean(&weighted, &[0], false).in_layer(name),
    }
}

/// `tensor` on `device` (a no-op when it is there already).
pub(crate) fn on_device(tensor: Tensor, device: Device, name: &str) -> Result<Tensor, NnError> {
    if tensor.device() == device {
        Ok(tensor)
    } else {
        tensor.to_device(device).in_layer(name)
    }
}

/// A tensor of `like`'s shape and device holding `value` everywhere.
pub(crate) fn constant_like(like: &Tensor, value: f32, name: &str) -> Result<Tensor, NnError> {
    on_device(
        Tensor::full(like.shape(), value).in_layer(name)?,
        like.device(),
        name,
    )
}

/// Dense targets of the predictions' shape, on their device; class ids are refused.
pub(crate) fn dense_targets(
    name: &str,
    predictions: &Tensor,
    targets: Targets<'_>,
) -> Result<Tensor, NnError> {
    let Targets::Values(values) = targets else {
        return Err(NnError::InvalidConfig {
            layer: name.to_owned(),
            why: "takes targets of the predictions' shape, not class ids (use the sparse \
                  loss for class ids)"
                .to_owned(),
        });
    };
    let values = same_shape(name, values, predictions.shape())?;
    on_device(values, predictions.device(), name)
}

/// `values` (detached) in `shape`, which it may differ from only by axes of length 1 (Keras
/// expands `(batch,)` targets to the `(batch, 1)` of a single-output model's predictions).
///
/// # Errors
///
/// Shapes that differ otherwise.
pub(crate) fn same_shape(name: &str, values: &Tensor, shape: &[usize]) -> Result<Tensor, NnError> {
    if values.shape() == shape {
        return Ok(values.detach());
    }
    let squeezed = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if values.len() == shape.iter().product::<usize>()
        && squeezed(values.shape()) == squeezed(shape)
    {
        return ops::reshape(&values.detach(), shape).in_layer(name);
    }
    Err(NnError::Shape {
        what: format!("{name} targets"),
        expected: format!("{shape:?} (the predictions' shape)"),
        got: values.shape().to_vec(),
    })
}

/// A built-in loss's settings, by Keras class name: what a saved compiled model records so
/// that loading it compiles it again.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
pub enum LossConfig {
    /// [`SparseCategoricalCrossentropy`].
    SparseCategoricalCrossentropy {
        /// Predictions are logits.
        from_logits: bool,
    },
    /// [`CategoricalCrossentropy`].
    CategoricalCrossentropy {
        /// Predictions are logits.
        from_logits: bool,
        /// Label smoothing.
        label_smoothing: f32,
    },
    /// [`BinaryCrossentropy`].
    BinaryCrossentropy {
        /// Predictions are logits.
        from_logits: bool,
        /// Label smoothing.
        label_smoothing: f32,
    },
    /// [`MeanSquaredError`].
    MeanSquaredError,
    /// [`MeanAbsoluteError`].
    MeanAbsoluteError,
    /// [`Huber`].
    Huber {
        /// Where the loss turns linear.
        delta: f32,
    },
}

impl LossConfig {
    /// The loss these settings describe, with Keras' default reduction.
    pub fn build(&self) -> Box<dyn Loss> {
        match *self {
            Self::SparseCategoricalCrossentropy { from_logits } => {
                Box::new(SparseCategoricalCrossentropy {
                    from_logits,
                    ..Default::default()
                })
            }
            Self::CategoricalCrossentropy {
                from_logits,
                label_smoothing,
            } => Box::new(CategoricalCrossentropy {
                from_logits,
                label_smoothing,
                ..Default::default()
            }),
            Self::BinaryCrossentropy {
                from_logits,
                label_smoothing,
            } => Box::new(BinaryCrossentropy {
                from_logits,
                label_smoothing,
                ..Default::default()
            }),
            Self::MeanSquaredError => Box::new(MeanSquaredError::default()),
            Self::MeanAbsoluteError => Box::new(MeanAbsoluteError::default()),
            Self::Huber { delta } => Box::new(Huber {
                delta,
                ..Default::default()
            }),
        }
    }
}

/// The mean over the last axis: `[batch, …, n]` → `[batch, …]`, Keras' per-example reduction.
pub(crate) fn mean_last_axis(x: &Tensor, name: &str) -> Result<Tensor, NnError> {
    match x.rank() {
        0 => Err(NnError::Shape {
            what: name.to_owned(),
            expected: "(batch, …)".to_owned(),
            got: Vec::new(),
        }),
        1 => Ok(x.clone()),
        rank => {
            let axes: Vec<usize> = (1..rank).collect();
            ops::mean(x, &axes, false).in_layer(name)
        }
    }
}

/// A loss from a closure that computes the per-example losses: a user's own loss without a
/// type of its own.
///
/// ```
/// use lockstep_nn::{FnLoss, Loss, NnError, Reduction, Targets};
/// use lockstep_tensor::{Tensor, ops};
///
/// // The mean of the predictions' squares, whatever the targets.
/// let energy = FnLoss::new("energy", Reduction::Sum, |p: &Tensor, _: Targets<'_>| {
///     let squares = ops::mul(p, p).map_err(|e| NnError::Tensor { layer: "energy".into(), source: e })?;
///     ops::mean(&squares, &[1], false).map_err(|e| NnError::Tensor { layer: "energy".into(), source: e })
/// });
/// let p = Tensor::from_vec(vec![1.0, 3.0, 2.0, 2.0], &[2, 2])?;
/// let loss = energy.call(&p, Targets::ClassIds(&[0, 0]), None)?;
/// assert_eq!(loss.item()?, 9.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FnLoss<F> {
    name: String,
    reduction: Reduction,
    per_example: F,
}

impl<F> FnLoss<F>
where
    F: Fn(&Tensor, Targets<'_>) -> Result<Tensor, NnError> + Send + Sync,
{
    /// A loss named `name` whose per-example values `per_example` computes.
    pub fn new(name: impl Into<String>, reduction: Reduction, per_example: F) -> Self {
        Self {
            name: name.into(),
            reduction,
            per_example,
        }
    }
}

impl<F> fmt::Debug for FnLoss<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnLoss")
            .field("name", &self.name)
            .field("reduction", &self.reduction)
            .finish_non_exhaustive()
    }
}

impl<F> Loss for FnLoss<F>
where
    F: Fn(&Tensor, Targets<'_>) -> Result<Tensor, NnError> + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        (self.per_example)(predictions, targets)
    }
}
