//! Keras' `SparseCategoricalCrossentropy`: class ids against class scores.

use lockstep_tensor::{Tensor, ops};

use super::{Loss, LossConfig, Reduction, Targets, reduce_loss};
use crate::error::{InLayer, NnError};

/// Cross-entropy between integer labels and predicted class scores.
///
/// ```
/// use lockstep_nn::{Reduction, SparseCategoricalCrossentropy};
/// use lockstep_tensor::Tensor;
///
/// let loss = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::SumOverBatchSize };
/// let logits = Tensor::from_vec(vec![0.0, 0.0, 0.0, 0.0], &[2, 2])?;
/// let value = loss.call(&logits, &[0, 1])?;
/// assert!((value.item()? - 2.0_f32.ln()).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SparseCategoricalCrossentropy {
    /// Predictions are logits (the fused, stable path) rather than probabilities.
    pub from_logits: bool,
    /// How to combine the per-example losses.
    pub reduction: Reduction,
}

/// Keras clips probabilities to `[ε, 1 − ε]` before taking logs.
pub(crate) const EPSILON: f32 = 1e-7;

const NAME: &str = "sparse_categorical_crossentropy";

impl SparseCategoricalCrossentropy {
    /// The loss of predictions `[batch, classes]` against `labels`.
    ///
    /// # Errors
    ///
    /// When the predictions are not `[batch, classes]`, the label count differs, or a label is
    /// not a class.
    pub fn call(&self, predictions: &Tensor, labels: &[usize]) -> Result<Tensor, NnError> {
        let per_example = self.per_example_of(predictions, labels)?;
        reduce_loss(NAME, &per_example, None, self.reduction)
    }

    fn per_example_of(self, predictions: &Tensor, labels: &[usize]) -> Result<Tensor, NnError> {
        let logits = if self.from_logits {
            predictions.clone()
        } else {
            // softmax(log p) = p / Σp: Keras' normalisation of probabilities, then its log.
            ops::log(&ops::clip(predictions, EPSILON, 1.0 - EPSILON).in_layer(NAME)?)
                .in_layer(NAME)?
        };
        ops::sparse_softmax_cross_entropy_with_logits(&logits, labels).in_layer(NAME)
    }
}

impl Loss for SparseCategoricalCrossentropy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn config(&self) -> Option<LossConfig> {
        Some(LossConfig::SparseCategoricalCrossentropy {
            from_logits: self.from_logits,
        })
    }

    fn per_example(&self, predictions: &Tensor, targets: Targets<'_>) -> Result<Tensor, NnError> {
        match targets {
            Targets::ClassIds(labels) => self.per_example_of(predictions, labels),
            Targets::Values(values) => {
                // Keras takes float class ids too (the guide casts labels to float32).
                let ids = class_ids(values)?;
                self.per_example_of(predictions, &ids)
            }
        }
    }
}

/// Class ids held as values (`[batch]` or `[batch, 1]`): each a whole number, at least 0.
fn class_ids(values: &Tensor) -> Result<Vec<usize>, NnError> {
    if !(values.rank() == 1 || (values.rank() == 2 && values.shape()[1] == 1)) {
        return Err(NnError::Shape {
            what: format!("{NAME} targets"),
            expected: "(batch,) or (batch, 1) class ids".to_owned(),
            got: values.shape().to_vec(),
        });
    }
    values
        .to_vec()
        .in_layer(NAME)?
        .into_iter()
        .map(|v| {
            if v >= 0.0 && v.fract() == 0.0 && v < 16_777_216.0 {
                Ok(v as usize)
            } else {
                Err(NnError::InvalidConfig {
                    layer: NAME.to_owned(),
                    why: format!("target {v} is not a class id"),
                })
            }
        })
        .collect()
}
