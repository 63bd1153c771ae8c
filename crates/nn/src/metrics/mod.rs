//! Metrics whose state merges: replicas each update their own, then combine (sum) states.
//!
//! Keras' metrics of predictions against targets ([`PredictionMetric`], each under the name
//! Keras logs it by): accuracies ([`SparseCategoricalAccuracy`], [`CategoricalAccuracy`],
//! [`BinaryAccuracy`], [`TopKCategoricalAccuracy`]), regression errors ([`MeanSquaredError`],
//! [`MeanAbsoluteError`]) and the confusion-matrix metrics ([`Precision`], [`Recall`],
//! [`Auc`]). Each keeps sums that add across replicas (weighted by sample weights where
//! given), so a metric all-reduced with a step's gradients is exact over the global batch.

mod accuracy;
mod confusion;

pub use accuracy::{
    BinaryAccuracy, CategoricalAccuracy, MeanAbsoluteError, MeanSquaredError,
    TopKCategoricalAccuracy,
};
pub use confusion::{Auc, Precision, Recall};

use lockstep_tensor::{Tensor, ops};

use crate::error::{InLayer, NnError};
use crate::loss::Targets;

/// A metric of predictions against targets, as Keras' `update_state(y_true, y_pred,
/// sample_weight)`, logged under [`PredictionMetric::name`].
pub trait PredictionMetric: Metric + Send + Sync {
    /// The name Keras logs it under (`sparse_categorical_accuracy`, `auc`, …).
    fn name(&self) -> &str;

    /// Adds a batch: predictions `[batch, …]` against targets, each example weighted by
    /// `sample_weight` where given.
    ///
    /// # Errors
    ///
    /// Targets of a kind or shape the metric cannot compare; weights of another count than
    /// the examples.
    fn update_state(
        &mut self,
        predictions: &Tensor,
        targets: Targets<'_>,
        sample_weight: Option<&[f32]>,
    ) -> Result<(), NnError>;

    /// A fresh metric with the same settings.
    fn fresh(&self) -> Box<dyn PredictionMetric>;
}

/// The metric Keras' `compile(metrics=[name])` makes of `name`, with Keras' defaults;
/// `accuracy` (or `acc`) is the sparse categorical accuracy, logged as `accuracy`.
pub fn metric_by_name(name: &str) -> Option<Box<dyn PredictionMetric>> {
    Some(match name {
        "accuracy" | "acc" => Box::new(SparseCategoricalAccuracy::named("accuracy")),
        "sparse_categorical_accuracy" => Box::new(SparseCategoricalAccuracy::default()),
        "categorical_accuracy" => Box::new(CategoricalAccuracy::default()),
        "binary_accuracy" => Box::new(BinaryAccuracy::default()),
        "top_k_categorical_accuracy" => Box::new(TopKCategoricalAccuracy::default()),
        "mean_squared_error" | "mse" => Box::new(MeanSquaredError::default()),
        "mean_absolute_error" | "mae" => Box::new(MeanAbsoluteError::default()),
        "precision" => Box::new(Precision::default()),
        "recall" => Box::new(Recall::default()),
        "auc" => Box::new(Auc::default()),
        _ => return None,
    })
}

/// The names [`metric_by_name`] knows, for error messages.
pub const METRIC_NAMES: &[&str] = &[
    "accuracy",
    "sparse_categorical_accuracy",
    "categorical_accuracy",
    "binary_accuracy",
    "top_k_categorical_accuracy",
    "mean_squared_error",
    "mean_absolute_error",
    "precision",
    "recall",
    "auc",
];

/// The predictions and targets of a batch on the host, with one weight per example.
pub(crate) struct HostBatch {
    /// Examples in the batch.
    pub(crate) rows: usize,
    /// Predictions, row-major, `rows × width`.
    pub(crate) predictions: Vec<f32>,
    /// Values per example of the predictions.
    pub(crate) width: usize,
    /// Weights, one per example (1 without sample weights).
    pub(crate) weights: Vec<f64>,
}

impl HostBatch {
    pub(crate) fn new(
        name: &str,
        predictions: &Tensor,
        sample_weight: Option<&[f32]>,
    ) -> Result<Self, NnError> {
        let rows = predictions.shape().first().copied().unwrap_or(0);
        let values = predictions.to_vec().in_layer(name)?;
        let width = values.len().checked_div(rows).unwrap_or(0);
        let weights = match sample_weight {
            None => vec![1.0; rows],
            Some(w) if w.len() == rows => w.iter().map(|&w| f64::from(w)).collect(),
            Some(w) => {
                return Err(NnError::Length {
                    what: "sample weights and examples",
                    left: w.len(),
                    right: rows,
                });
            }
        };
        Ok(Self {
            rows,
            predictions: values,
            width,
            weights,
        })
    }

    /// The targets as values of the predictions' shape, on the host.
    pub(crate) fn dense_targets(
        name: &str,
        predictions: &Tensor,
        targets: Targets<'_>,
    ) -> Result<Vec<f32>, NnError> {
        match targets {
            Targets::Values(values) => crate::loss::same_shape(name, values, predictions.shape())?
                .to_vec()
                .in_layer(name),
            Targets::ClassIds(_) => Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: "compares targets of the predictions' shape, not class ids".to_owned(),
            }),
        }
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SparseCategoricalAccuracy {
    correct: f64,
    total: f64,
    name: &'static str,
}

impl Default for SparseCategoricalAccuracy {
    fn default() -> Self {
        Self::named("sparse_categorical_accuracy")
    }
}

impl SparseCategoricalAccuracy {
    /// The metric, logged as `name` (`compile(metrics=["accuracy"])` logs `accuracy`).
    pub fn named(name: &'static str) -> Self {
        Self {
            correct: 0.0,
            total: 0.0,
            name,
        }
    }

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
        *self = Self::named(self.name);
    }
    fn state(&self) -> Vec<f64> {
        vec![self.correct, self.total]
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
        (self.correct, self.total) = two(state)?;
        Ok(())
    }
}

impl PredictionMetric for SparseCategoricalAccuracy {
    fn name(&self) -> &str {
        self.name
    }

    fn update_state(
        &mut self,
        predictions: &Tensor,
        targets: Targets<'_>,
        sample_weight: Option<&[f32]>,
    ) -> Result<(), NnError> {
        let batch = HostBatch::new(self.name, predictions, sample_weight)?;
        let ids: Vec<f64> = match targets {
            Targets::ClassIds(ids) => ids.iter().map(|&i| i as f64).collect(),
            Targets::Values(values) if values.len() == batch.rows => values
                .to_vec()
                .in_layer(self.name)?
                .into_iter()
                .map(f64::from)
                .collect(),
            Targets::Values(values) => {
                return Err(NnError::Shape {
                    what: format!("{} targets", self.name),
                    expected: "(batch,) or (batch, 1) class ids".to_owned(),
                    got: values.shape().to_vec(),
                });
            }
        };
        if ids.len() != batch.rows {
            return Err(NnError::Length {
                what: "predictions and labels",
                left: batch.rows,
                right: ids.len(),
            });
        }
        for ((row, id), w) in batch
            .predictions
            .chunks(batch.width.max(1))
            .zip(&ids)
            .zip(&batch.weights)
        {
            if accuracy::argmax(row) as f64 == *id {
                self.correct += w;
            }
            self.total += w;
        }
        Ok(())
    }

    fn fresh(&self) -> Box<dyn PredictionMetric> {
        Box::new(Self::named(self.name))
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
