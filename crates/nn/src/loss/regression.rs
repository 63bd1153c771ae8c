//! Keras' regression losses: `MeanSquaredError`, `MeanAbsoluteError` and `Huber`, each the
//! mean over the last axis of an element-wise error.

use lockstep_tensor::{Tensor, ops};

use super::{Loss, LossConfig, Reduction, Targets, dense_targets, mean_last_axis};
use crate::error::{InLayer, NnError};

/// The mean of `(p − y)²` over the last axis, as Keras' `MeanSquaredError`.
///
/// ```
/// use lockstep_nn::{Loss, MeanSquaredError, Targets};
/// use lockstep_tensor::Tensor;
///
/// let p = Tensor::from_vec(vec![1.0, 2.0, 3.0, 5.0], &[2, 2])?;
/// let y = Tensor::from_vec(vec![1.0, 0.0, 3.0, 4.0], &[2, 2])?;
/// let value = MeanSquaredError::default().call(&p, Targets::Values(&y), None)?;
/// assert_eq!(value.item()?, 1.25); // (4/2 + 1/2) / 2
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MeanSquaredError {
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

impl Loss for MeanSquaredError {
    fn name(&self) -> &'static str {
        "mean_squared_error"
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::MeanSquaredError)
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        let name = self.name();
        let d = difference(name, predictions, targets)?;
        mean_last_axis(&ops::mul(&d, &d).in_layer(name)?, name)
    }
}

/// The mean of `|p − y|` over the last axis, as Keras' `MeanAbsoluteError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MeanAbsoluteError {
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

impl Loss for MeanAbsoluteError {
    fn name(&self) -> &'static str {
        "mean_absolute_error"
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::MeanAbsoluteError)
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        let name = self.name();
        let d = difference(name, predictions, targets)?;
        mean_last_axis(&ops::abs(&d).in_layer(name)?, name)
    }
}

/// The mean over the last axis of Huber's loss of `d = p − y`: `½d²` where `|d| ≤ δ`, else
/// `δ·(|d| − ½δ)`, as Keras' `Huber` (δ = 1 by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Huber {
    /// Where the loss turns from quadratic to linear.
    pub delta: f32,
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

impl Default for Huber {
    fn default() -> Self {
        Self {
            delta: 1.0,
            reduction: Reduction::default(),
        }
    }
}

impl Loss for Huber {
    fn name(&self) -> &'static str {
        "huber_loss"
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::Huber { delta: self.delta })
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        let name = self.name();
        if !(self.delta > 0.0 && self.delta.is_finite()) {
            return Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!("delta {} must be positive", self.delta),
            });
        }
        let d = difference(name, predictions, targets)?;
        // With q = min(|d|, δ): q·(|d| − ½q) is ½d² inside and δ·(|d| − ½δ) outside, and
        // its gradient (q passes none outside) is d inside and δ·sign(d) outside.
        let a = ops::abs(&d).in_layer(name)?;
        let q = ops::clip(&a, 0.0, self.delta).in_layer(name)?;
        let rest = ops::sub(&a, &ops::scale(&q, 0.5).in_layer(name)?).in_layer(name)?;
        mean_last_axis(&ops::mul(&q, &rest).in_layer(name)?, name)
    }
}

/// `p − y` for targets of the predictions' shape.
fn difference(name: &str, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
    let y = dense_targets(name, predictions, targets)?;
    ops::sub(predictions, &y).in_layer(name)
}
