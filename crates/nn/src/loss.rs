//! Keras' `SparseCategoricalCrossentropy`.

use lockstep_tensor::{Tensor, ops};

use crate::error::{InLayer, NnError};

/// How per-example losses become the loss, as `tf.keras.losses.Reduction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over the batch (Keras' default).
    #[default]
    SumOverBatchSize,
    /// The sum over the batch: what distributed training divides by the global batch itself.
    Sum,
    /// No reduction: one loss per example.
    None,
}

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
const EPSILON: f32 = 1e-7;

impl SparseCategoricalCrossentropy {
    /// The loss of predictions `[batch, classes]` against `labels`.
    ///
    /// # Errors
    ///
    /// When the predictions are not `[batch, classes]`, the label count differs, or a label is
    /// not a class.
    pub fn call(&self, predictions: &Tensor, labels: &[usize]) -> Result<Tensor, NnError> {
        const NAME: &str = "sparse_categorical_crossentropy";
        let logits = if self.from_logits {
            predictions.clone()
        } else {
            // softmax(log p) = p / Σp: Keras' normalisation of probabilities, then its log.
            ops::log(&ops::clip(predictions, EPSILON, 1.0 - EPSILON).in_layer(NAME)?)
                .in_layer(NAME)?
        };
        let per_example =
            ops::sparse_softmax_cross_entropy_with_logits(&logits, labels).in_layer(NAME)?;
        match self.reduction {
            Reduction::None => Ok(per_example),
            Reduction::Sum => ops::sum(&per_example, &[0], false).in_layer(NAME),
            Reduction::SumOverBatchSize => ops::mean(&per_example, &[0], false).in_layer(NAME),
        }
    }
}
