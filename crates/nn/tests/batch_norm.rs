//! `BatchNormalization` and `AveragePooling2D` against values computed by hand, every
//! variable's gradient against central differences in training mode, the moving statistics'
//! update, and their configurations through JSON.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_nn::{
    AveragePooling2D, BatchNormalization, Dense, ForwardContext, Input, LayerCall, Network, Sgd,
    apply_update,
};
use lockstep_tensor::ops::Padding;
use lockstep_tensor::{Tensor, ops};

fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

fn weights(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + 3) % 11) as f32 / 5.0 - 1.0)
        .collect()
}

/// `Σ output · weights` of a training pass of `model` on `x`.
fn weighted_training_output(model: &Network, x: &Tensor) -> f64 {
    let out = model
        .forward(x, ForwardContext::training(0, 0))
        .unwrap()
        .output
        .to_vec()
        .unwrap();
    out.iter()
        .zip(weights(out.len()))
        .map(|(&o, w)| f64::from(o) * f64::from(w))
        .sum()
}

/// Every trainable variable's gradient of [`weighted_training_output`] against central
/// differences: the batch statistics' own dependence on the variables included.
fn check_training_gradients(mut model: Network, x: &Tensor) {
    let forward = model.forward(x, ForwardContext::training(0, 0)).unwrap();
    let r = tensor(&weights(forward.output.len()), forward.output.shape());
    let axes: Vec<usize> = (0..forward.output.rank()).collect();
    let loss = ops::sum(&ops::mul(&forward.output, &r).unwrap(), &axes, false).unwrap();
    let mut analytic = vec![0.0; model.parameters().len()];
    model
        .gradients(&forward, &loss.backward().unwrap(), &mut analytic)
        .unwrap();
    let trainable: Vec<usize> = model
        .parameters()
        .specs()
        .iter()
        .filter(|s| s.is_trainable())
        .flat_map(lockstep_nn::ParamSpec::range)
        .collect();
    let h = 1e-2_f32;
    for i in trainable {
        let original = model.parameters().values()[i];
        model.parameters_mut().values_mut()[i] = original + h;
        let up = weighted_training_output(&model, x);
        model.parameters_mut().values_mut()[i] = original - h;
        let down = weighted_training_output(&model, x);
        model.parameters_mut().values_mut()[i] = original;
        let numeric = (up - down) / (2.0 * f64::from(h));
        let slope = analytic[i];
        assert!(
            (f64::from(slope) - numeric).abs() <= 2e-2 * (1.0 + numeric.abs()),
            "variable value {i}: analytic {slope} numeric {numeric}"
        );
    }
}

fn normalised(layer: BatchNormalization) -> Network {
    let inputs = Input::new(&[2]);
    let outputs = layer.call(&inputs).unwrap();
    Network::new(&[&inputs], &[&outputs], 0).unwrap()
}

#[test]
fn training_normalises_each_channel_with_the_batch_and_moves_the_moving_statistics() {
    for synchronized in [false, true] {
        let mut model = normalised(BatchNormalization::new().synchronized(synchronized));
        // Channel 0: 1, 3 (mean 2, variance 1); channel 1: 10, 10, (mean 10, variance 0).
        let x = tensor(&[1.0, 10.0, 3.0, 10.0], &[2, 2]);
        let forward = model.forward(&x, ForwardContext::training(0, 0)).unwrap();
        let y = forward.output.to_vec().unwrap();
        let s = (1.0_f64 + 1e-3).sqrt();
        for (got, want) in y.iter().zip([-1.0 / s, 0.0, 1.0 / s, 0.0]) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{y:?}");
        }
        // The observation slots hold the batch's statistics times its two examples.
        let axes = [0, 1];
        let loss = ops::sum(&forward.output, &axes, false).unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        assert_eq!(grads[4..], [4.0, 20.0, 2.0, 0.0], "{synchronized}");
        // An update with the step's two examples: 0.99·old + 0.01·observed; γ and β by SGD.
        let mut sgd = Sgd::new(0.0);
        apply_update(&mut sgd, model.parameters_mut(), &mut grads, 0.5).unwrap();
        let p = model.parameters();
        let close = |name: &str, want: [f32; 2]| {
            let got = p.view(name).unwrap();
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
                "{name}: {got:?}, want {want:?}"
            );
        };
        close("batch_normalization/moving_mean", [0.02, 0.1]);
        close("batch_normalization/moving_variance", [1.0, 0.99]);
        assert_eq!(p.view("batch_normalization/gamma").unwrap(), [1.0, 1.0]);
    }
}

#[test]
fn inference_normalises_with_the_moving_statistics() {
    let mut model = normalised(BatchNormalization::new().epsilon(0.25));
    let values = model.parameters_mut().values_mut();
    // γ, β, moving mean, moving variance.
    values.copy_from_slice(&[2.0, 1.0, 0.5, -1.0, 3.0, 4.0, 0.75, 0.0]);
    let y = model
        .predict(&tensor(&[4.0, 1.0], &[1, 2]))
        .unwrap()
        .to_vec()
        .unwrap();
    // (4 − 3)/√(0.75 + 0.25)·2 + 0.5 and (1 − 4)/√(0 + 0.25)·1 − 1.
    assert_eq!(y, [2.5, -7.0]);
}

#[test]
fn every_trainable_variable_has_the_gradient_of_its_values_through_the_batch_statistics() {
    for synchronized in [false, true] {
        let inputs = Input::new(&[4]);
        let h = Dense::new(3).call(&inputs).unwrap();
        let outputs = BatchNormalization::new()
            .synchronized(synchronized)
            .call(&h)
            .unwrap();
        let model = Network::new(&[&inputs], &[&outputs], 3).unwrap();
        let x = tensor(
            &(0..20)
                .map(|i| ((i * 5) % 13) as f32 / 6.0 - 1.0)
                .collect::<Vec<_>>(),
            &[5, 4],
        );
        check_training_gradients(model, &x);
    }
    let image = Input::new(&[4, 4, 2]);
    let c = lockstep_nn::Conv2D::new(3, (3, 3))
        .padding(Padding::Same)
        .call(&image)
        .unwrap();
    let n = BatchNormalization::new().call(&c).unwrap();
    let p = AveragePooling2D::new((3, 3))
        .strides((2, 2))
        .padding(Padding::Same)
        .call(&n)
        .unwrap();
    let model = Network::new(&[&image], &[&p], 1).unwrap();
    let x = tensor(
        &(0..64)
            .map(|i| ((i * 3) % 17) as f32 / 8.0 - 1.0)
            .collect::<Vec<_>>(),
        &[2, 4, 4, 2],
    );
    check_training_gradients(model, &x);
}

#[test]
fn average_pooling_averages_each_window_and_same_padding_ignores_the_border() {
    let inputs = Input::new(&[3, 3, 1]);
    let valid = AveragePooling2D::new((2, 2))
        .strides((1, 1))
        .call(&inputs)
        .unwrap();
    let same = AveragePooling2D::new((2, 2))
        .padding(Padding::Same)
        .call(&inputs)
        .unwrap();
    assert_eq!(valid.shape(), [2, 2, 1]);
    assert_eq!(same.shape(), [2, 2, 1]);
    let model = Network::new(&[&inputs], &[&valid, &same], 0).unwrap();
    let x = tensor(
        &(1..=9).map(|v| v as f32).collect::<Vec<_>>(),
        &[1, 3, 3, 1],
    );
    let outputs = model.predict_inputs(&[x]).unwrap();
    assert_eq!(outputs[0].to_vec().unwrap(), [3.0, 4.0, 6.0, 7.0]);
    assert_eq!(outputs[1].to_vec().unwrap(), [3.0, 4.5, 7.5, 9.0]);
    assert!(AveragePooling2D::new((4, 4)).call(&inputs).is_err());
}

#[test]
fn the_summary_counts_the_moving_statistics_as_non_trainable() {
    let summary = normalised(BatchNormalization::new()).summary();
    assert!(summary.contains("Total params: 8"), "{summary}");
    assert!(summary.contains("Trainable params: 4"), "{summary}");
    assert!(summary.contains("Non-trainable params: 4"), "{summary}");
}

#[test]
fn batch_normalization_and_average_pooling_rebuild_from_their_configurations() {
    let inputs = Input::new(&[4, 4, 3]);
    let x = AveragePooling2D::new((2, 2)).call(&inputs).unwrap();
    let x = BatchNormalization::new()
        .momentum(0.9)
        .center(false)
        .synchronized(true)
        .call(&x)
        .unwrap();
    let model = Network::new(&[&inputs], &[&x], 2).unwrap();
    let json = serde_json::to_string(&model.config()).unwrap();
    assert!(json.contains(r#""synchronized":true"#), "{json}");
    assert!(
        json.contains(r#""class_name":"AveragePooling2D""#),
        "{json}"
    );
    let again = Network::from_config(&serde_json::from_str(&json).unwrap(), 2).unwrap();
    assert_eq!(again.summary(), model.summary());
    assert_eq!(again.parameters().specs(), model.parameters().specs());
    assert_eq!(
        model
            .parameters()
            .specs()
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        [
            "batch_normalization/gamma",
            "batch_normalization/moving_mean",
            "batch_normalization/moving_variance"
        ]
    );
}

#[test]
fn a_relu_before_max_pooling_runs_after_it_with_the_same_values_and_gradients() {
    use lockstep_nn::{Activation, ActivationLayer, MaxPooling2D};
    let image = Input::new(&[4, 6, 2]);
    let n = BatchNormalization::new().call(&image).unwrap();
    let r = ActivationLayer(Activation::Relu).call(&n).unwrap();
    let p = MaxPooling2D::new((2, 3)).call(&r).unwrap();
    let fused = Network::new(&[&image], &[&p], 4).unwrap();
    // The same layers with the relu read twice (by the pooling and as an output): no fusion.
    let image = Input::new(&[4, 6, 2]);
    let n = BatchNormalization::new().call(&image).unwrap();
    let r = ActivationLayer(Activation::Relu).call(&n).unwrap();
    let p = MaxPooling2D::new((2, 3)).call(&r).unwrap();
    let apart = Network::new(&[&image], &[&p, &r], 4).unwrap();
    let x = tensor(
        &(0..96)
            .map(|i| ((i * 11) % 23) as f32 / 7.0 - 1.5)
            .collect::<Vec<_>>(),
        &[2, 4, 6, 2],
    );
    let run = |model: &Network| {
        let forward = model.forward(&x, ForwardContext::training(0, 0)).unwrap();
        let r = tensor(&weights(forward.output.len()), forward.output.shape());
        let loss = ops::sum(
            &ops::mul(&forward.output, &r).unwrap(),
            &[0, 1, 2, 3],
            false,
        )
        .unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        (forward.output.to_vec().unwrap(), grads)
    };
    let (fused_out, fused_grads) = run(&fused);
    let (apart_out, apart_grads) = run(&apart);
    assert!(fused_out.contains(&0.0) && fused_out.iter().any(|&v| v > 0.0));
    assert_eq!(fused_out, apart_out);
    assert_eq!(fused_grads, apart_grads);
}
