//! Metrics that average a value per example: Keras' `CategoricalAccuracy`, `BinaryAccuracy`,
//! `TopKCategoricalAccuracy`, `MeanSquaredError` and `MeanAbsoluteError` (its
//! `MeanMetricWrapper`s), each a weighted sum and the sum of weights.

use lockstep_tensor::Tensor;

use super::{HostBatch, Metric, PredictionMetric, two};
use crate::error::NnError;
use crate::loss::Targets;

/// The index of the first largest value (NaN counts as largest, as the CPU's argmax takes it).
pub(crate) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate().skip(1) {
        if v > row[best] || (v.is_nan() && !row[best].is_nan()) {
            best = i;
        }
    }
    best
}

/// What a mean-of-examples metric computes per example, from its predictions and targets.
type PerExample = fn(&MeanOfExamples, &[f32], &[f32]) -> f64;

/// A weighted mean of a per-example value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MeanOfExamples {
    total: f64,
    count: f64,
    threshold: f32,
    k: usize,
}

impl MeanOfExamples {
    const fn new(threshold: f32, k: usize) -> Self {
        Self {
            total: 0.0,
            count: 0.0,
            threshold,
            k,
        }
    }

    fn update(
        &mut self,
        name: &str,
        per_example: PerExample,
        (predictions, targets, sample_weight): (&Tensor, Targets<'_>, Option<&[f32]>),
    ) -> Result<(), NnError> {
        let batch = HostBatch::new(name, predictions, sample_weight)?;
        let targets = HostBatch::dense_targets(name, predictions, targets)?;
        let width = batch.width.max(1);
        for ((p, t), w) in batch
            .predictions
            .chunks(width)
            .zip(targets.chunks(width))
            .zip(&batch.weights)
        {
            self.total += w * per_example(self, p, t);
            self.count += w;
        }
        Ok(())
    }

    fn result(&self) -> f64 {
        if self.count == 0.0 {
            0.0
        } else {
            self.total / self.count
        }
    }
}

/// Implements the metric traits for a `MeanOfExamples` newtype.
macro_rules! mean_metric {
    ($metric:ident, $name:literal, $per_example:expr) => {
        impl Metric for $metric {
            fn result(&self) -> f64 {
                self.0.result()
            }
            fn reset(&mut self) {
                self.0.total = 0.0;
                self.0.count = 0.0;
            }
            fn state(&self) -> Vec<f64> {
                vec![self.0.total, self.0.count]
            }
            fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
                (self.0.total, self.0.count) = two(state)?;
                Ok(())
            }
        }

        impl PredictionMetric for $metric {
            fn name(&self) -> &'static str {
                $name
            }

            fn update_state(
                &mut self,
                predictions: &Tensor,
                targets: Targets<'_>,
                sample_weight: Option<&[f32]>,
            ) -> Result<(), NnError> {
                self.0
                    .update($name, $per_example, (predictions, targets, sample_weight))
            }

            fn fresh(&self) -> Box<dyn PredictionMetric> {
                let mut fresh = self.clone();
                fresh.reset();
                Box::new(fresh)
            }
        }
    };
}

/// Keras' `CategoricalAccuracy`: examples whose highest prediction is where the one-hot (or
/// soft) target is highest.
///
/// ```
/// use lockstep_nn::{Metric, PredictionMetric, Targets, metrics::CategoricalAccuracy};
/// use lockstep_tensor::Tensor;
///
/// let mut m = CategoricalAccuracy::default();
/// let y = Tensor::from_vec(vec![0.0, 0.0, 1.0, 0.0, 1.0, 0.0], &[2, 3])?;
/// let p = Tensor::from_vec(vec![0.1, 0.9, 0.8, 0.05, 0.95, 0.0], &[2, 3])?;
/// m.update_state(&p, Targets::Values(&y), None)?;
/// assert_eq!(m.result(), 0.5); // Keras' documented example
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CategoricalAccuracy(MeanOfExamples);

impl Default for CategoricalAccuracy {
    fn default() -> Self {
        Self(MeanOfExamples::new(0.0, 0))
    }
}

mean_metric!(CategoricalAccuracy, "categorical_accuracy", |_, p, t| {
    f64::from(u8::from(argmax(p) == argmax(t)))
});

/// Keras' `BinaryAccuracy`: per example, the share of outputs whose prediction, above
/// `threshold` (0.5) or not, equals the 0/1 target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BinaryAccuracy(MeanOfExamples);

impl BinaryAccuracy {
    /// With a threshold other than 0.5 (0 for logits).
    pub fn with_threshold(threshold: f32) -> Self {
        Self(MeanOfExamples::new(threshold, 0))
    }
}

impl Default for BinaryAccuracy {
    fn default() -> Self {
        Self::with_threshold(0.5)
    }
}

mean_metric!(BinaryAccuracy, "binary_accuracy", |m, p, t| {
    let equal = p
        .iter()
        .zip(t)
        .filter(|(p, t)| f32::from(u8::from(**p > m.threshold)) == **t)
        .count();
    equal as f64 / p.len().max(1) as f64
});

/// Keras' `TopKCategoricalAccuracy`: examples whose target class (the one-hot target's
/// highest) is among the `k` (5) highest predictions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKCategoricalAccuracy(MeanOfExamples);

impl TopKCategoricalAccuracy {
    /// With `k` other than 5.
    pub fn with_k(k: usize) -> Self {
        Self(MeanOfExamples::new(0.0, k))
    }
}

impl Default for TopKCategoricalAccuracy {
    fn default() -> Self {
        Self::with_k(5)
    }
}

mean_metric!(
    TopKCategoricalAccuracy,
    "top_k_categorical_accuracy",
    |m, p, t| {
        let target = p[argmax(t)];
        let above = p.iter().filter(|&&v| v > target).count();
        f64::from(u8::from(above < m.k))
    }
);

/// Keras' `MeanSquaredError` metric: the mean over examples of the mean of `(p − y)²`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanSquaredError(MeanOfExamples);

impl Default for MeanSquaredError {
    fn default() -> Self {
        Self(MeanOfExamples::new(0.0, 0))
    }
}

mean_metric!(MeanSquaredError, "mean_squared_error", |_, p, t| {
    let sum: f64 = p
        .iter()
        .zip(t)
        .map(|(p, t)| (f64::from(*p) - f64::from(*t)).powi(2))
        .sum();
    sum / p.len().max(1) as f64
});

/// Keras' `MeanAbsoluteError` metric: the mean over examples of the mean of `|p − y|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanAbsoluteError(MeanOfExamples);

impl Default for MeanAbsoluteError {
    fn default() -> Self {
        Self(MeanOfExamples::new(0.0, 0))
    }
}

mean_metric!(MeanAbsoluteError, "mean_absolute_error", |_, p, t| {
    let sum: f64 = p
        .iter()
        .zip(t)
        .map(|(p, t)| (f64::from(*p) - f64::from(*t)).abs())
        .sum();
    sum / p.len().max(1) as f64
});
