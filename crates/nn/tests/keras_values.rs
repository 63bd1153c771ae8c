//! Every loss and metric against the value `tf_keras` 2.21 gives on the same inputs, written
//! down as data (`tests/data/keras_reference.json`, made by `tests/data/keras_reference.py`):
//! with and without sample weights, from logits and from probabilities, with label
//! smoothing.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test that meets an error must fail loudly"
)]

use lockstep_nn::{
    BinaryCrossentropy, CategoricalCrossentropy, Huber, Loss, MeanAbsoluteError, MeanSquaredError,
    SparseCategoricalCrossentropy, Targets, metric_by_name,
};
use lockstep_tensor::Tensor;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    source: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    kind: String,
    name: String,
    config: serde_json::Value,
    y_true: Vec<f32>,
    y_pred: Vec<f32>,
    shape: Vec<usize>,
    sample_weight: Option<Vec<f32>>,
    expected: f64,
}

impl Case {
    fn flag(&self, key: &str) -> bool {
        self.config[key].as_bool().unwrap_or(false)
    }

    fn number(&self, key: &str) -> f32 {
        self.config[key].as_f64().unwrap_or(0.0) as f32
    }

    fn loss(&self) -> Box<dyn Loss> {
        let from_logits = self.flag("from_logits");
        let label_smoothing = self.number("label_smoothing");
        match self.name.as_str() {
            "sparse_categorical_crossentropy" => Box::new(SparseCategoricalCrossentropy {
                from_logits,
                ..Default::default()
            }),
            "categorical_crossentropy" => Box::new(CategoricalCrossentropy {
                from_logits,
                label_smoothing,
                ..Default::default()
            }),
            "binary_crossentropy" => Box::new(BinaryCrossentropy {
                from_logits,
                label_smoothing,
                ..Default::default()
            }),
            "mean_squared_error" => Box::new(MeanSquaredError::default()),
            "mean_absolute_error" => Box::new(MeanAbsoluteError::default()),
            "huber" => Box::new(Huber {
                delta: self.number("delta"),
                ..Default::default()
            }),
            other => panic!("no loss {other} in this test"),
        }
    }

    /// Lockstep's value for the case.
    fn value(&self) -> f64 {
        let y_pred = Tensor::from_vec(self.y_pred.clone(), &self.shape).unwrap();
        let class_ids: Vec<usize> = self.y_true.iter().map(|&v| v as usize).collect();
        // Class ids are one per example; other targets one per prediction.
        let true_shape = if self.y_true.len() == self.shape[0] {
            vec![self.shape[0]]
        } else {
            self.shape.clone()
        };
        let y_true = Tensor::from_vec(self.y_true.clone(), &true_shape).unwrap();
        let targets = if self.name.starts_with("sparse") {
            Targets::ClassIds(&class_ids)
        } else {
            Targets::Values(&y_true)
        };
        let weights = self.sample_weight.as_deref();
        if self.kind == "loss" {
            let value = self.loss().call(&y_pred, targets, weights).unwrap();
            return f64::from(value.item().unwrap());
        }
        let mut metric = metric_by_name(&self.name).unwrap();
        metric.update_state(&y_pred, targets, weights).unwrap();
        metric.result()
    }
}

#[test]
fn every_loss_and_metric_gives_the_value_tf_keras_gives() {
    let text = include_str!("data/keras_reference.json");
    let reference: Reference = serde_json::from_str(text).unwrap();
    assert!(reference.source.starts_with("tf_keras"));
    assert!(reference.cases.len() >= 40, "{}", reference.cases.len());
    let mut failures = Vec::new();
    for case in &reference.cases {
        let got = case.value();
        if (got - case.expected).abs() > 1e-5 * (1.0 + case.expected.abs()) {
            failures.push(format!(
                "{} {} {} weighted={}: Lockstep {got}, tf_keras {}",
                case.kind,
                case.name,
                case.config,
                case.sample_weight.is_some(),
                case.expected
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
