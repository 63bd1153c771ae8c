//! Metrics whose state merges: replicas each update their own, then combine (sum) states.

use lockstep_tensor::{Tensor, ops};

use crate::error::{InLayer, NnError};

/// A running statistic whose state is a few numbers that add across replicas.
pub trait Metric {
    /// The current value.
    fn result(&self) -> f64;
    /// Forgets everything seen.
    fn reset(&mut self);
    /// The state, to all-reduce (sum) across replicas.
    fn state(&self) -> Vec<f64>;
    /// Replaces the state with a merged one.
    ///
    /// # Errors
    ///
    /// When `state` has the wrong length.
    fn set_state(&mut self, state: &[f64]) -> Result<(), NnError>;

    /// Adds another replica's state into this one.
    ///
    /// # Errors
    ///
    /// When the states have different lengths.
    fn merge(&mut self, other: &dyn Metric) -> Result<(), NnError> {
        let summed: Vec<f64> = self
            .state()
            .iter()
            .zip(other.state())
            .map(|(a, b)| a + b)
            .collect();
        if summed.len() != self.state().len() {
            return Err(NnError::Length {
                what: "metric states",
                left: self.state().len(),
                right: other.state().len(),
            });
        }
        self.set_state(&summed)
    }
}

fn two(state: &[f64]) -> Result<(f64, f64), NnError> {
    match state {
        &[a, b] => Ok((a, b)),
        other => Err(NnError::Length {
            what: "metric state",
            left: other.len(),
            right: 2,
        }),
    }
}

/// Keras' `SparseCategoricalAccuracy`: the fraction of examples whose highest score is the
/// label.
///
/// ```
/// use lockstep_nn::{Metric, SparseCategoricalAccuracy};
/// use lockstep_tensor::Tensor;
///
/// let mut accuracy = SparseCategoricalAccuracy::default();
/// accuracy.update(&Tensor::from_vec(vec![0.1, 0.9, 0.8, 0.2], &[2, 2])?, &[1, 1])?;
/// assert_eq!(accuracy.result(), 0.5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SparseCategoricalAccuracy {
    correct: f64,
    total: f64,
}

impl SparseCategoricalAccuracy {
    /// Counts a batch of predictions `[batch, classes]` against labels.
    ///
    /// # Errors
    ///
    /// When predictions are not 2-D or the label count differs.
    pub fn update(&mut self, predictions: &Tensor, labels: &[usize]) -> Result<(), NnError> {
        let predicted = ops::argmax(predictions).in_layer("sparse_categorical_accuracy")?;
        if predicted.len() != labels.len() {
            return Err(NnError::Length {
                what: "predictions and labels",
                left: predicted.len(),
                right: labels.len(),
            });
        }
        self.correct += predicted.iter().zip(labels).filter(|(p, l)| p == l).count() as f64;
        self.total += labels.len() as f64;
        Ok(())
    }
}

impl Metric for SparseCategoricalAccuracy {
    fn result(&self) -> f64 {
        if self.total == 0.0 {
            0.0
        } else {
            self.correct / self.total
        }
    }
    fn reset(&mut self) {
        *self = Self::default();
    }
    fn state(&self) -> Vec<f64> {
        vec![self.correct, self.total]
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
        (self.correct, self.total) = two(state)?;
        Ok(())
    }
}

/// Keras' `Mean`: a weighted running mean (of the loss, say).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Mean {
    total: f64,
    count: f64,
}

impl Mean {
    /// Adds `value` with weight `weight` (the batch size, for a batch's mean loss).
    pub fn update(&mut self, value: f64, weight: f64) {
        self.total += value * weight;
        self.count += weight;
    }
}

impl Metric for Mean {
    fn result(&self) -> f64 {
        if self.count == 0.0 {
            0.0
        } else {
            self.total / self.count
        }
    }
    fn reset(&mut self) {
        *self = Self::default();
    }
    fn state(&self) -> Vec<f64> {
        vec![self.total, self.count]
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
        (self.total, self.count) = two(state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_replicas_equal_one_metric_over_all_data() {
        let (mut a, mut b) = (Mean::default(), Mean::default());
        a.update(1.0, 3.0);
        b.update(3.0, 1.0);
        a.merge(&b).unwrap();
        assert_eq!(a.result(), 1.5);
        let mut all = Mean::default();
        all.update(1.0, 3.0);
        all.update(3.0, 1.0);
        assert_eq!(all, a);
        assert!(a.set_state(&[1.0]).is_err());
    }
}
