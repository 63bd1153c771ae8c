//! Every metric against Keras' documented examples and values computed by hand, sample
//! weights, and merged replica states equal to one metric over all the data.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::metrics::{
    Auc, BinaryAccuracy, CategoricalAccuracy, MeanAbsoluteError, MeanSquaredError, Precision,
    Recall, TopKCategoricalAccuracy,
};
use lockstep_nn::{
    METRIC_NAMES, Metric, PredictionMetric, SparseCategoricalAccuracy, Targets, metric_by_name,
};
use lockstep_tensor::Tensor;
use proptest::prelude::*;

fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

fn result(mut metric: impl PredictionMetric, y: &Tensor, p: &Tensor, w: Option<&[f32]>) -> f64 {
    metric.update_state(p, Targets::Values(y), w).unwrap();
    metric.result()
}

#[test]
fn each_metric_gives_the_value_keras_documents() {
    let y = tensor(&[1.0, 1.0, 0.0, 0.0], &[4, 1]);
    let p = tensor(&[0.98, 1.0, 0.0, 0.6], &[4, 1]);
    assert_eq!(result(BinaryAccuracy::default(), &y, &p, None), 0.75);
    let y = tensor(&[0.0, 0.0, 1.0, 0.0, 1.0, 0.0], &[2, 3]);
    let p = tensor(&[0.1, 0.9, 0.8, 0.05, 0.95, 0.0], &[2, 3]);
    assert_eq!(result(CategoricalAccuracy::default(), &y, &p, None), 0.5);
    assert_eq!(
        result(TopKCategoricalAccuracy::with_k(1), &y, &p, None),
        0.5
    );
    let y = tensor(&[0.0, 1.0, 0.0, 0.0], &[2, 2]);
    let p = tensor(&[1.0, 1.0, 0.0, 0.0], &[2, 2]);
    assert_eq!(result(MeanSquaredError::default(), &y, &p, None), 0.25);
    assert_eq!(result(MeanAbsoluteError::default(), &y, &p, None), 0.25);
    let y = tensor(&[0.0, 1.0, 1.0, 1.0], &[4, 1]);
    let p = tensor(&[1.0, 0.0, 1.0, 1.0], &[4, 1]);
    assert!((result(Recall::default(), &y, &p, None) - 2.0 / 3.0).abs() < 1e-12);
    // Keras' weighted examples: precision with weights [0, 0, 1, 0] is 1; recall 1.
    let w = [0.0, 0.0, 1.0, 0.0];
    assert_eq!(result(Precision::default(), &y, &p, Some(&w)), 1.0);
    assert_eq!(result(Recall::default(), &y, &p, Some(&w)), 1.0);
    let mut sparse = SparseCategoricalAccuracy::default();
    let ids = tensor(&[2.0, 1.0], &[2, 1]);
    let p = tensor(&[0.1, 0.6, 0.3, 0.05, 0.95, 0.0], &[2, 3]);
    sparse
        .update_state(&p, Targets::Values(&ids), None)
        .unwrap();
    assert_eq!(sparse.result(), 0.5);
    sparse
        .update_state(&p, Targets::ClassIds(&[1, 1]), Some(&[3.0, 1.0]))
        .unwrap();
    assert_eq!(sparse.result(), (1.0 + 4.0) / 6.0);
    let y = tensor(&[0.0, 0.0, 1.0, 1.0], &[4, 1]);
    let p = tensor(&[0.0, 0.5, 0.3, 0.9], &[4, 1]);
    // Keras: AUC(num_thresholds=3) 0.75, with weights [1, 0, 0, 1] 1.0.
    assert_eq!(result(Auc::with_thresholds(3), &y, &p, None), 0.75);
    assert_eq!(
        result(Auc::with_thresholds(3), &y, &p, Some(&[1.0, 0.0, 0.0, 1.0])),
        1.0
    );
}

#[test]
fn metrics_by_name_are_logged_under_kerass_names() {
    for &name in METRIC_NAMES {
        let metric = metric_by_name(name).unwrap();
        assert_eq!(metric.name(), name);
        assert_eq!(metric.fresh().name(), name);
    }
    assert_eq!(metric_by_name("acc").unwrap().name(), "accuracy");
    assert_eq!(metric_by_name("mse").unwrap().name(), "mean_squared_error");
    assert!(metric_by_name("f1").is_none());
}

#[test]
fn a_perfect_ranking_has_an_auc_of_one_and_a_reversed_one_of_zero() {
    let y = tensor(&[0.0, 0.0, 1.0, 1.0, 1.0], &[5, 1]);
    let p = tensor(&[0.1, 0.2, 0.7, 0.8, 0.95], &[5, 1]);
    assert!((result(Auc::default(), &y, &p, None) - 1.0).abs() < 1e-12);
    let reversed = tensor(&[0.9, 0.8, 0.3, 0.2, 0.05], &[5, 1]);
    assert!(result(Auc::default(), &y, &reversed, None).abs() < 1e-12);
}

#[test]
fn targets_a_metric_cannot_compare_are_errors() {
    let p = tensor(&[0.5; 6], &[2, 3]);
    let mut m = CategoricalAccuracy::default();
    assert!(
        m.update_state(&p, Targets::ClassIds(&[0, 1]), None)
            .is_err()
    );
    assert!(
        m.update_state(&p, Targets::Values(&tensor(&[1.0; 4], &[2, 2])), None)
            .is_err()
    );
    assert!(
        m.update_state(&p, Targets::Values(&p), Some(&[1.0]))
            .is_err()
    );
    assert!(Auc::default().set_state(&[0.0; 3]).is_err());
}

fn all_metrics() -> Vec<Box<dyn PredictionMetric>> {
    [
        "binary_accuracy",
        "categorical_accuracy",
        "top_k_categorical_accuracy",
        "mean_squared_error",
        "mean_absolute_error",
        "precision",
        "recall",
        "auc",
    ]
    .iter()
    .map(|n| metric_by_name(n).unwrap())
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn merged_replica_states_equal_one_metric_over_all_the_data(
        p in prop::collection::vec(0_u32..100, 24),
        y in prop::collection::vec(0_u32..2, 24),
        split in 0..4_usize,
    ) {
        let p: Vec<f32> = p.iter().map(|&v| v as f32 / 100.0).collect();
        let y: Vec<f32> = y.iter().map(|&v| v as f32).collect();
        let rows = 4;
        let (width, cut) = (p.len() / rows, split * p.len() / rows);
        for (mut whole, mut left) in all_metrics().into_iter().zip(all_metrics()) {
            let mut right = left.fresh();
            whole.update_state(&tensor(&p, &[rows, width]), Targets::Values(&tensor(&y, &[rows, width])), None).unwrap();
            let part = |m: &mut Box<dyn PredictionMetric>, range: std::ops::Range<usize>| {
                let n = range.len() / width;
                if n > 0 {
                    m.update_state(&tensor(&p[range.clone()], &[n, width]), Targets::Values(&tensor(&y[range], &[n, width])), None).unwrap();
                }
            };
            part(&mut left, 0..cut);
            part(&mut right, cut..p.len());
            let state: Vec<f64> = left.state().iter().zip(right.state()).map(|(a, b)| a + b).collect();
            left.set_state(&state).unwrap();
            prop_assert!((left.result() - whole.result()).abs() < 1e-12, "{}: {} vs {}", whole.name(), left.result(), whole.result());
        }
    }
}
