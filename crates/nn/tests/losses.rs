//! Every loss against values Keras documents or that its formulas give (computed in `f64` by
//! hand, written down here), its gradient against central finite differences, sample weights
//! and reductions, and the errors of targets a loss cannot take.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::{
    BinaryCrossentropy, CategoricalCrossentropy, FnLoss, Huber, Loss, MeanAbsoluteError,
    MeanSquaredError, NnError, Reduction, SparseCategoricalCrossentropy, Targets,
};
use lockstep_tensor::{Tensor, ops};
use proptest::prelude::*;

fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

fn value(loss: &dyn Loss, p: &Tensor, y: &Tensor) -> f32 {
    loss.call(p, Targets::Values(y), None)
        .unwrap()
        .item()
        .unwrap()
}

fn assert_near(got: f32, want: f64, tolerance: f64) {
    assert!(
        (f64::from(got) - want).abs() <= tolerance,
        "got {got}, want {want} ± {tolerance}"
    );
}

#[test]
fn each_loss_gives_the_value_keras_documents() {
    let y = tensor(&[0.0, 1.0, 0.0, 0.0], &[2, 2]);
    let p = tensor(&[0.6, 0.4, 0.4, 0.6], &[2, 2]);
    assert_near(value(&BinaryCrossentropy::default(), &p, &y), 0.815, 1e-3);
    assert_near(value(&Huber::default(), &p, &y), 0.155, 1e-3);
    let ones = tensor(&[1.0, 1.0, 1.0, 0.0], &[2, 2]);
    assert_near(value(&MeanSquaredError::default(), &ones, &y), 0.5, 0.0);
    assert_near(value(&MeanAbsoluteError::default(), &ones, &y), 0.5, 0.0);
    let logits = tensor(&[-18.6, 0.51, 2.94, -12.8], &[4, 1]);
    let binary = tensor(&[0.0, 1.0, 0.0, 0.0], &[4, 1]);
    let from_logits = BinaryCrossentropy {
        from_logits: true,
        ..BinaryCrossentropy::default()
    };
    assert_near(value(&from_logits, &logits, &binary), 0.865, 1e-3);
    let onehot = tensor(&[0.0, 1.0, 0.0, 0.0, 0.0, 1.0], &[2, 3]);
    let probabilities = tensor(&[0.05, 0.95, 0.0, 0.1, 0.8, 0.1], &[2, 3]);
    assert_near(
        value(&CategoricalCrossentropy::default(), &probabilities, &onehot),
        1.177,
        1e-3,
    );
    let sparse = SparseCategoricalCrossentropy::default();
    let ids = sparse
        .call(&probabilities, &[1, 2])
        .unwrap()
        .item()
        .unwrap();
    assert_near(ids, 1.177, 1e-3);
}

#[test]
fn each_loss_gives_its_formulas_value_computed_by_hand() {
    // numpy, f64: the formulas of tf_keras 2.21's losses on these inputs.
    let y = tensor(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0], &[2, 3]);
    let p = tensor(&[0.9, 0.05, 0.05, 0.05, 0.89, 0.06], &[2, 3]);
    assert_near(
        value(&CategoricalCrossentropy::default(), &p, &y),
        0.110_947_165_956_888_89,
        1e-6,
    );
    let logits = tensor(&[2.0, -1.0, 0.5, 0.1, 0.2, -0.3], &[2, 3]);
    let smoothed = CategoricalCrossentropy {
        from_logits: true,
        label_smoothing: 0.1,
        reduction: Reduction::None,
    };
    let per_example = smoothed
        .call(&logits, Targets::Values(&y), None)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_near(per_example[0], 0.391_311_3, 1e-6);
    assert_near(per_example[1], 0.940_827_66, 1e-6);
    let probabilities = tensor(&[0.6, 0.4, 0.1, 0.9], &[2, 2]);
    let binary = tensor(&[0.0, 1.0, 0.0, 0.0], &[2, 2]);
    let bce = BinaryCrossentropy {
        reduction: Reduction::Sum,
        ..BinaryCrossentropy::default()
    };
    assert_near(value(&bce, &probabilities, &binary), 2.120_262_73, 1e-5);
    let d = tensor(&[0.5, -2.0, 3.0, 0.25], &[2, 2]);
    let zeros = tensor(&[0.0; 4], &[2, 2]);
    let huber = Huber {
        reduction: Reduction::None,
        ..Huber::default()
    };
    let per_example = huber.call(&d, Targets::Values(&zeros), None).unwrap();
    assert_eq!(per_example.to_vec().unwrap(), [0.8125, 1.265_625]);
    let weighted = Huber::default()
        .call(&d, Targets::Values(&zeros), Some(&[0.5, 2.0]))
        .unwrap();
    assert_eq!(weighted.item().unwrap(), 1.468_75);
}

#[test]
fn sample_weights_scale_each_example_and_the_mean_divides_by_the_count() {
    let p = tensor(&[1.0, 3.0, 2.0, 2.0], &[2, 2]);
    let y = tensor(&[0.0; 4], &[2, 2]);
    let losses = |reduction| {
        MeanSquaredError { reduction }
            .call(&p, Targets::Values(&y), Some(&[2.0, 0.0]))
            .unwrap()
            .to_vec()
            .unwrap()
    };
    assert_eq!(losses(Reduction::None), [10.0, 0.0]);
    assert_eq!(losses(Reduction::Sum), [10.0]);
    assert_eq!(losses(Reduction::SumOverBatchSize), [5.0]);
    let err = MeanSquaredError::default()
        .call(&p, Targets::Values(&y), Some(&[1.0]))
        .unwrap_err();
    assert!(matches!(err, NnError::Length { .. }), "{err}");
}

#[test]
fn float_class_ids_give_the_loss_of_integer_ones() {
    let logits = tensor(&[0.3, -1.0, 2.0, 0.5, 0.5, 0.1], &[2, 3]);
    let loss = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::None,
    };
    let from_ids = loss.call(&logits, &[2, 0]).unwrap().to_vec().unwrap();
    for shape in [&[2][..], &[2, 1]] {
        let floats = tensor(&[2.0, 0.0], shape);
        let from_floats = Loss::call(&loss, &logits, Targets::Values(&floats), None)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(from_floats, from_ids);
    }
    for bad in [[2.5, 0.0], [-1.0, 0.0]] {
        let err = Loss::call(&loss, &logits, Targets::Values(&tensor(&bad, &[2])), None);
        assert!(err.unwrap_err().to_string().contains("class id"));
    }
}

#[test]
fn targets_a_loss_cannot_take_are_errors_that_say_why() {
    let p = tensor(&[0.5; 6], &[2, 3]);
    let err = MeanSquaredError::default()
        .call(&p, Targets::ClassIds(&[0, 1]), None)
        .unwrap_err();
    assert!(err.to_string().contains("class ids"), "{err}");
    let err = CategoricalCrossentropy::default()
        .call(&p, Targets::Values(&tensor(&[1.0; 4], &[2, 2])), None)
        .unwrap_err();
    assert!(err.to_string().contains("[2, 3]"), "{err}");
    let smoothing = CategoricalCrossentropy {
        label_smoothing: 1.5,
        ..CategoricalCrossentropy::default()
    };
    assert!(smoothing.call(&p, Targets::Values(&p), None).is_err());
    let huber = Huber {
        delta: 0.0,
        ..Huber::default()
    };
    assert!(huber.call(&p, Targets::Values(&p), None).is_err());
}

#[test]
fn a_users_loss_from_a_closure_is_weighted_and_reduced_like_the_others() {
    let energy = FnLoss::new("energy", Reduction::Sum, |p: &Tensor, _: Targets<'_>| {
        let squares = ops::mul(p, p).unwrap();
        Ok(ops::sum(&squares, &[1], false).unwrap())
    });
    assert_eq!(energy.name(), "energy");
    let p = tensor(&[1.0, 2.0, 3.0, 0.0], &[2, 2]);
    let loss = energy
        .call(&p, Targets::ClassIds(&[]), Some(&[1.0, 0.5]))
        .unwrap();
    assert_eq!(loss.item().unwrap(), 9.5);
}

/// `Σ loss(p)·1` against central differences of the loss, for every prediction value.
fn gradient_matches_finite_differences(
    loss: &dyn Loss,
    p: &[f32],
    shape: &[usize],
    y: &Tensor,
) -> Result<(), TestCaseError> {
    let params = Tensor::parameter(p.to_vec(), shape).unwrap();
    let out = loss.call(&params, Targets::Values(y), None).unwrap();
    let grads = out.backward().unwrap();
    let analytic = grads.get(&params).unwrap().to_vec().unwrap();
    let at = |i: usize, delta: f32| {
        let mut moved = p.to_vec();
        moved[i] += delta;
        f64::from(
            loss.call(&tensor(&moved, shape), Targets::Values(y), None)
                .unwrap()
                .item()
                .unwrap(),
        )
    };
    let h = 1e-2_f32;
    for (i, a) in analytic.iter().enumerate() {
        let numeric = (at(i, h) - at(i, -h)) / (2.0 * f64::from(h));
        prop_assert!(
            (f64::from(*a) - numeric).abs() <= 2e-2 * (1.0 + numeric.abs()),
            "{}: value {}: analytic {} numeric {}",
            loss.name(),
            i,
            a,
            numeric
        );
    }
    Ok(())
}

fn grid(low: f32, high: f32) -> impl Strategy<Value = f32> {
    (0..=1000_u32).prop_map(move |k| low + (high - low) * k as f32 / 1000.0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_loss_has_the_gradient_of_its_values(
        logits in prop::collection::vec(grid(-3.0, 3.0), 12),
        probabilities in prop::collection::vec(grid(0.05, 0.95), 12),
        labels in prop::collection::vec(grid(0.0, 1.0), 12),
        // Kept a step clear of Huber's and the absolute value's kinks.
        offsets in prop::collection::vec((grid(0.1, 2.5), any::<bool>()), 12),
    ) {
        let shape = [4, 3];
        let y = tensor(&labels, &shape);
        let clear: Vec<f32> = labels.iter().zip(&offsets).map(|(l, (o, neg))| {
            let o = if (o - 1.0).abs() < 0.05 { o + 0.1 } else { *o };
            if *neg { l - o } else { l + o }
        }).collect();
        for smoothing in [0.0, 0.2] {
            for from_logits in [false, true] {
                let p = if from_logits { &logits } else { &probabilities };
                let cce = CategoricalCrossentropy { from_logits, label_smoothing: smoothing, ..Default::default() };
                gradient_matches_finite_differences(&cce, p, &shape, &y)?;
                let bce = BinaryCrossentropy { from_logits, label_smoothing: smoothing, ..Default::default() };
                gradient_matches_finite_differences(&bce, p, &shape, &y)?;
            }
        }
        gradient_matches_finite_differences(&MeanSquaredError::default(), &logits, &shape, &y)?;
        gradient_matches_finite_differences(&MeanAbsoluteError::default(), &clear, &shape, &y)?;
        gradient_matches_finite_differences(&Huber::default(), &clear, &shape, &y)?;
    }

    #[test]
    fn a_logit_of_exactly_zero_has_the_gradient_sigmoid_gives(y in grid(0.0, 1.0)) {
        let loss = BinaryCrossentropy { from_logits: true, ..Default::default() };
        let x = Tensor::parameter(vec![0.0], &[1, 1]).unwrap();
        let grads = loss.call(&x, Targets::Values(&tensor(&[y], &[1, 1])), None).unwrap().backward().unwrap();
        let slope = grads.get(&x).unwrap().item().unwrap();
        prop_assert!((slope - (0.5 - y)).abs() < 1e-6, "{} vs {}", slope, 0.5 - y);
    }

    #[test]
    fn huge_logits_give_finite_binary_losses(x in prop::collection::vec(grid(-200.0, 200.0), 8), y in prop::collection::vec(grid(0.0, 1.0), 8)) {
        let loss = BinaryCrossentropy { from_logits: true, ..Default::default() };
        let value = value(&loss, &tensor(&x, &[8, 1]), &tensor(&y, &[8, 1]));
        prop_assert!(value.is_finite() && value >= 0.0, "{}", value);
    }
}
