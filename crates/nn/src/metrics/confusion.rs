//! Metrics of the confusion matrix at thresholds: Keras' `Precision`, `Recall` (at 0.5) and
//! `AUC` (the area under the ROC curve, from counts at 200 thresholds). Every output of every
//! example is one decision; a target above 0.5 (Keras casts it to a boolean: any non-zero) is
//! a positive.

use lockstep_tensor::Tensor;

use super::{HostBatch, Metric, PredictionMetric};
use crate::error::NnError;
use crate::loss::Targets;

/// True and false positives and negatives at one threshold.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Counts {
    tp: f64,
    fp: f64,
    tn: f64,
    fn_: f64,
}

/// Adds a batch's decisions at each of `thresholds` to `counts`.
fn count(
    name: &str,
    counts: &mut [Counts],
    thresholds: &[f32],
    (predictions, targets, sample_weight): (&Tensor, Targets<'_>, Option<&[f32]>),
) -> Result<(), NnError> {
    let batch = HostBatch::new(name, predictions, sample_weight)?;
    let targets = HostBatch::dense_targets(name, predictions, targets)?;
    let width = batch.width.max(1);
    for ((p, t), &w) in batch
        .predictions
        .chunks(width)
        .zip(targets.chunks(width))
        .zip(&batch.weights)
    {
        for (&p, &t) in p.iter().zip(t) {
            let positive = t != 0.0;
            for (c, &threshold) in counts.iter_mut().zip(thresholds) {
                match (p > threshold, positive) {
                    (true, true) => c.tp += w,
                    (true, false) => c.fp += w,
                    (false, false) => c.tn += w,
                    (false, true) => c.fn_ += w,
                }
            }
        }
    }
    Ok(())
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { 0.0 } else { a / b }
}

/// Keras' `Precision` at a threshold of 0.5: true positives over predicted positives.
///
/// ```
/// use lockstep_nn::{Metric, PredictionMetric, Targets, metrics::Precision};
/// use lockstep_tensor::Tensor;
///
/// let mut m = Precision::default();
/// let y = Tensor::from_vec(vec![0.0, 1.0, 1.0, 1.0], &[4, 1])?;
/// let p = Tensor::from_vec(vec![1.0, 0.0, 1.0, 1.0], &[4, 1])?;
/// m.update_state(&p, Targets::Values(&y), None)?;
/// assert!((m.result() - 2.0 / 3.0).abs() < 1e-12); // Keras' documented example
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Precision {
    threshold: f32,
    counts: Counts,
}

/// Keras' `Recall` at a threshold of 0.5: true positives over actual positives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recall {
    threshold: f32,
    counts: Counts,
}

/// Implements the metric traits for `Precision` and `Recall`, which differ in their ratio.
macro_rules! threshold_metric {
    ($metric:ident, $name:literal, |$c:ident| $result:expr) => {
        impl $metric {
            /// At a threshold other than 0.5.
            pub fn with_threshold(threshold: f32) -> Self {
                Self {
                    threshold,
                    counts: Counts::default(),
                }
            }
        }

        impl Default for $metric {
            fn default() -> Self {
                Self::with_threshold(0.5)
            }
        }

        impl Metric for $metric {
            fn result(&self) -> f64 {
                let $c = &self.counts;
                $result
            }
            fn reset(&mut self) {
                self.counts = Counts::default();
            }
            fn state(&self) -> Vec<f64> {
                let c = &self.counts;
                vec![c.tp, c.fp, c.tn, c.fn_]
            }
            fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
                let &[tp, fp, tn, fn_] = state else {
                    return Err(NnError::Length {
                        what: "metric state",
                        left: state.len(),
                        right: 4,
                    });
                };
                self.counts = Counts { tp, fp, tn, fn_ };
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
                count(
                    $name,
                    std::slice::from_mut(&mut self.counts),
                    &[self.threshold],
                    (predictions, targets, sample_weight),
                )
            }

            fn fresh(&self) -> Box<dyn PredictionMetric> {
                Box::new(Self::with_threshold(self.threshold))
            }
        }
    };
}

threshold_metric!(Precision, "precision", |c| ratio(c.tp, c.tp + c.fp));
threshold_metric!(Recall, "recall", |c| ratio(c.tp, c.tp + c.fn_));

/// Keras' `AUC`: the area under the ROC curve, by the trapezoidal rule over the confusion
/// counts at `num_thresholds` (200) thresholds spread evenly over `[0, 1]` (the first just
/// below 0, the last just above 1, as Keras places them).
///
/// ```
/// use lockstep_nn::{Metric, PredictionMetric, Targets, metrics::Auc};
/// use lockstep_tensor::Tensor;
///
/// let mut m = Auc::with_thresholds(3);
/// let y = Tensor::from_vec(vec![0.0, 0.0, 1.0, 1.0], &[4, 1])?;
/// let p = Tensor::from_vec(vec![0.0, 0.5, 0.3, 0.9], &[4, 1])?;
/// m.update_state(&p, Targets::Values(&y), None)?;
/// assert_eq!(m.result(), 0.75); // Keras' documented example
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Auc {
    thresholds: Vec<f32>,
    counts: Vec<Counts>,
}

impl Auc {
    /// With `num_thresholds` thresholds (at least 2).
    pub fn with_thresholds(num_thresholds: usize) -> Self {
        let n = num_thresholds.max(2);
        let epsilon = 1e-7_f32;
        let mut thresholds = vec![-epsilon];
        thresholds.extend((1..n - 1).map(|i| i as f32 / (n - 1) as f32));
        thresholds.push(1.0 + epsilon);
        Self {
            counts: vec![Counts::default(); n],
            thresholds,
        }
    }
}

impl Default for Auc {
    fn default() -> Self {
        Self::with_thresholds(200)
    }
}

impl Metric for Auc {
    fn result(&self) -> f64 {
        let tpr: Vec<f64> = self
            .counts
            .iter()
            .map(|c| ratio(c.tp, c.tp + c.fn_))
            .collect();
        let fpr: Vec<f64> = self
            .counts
            .iter()
            .map(|c| ratio(c.fp, c.fp + c.tn))
            .collect();
        (0..self.counts.len() - 1)
            .map(|i| (fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2.0)
            .sum()
    }
    fn reset(&mut self) {
        self.counts.fill(Counts::default());
    }
    fn state(&self) -> Vec<f64> {
        self.counts
            .iter()
            .flat_map(|c| [c.tp, c.fp, c.tn, c.fn_])
            .collect()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), NnError> {
        if state.len() != 4 * self.counts.len() {
            return Err(NnError::Length {
                what: "metric state",
                left: state.len(),
                right: 4 * self.counts.len(),
            });
        }
        for (c, s) in self.counts.iter_mut().zip(state.chunks_exact(4)) {
            *c = Counts {
                tp: s[0],
                fp: s[1],
                tn: s[2],
                fn_: s[3],
            };
        }
        Ok(())
    }
}

impl PredictionMetric for Auc {
    fn name(&self) -> &'static str {
        "auc"
    }

    fn update_state(
        &mut self,
        predictions: &Tensor,
        targets: Targets<'_>,
        sample_weight: Option<&[f32]>,
    ) -> Result<(), NnError> {
        count(
            "auc",
            &mut self.counts,
            &self.thresholds,
            (predictions, targets, sample_weight),
        )
    }

    fn fresh(&self) -> Box<dyn PredictionMetric> {
        Box::new(Self::with_thresholds(self.counts.len()))
    }
}
