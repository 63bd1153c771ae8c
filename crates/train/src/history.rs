//! What `fit` and `evaluate` report: logs of named values, and their history per epoch.

use std::collections::BTreeMap;

use lockstep_nn::PredictionMetric;

use crate::replica::StepTotals;

/// Named values of a step, an epoch or an evaluation, as Keras' `logs` dict: `loss`,
/// `accuracy`, and with a prefix (`val_loss`) for validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logs(pub BTreeMap<String, f64>);

impl Logs {
    pub(crate) fn from_totals(
        totals: &StepTotals,
        metrics: &[Box<dyn PredictionMetric>],
        prefix: &str,
    ) -> Self {
        let mean = |sum: f64| {
            if totals.examples > 0.0 {
                sum / totals.examples
            } else {
                0.0
            }
        };
        let mut logs = BTreeMap::new();
        logs.insert(format!("{prefix}loss"), mean(totals.loss_sum));
        let mut at = 0;
        for template in metrics {
            let mut metric = template.fresh();
            let len = metric.state().len();
            // Before any step (an empty epoch) the totals hold no state: the fresh metric's.
            if let Some(state) = totals.metrics.get(at..at + len) {
                // The slice has the state's length: setting it cannot fail.
                let _ = metric.set_state(state);
            }
            at += len;
            logs.insert(format!("{prefix}{}", metric.name()), metric.result());
        }
        Self(logs)
    }

    /// Adds `other`'s values under their names with `prefix` (`val_loss`).
    pub(crate) fn extend_prefixed(&mut self, other: Logs, prefix: &str) {
        self.0.extend(
            other
                .0
                .into_iter()
                .map(|(name, value)| (format!("{prefix}{name}"), value)),
        );
    }

    /// The value called `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// `accuracy: 0.9876 - loss: 0.1234`, in name order, as Keras prints logs.
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(name, value)| format!("{name}: {value:.4}"))
            .collect::<Vec<_>>()
            .join(" - ")
    }
}

/// Every epoch's logs, as the `History` object `model.fit` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The epochs run, from 0 (a resumed run starts where the backup stood).
    pub epochs: Vec<u64>,
    /// Each name's value per epoch of `epochs`.
    pub history: BTreeMap<String, Vec<f64>>,
    /// Optimizer steps this `fit` took (fewer than the model's total after a resume).
    pub steps: u64,
    /// Examples those steps trained on, over all workers.
    pub examples: u64,
    /// Examples those steps trained on in this process's replicas: this worker's share of
    /// `examples`.
    pub local_examples: u64,
    /// The time this process's first replica spent in those steps, from the start of the
    /// forward pass to the update's end (an update left in flight: to the step's return, and
    /// the wait to land it where it lands outside a step, at an epoch's end say).
    pub step_time: std::time::Duration,
    /// The part of `step_time` it spent blocked in the steps' collectives, waiting for the
    /// others or for the wire: `comm_wait / step_time` is the share of a step spent waiting
    /// for communication.
    pub comm_wait: std::time::Duration,
}

impl History {
    pub(crate) fn record(&mut self, epoch: u64, logs: &Logs) {
        self.epochs.push(epoch);
        for (name, value) in &logs.0 {
            self.history.entry(name.clone()).or_default().push(*value);
        }
    }

    /// The values of `name` per epoch.
    pub fn get(&self, name: &str) -> Option<&[f64]> {
        self.history.get(name).map(Vec::as_slice)
    }
}
