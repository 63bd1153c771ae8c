//! Keras' `CategoricalCrossentropy` (one-hot or soft labels over classes, label smoothing) and
//! `BinaryCrossentropy` (a probability per output).

use lockstep_tensor::{Device, Tensor, ops};

use super::sparse::EPSILON;
use super::{Loss, LossConfig, Reduction, Targets, constant_like, dense_targets, mean_last_axis};
use crate::error::{InLayer, NnError};

/// Cross-entropy between label distributions (one-hot or soft) and predicted class scores
/// `[batch, classes]`, as Keras' `CategoricalCrossentropy`: `−Σ y·log p` per example, with
/// labels smoothed towards uniform (`y·(1 − α) + α / classes`) when `label_smoothing` is `α`.
///
/// From probabilities, Keras first scales each row to sum to 1 and clips to `[ε, 1 − ε]`; that
/// scaling broadcasts a row's sum over the row, which runs on the CPU. From logits the
/// per-example loss is `−Σ y·log_softmax(x)` (on a GPU, `log` of the clipped softmax).
///
/// ```
/// use lockstep_nn::{CategoricalCrossentropy, Loss, Targets};
/// use lockstep_tensor::Tensor;
///
/// // Keras' documented example.
/// let loss = CategoricalCrossentropy::default();
/// let p = Tensor::from_vec(vec![0.05, 0.95, 0.0, 0.1, 0.8, 0.1], &[2, 3])?;
/// let y = Tensor::from_vec(vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0], &[2, 3])?;
/// let value = loss.call(&p, Targets::Values(&y), None)?.item()?;
/// assert!((value - 1.177).abs() < 1e-3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CategoricalCrossentropy {
    /// Predictions are logits rather than probabilities.
    pub from_logits: bool,
    /// How far labels move towards the uniform distribution, in `[0, 1]`.
    pub label_smoothing: f32,
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

impl Loss for CategoricalCrossentropy {
    fn name(&self) -> &'static str {
        "categorical_crossentropy"
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::CategoricalCrossentropy {
            from_logits: self.from_logits,
            label_smoothing: self.label_smoothing,
        })
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        let name = self.name();
        if predictions.rank() != 2 {
            return Err(NnError::Shape {
                what: format!("{name} predictions"),
                expected: "(batch, classes)".to_owned(),
                got: predictions.shape().to_vec(),
            });
        }
        let y = smoothed(
            name,
            &dense_targets(name, predictions, targets)?,
            self.label_smoothing,
            predictions.shape()[1] as f32,
        )?;
        let log_p = if self.from_logits {
            if predictions.device() == Device::Cpu {
                ops::log_softmax(predictions, -1).in_layer(name)?
            } else {
                let p = ops::softmax(predictions, -1).in_layer(name)?;
                ops::log(&ops::clip(&p, f32::MIN_POSITIVE, 1.0).in_layer(name)?).in_layer(name)?
            }
        } else {
            let total = ops::sum(predictions, &[1], true).in_layer(name)?;
            let p = ops::div(predictions, &total).in_layer(name)?;
            ops::log(&ops::clip(&p, EPSILON, 1.0 - EPSILON).in_layer(name)?).in_layer(name)?
        };
        let terms = ops::mul(&y, &log_p).in_layer(name)?;
        ops::scale(&ops::sum(&terms, &[1], false).in_layer(name)?, -1.0).in_layer(name)
    }
}

/// `y·(1 − α) + α / classes` (`classes` 2 for a binary label's two outcomes).
fn smoothed(name: &str, y: &Tensor, alpha: f32, classes: f32) -> Result<Tensor, NnError> {
    if !(0.0..=1.0).contains(&alpha) {
        return Err(NnError::InvalidConfig {
            layer: name.to_owned(),
            why: format!("label_smoothing {alpha} is outside [0, 1]"),
        });
    }
    if alpha == 0.0 {
        return Ok(y.clone());
    }
    let kept = ops::scale(y, 1.0 - alpha).in_layer(name)?;
    ops::add(&kept, &constant_like(y, alpha / classes, name)?).in_layer(name)
}

/// Cross-entropy between binary labels (or probabilities) and predictions of the same shape,
/// as Keras' `BinaryCrossentropy`: the mean over the last axis of
/// `−(y·log(p + ε) + (1 − y)·log(1 − p + ε))` with `p` clipped to `[ε, 1 − ε]`, or from logits
/// `softplus(x) − x·y`; labels smoothed towards ½ when `label_smoothing` is set.
///
/// `softplus(x) = log(1 + eˣ)` is taken as `log(1 + e^min(x, 30)) + max(x − 30, 0)`: no
/// overflow for any `x` (past 30 the two differ by less than `e⁻³⁰`), and autograd's gradient
/// is `sigmoid(x)` everywhere, 0 included (the textbook `max(x, 0) + log(1 + e^−|x|)` has
/// kinks at 0 that autograd would resolve to the wrong side).
///
/// ```
/// use lockstep_nn::{BinaryCrossentropy, Loss, Targets};
/// use lockstep_tensor::Tensor;
///
/// let loss = BinaryCrossentropy { from_logits: true, ..Default::default() };
/// let logits = Tensor::from_vec(vec![0.0, 0.0], &[2, 1])?;
/// let y = Tensor::from_vec(vec![1.0, 0.0], &[2, 1])?;
/// let value = loss.call(&logits, Targets::Values(&y), None)?.item()?;
/// assert!((value - 2.0_f32.ln()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BinaryCrossentropy {
    /// Predictions are logits rather than probabilities.
    pub from_logits: bool,
    /// How far labels move towards ½, in `[0, 1]`.
    pub label_smoothing: f32,
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

impl Loss for BinaryCrossentropy {
    fn name(&self) -> &'static str {
        "binary_crossentropy"
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::BinaryCrossentropy {
            from_logits: self.from_logits,
            label_smoothing: self.label_smoothing,
        })
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        let name = self.name();
        let y = smoothed(
            name,
            &dense_targets(name, predictions, targets)?,
            self.label_smoothing,
            2.0,
        )?;
        let elementwise = if self.from_logits {
            let x = predictions;
            let xy = ops::mul(x, &y).in_layer(name)?;
            ops::sub(&softplus(name, x)?, &xy).in_layer(name)?
        } else {
            let eps = constant_like(predictions, EPSILON, name)?;
            let one = constant_like(predictions, 1.0, name)?;
            let p = ops::clip(predictions, EPSILON, 1.0 - EPSILON).in_layer(name)?;
            let log_p = ops::log(&ops::add(&p, &eps).in_layer(name)?).in_layer(name)?;
            let q = ops::sub(&one, &p).in_layer(name)?;
            let log_q = ops::log(&ops::add(&q, &eps).in_layer(name)?).in_layer(name)?;
            let not_y = ops::sub(&one, &y).in_layer(name)?;
            let both = ops::add(
                &ops::mul(&y, &log_p).in_layer(name)?,
                &ops::mul(&not_y, &log_q).in_layer(name)?,
            )
            .in_layer(name)?;
            ops::scale(&both, -1.0).in_layer(name)?
        };
        mean_last_axis(&elementwise, name)
    }
}

/// Where [`softplus`] turns to the identity: `log(1 + e³⁰)` is 30 in `f32`.
const SOFTPLUS_LINEAR_FROM: f32 = 30.0;

/// `log(1 + eˣ)`, overflow-free, with the exact gradient `sigmoid(x)` (see
/// [`BinaryCrossentropy`]).
fn softplus(name: &str, x: &Tensor) -> Result<Tensor, NnError> {
    let bounded = ops::clip(x, f32::MIN, SOFTPLUS_LINEAR_FROM).in_layer(name)?;
    let one = constant_like(x, 1.0, name)?;
    let curve = ops::log(&ops::add(&ops::exp(&bounded).in_layer(name)?, &one).in_layer(name)?)
        .in_layer(name)?;
    let past = ops::add(x, &constant_like(x, -SOFTPLUS_LINEAR_FROM, name)?).in_layer(name)?;
    ops::add(&curve, &ops::relu(&past).in_layer(name)?).in_layer(name)
}
