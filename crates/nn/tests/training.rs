//! Single-process training on the MNIST subset: the Keras guide's MLP and the multi-worker
//! tutorial's CNN reach the accuracy TensorFlow reaches with the same settings.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, MnistSplit};
use lockstep_nn::{
    Activation, ActivationLayer, Adam, Conv2D, Dense, Flatten, ForwardContext, Layer, MaxPooling2D,
    Metric, Optimizer, Reduction, Sequential, SparseCategoricalAccuracy,
    SparseCategoricalCrossentropy, models,
};
use lockstep_tensor::{Device, Tensor};

fn mlp(seed: u64) -> Sequential {
    models::mnist_mlp(seed).unwrap()
}

fn cnn(seed: u64) -> Sequential {
    models::mnist_cnn(seed).unwrap()
}

/// A batch as the model's input tensor and labels; `flat` gives `[batch, 784]`.
fn to_tensor(images: ndarray::Array4<f32>, flat: bool) -> Tensor {
    let shape = images.shape().to_vec();
    let shape = if flat { vec![shape[0], 784] } else { shape };
    Tensor::from_vec(images.into_raw_vec_and_offset().0, &shape).unwrap()
}

/// The shuffle seed of the training tests. Accuracy depends on data order as much as on the
/// initial weights. Sweeps over model seeds 0–5 with data seeds 100–105:
/// - MLP, batch 32, 2 epochs: 0.922–0.941, mean 0.932 (TensorFlow 2.21: 0.933 [0.932–0.937]);
/// - CNN, 3 epochs: batch 64 0.954–0.961 (mean 0.958); batch 32, Keras' default, 0.958–0.970
///   (mean 0.964, seeds 0–3).
///
/// These tests use the first pair, model seed 0 with data seed 100.
const DATA_SEED: u64 = 100;

/// Trains with Adam and returns the test accuracy.
fn train(
    model: &mut Sequential,
    split: &MnistSplit,
    test: &MnistSplit,
    epochs: u64,
    batch: usize,
    flat: bool,
) -> f64 {
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let mut adam = Adam::default();
    let mut grads = vec![0.0; model.parameters().len()];
    let data = split
        .dataset()
        .unwrap()
        .map(|(x, y)| (lockstep_data::mnist::scale(&x).into_shared(), y))
        .cache()
        .shuffle(10_000, DATA_SEED, true)
        .batch(batch, false);
    let mut step = 0;
    for epoch in 0..epochs {
        for item in data.iter_epoch(epoch).unwrap() {
            let (x, y) = item.unwrap();
            let labels: Vec<usize> = y.iter().map(|&l| usize::from(l)).collect();
            let forward = model
                .forward(
                    &to_tensor(x.into_owned(), flat),
                    ForwardContext {
                        training: true,
                        step,
                        replica: 0,
                    },
                )
                .unwrap();
            let loss = loss_fn.call(&forward.output, &labels).unwrap();
            model
                .gradients(&forward, &loss.backward().unwrap(), &mut grads)
                .unwrap();
            adam.apply(model.parameters_mut().values_mut(), &grads)
                .unwrap();
            step += 1;
        }
    }
    evaluate(model, test, flat)
}

fn evaluate(model: &Sequential, test: &MnistSplit, flat: bool) -> f64 {
    let mut accuracy = SparseCategoricalAccuracy::default();
    let data = test
        .dataset()
        .unwrap()
        .map(|(x, y)| (lockstep_data::mnist::scale(&x), y))
        .batch(500, false);
    for item in data.iter().unwrap() {
        let (x, y) = item.unwrap();
        let labels: Vec<usize> = y.iter().map(|&l| usize::from(l)).collect();
        accuracy
            .update(&model.predict(&to_tensor(x, flat)).unwrap(), &labels)
            .unwrap();
    }
    accuracy.result()
}

#[test]
fn the_keras_guide_mlp_reaches_92_percent_in_two_epochs() {
    let mnist = Mnist::embedded().unwrap();
    let mut model = mlp(0);
    assert_eq!(model.parameters().len(), 269_322);
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 2, 32, true);
    assert!(accuracy >= 0.92, "test accuracy {accuracy}");
}

#[test]
fn the_tutorial_cnn_reaches_96_percent_in_three_epochs() {
    let mnist = Mnist::embedded().unwrap();
    let mut model = cnn(0);
    assert_eq!(model.parameters().len(), 225_034);
    // Keras' default batch size: see DATA_SEED for batch 64.
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 3, 32, false);
    assert!(accuracy >= 0.96, "test accuracy {accuracy}");
}

/// The model on the first GPU, or `None` (printing why) where there is none;
/// `LOCKSTEP_REQUIRE_GPU=1` (set by `cargo xtask gpu-check`'s runner) makes that a failure.
fn on_gpu(model: Sequential) -> Option<Sequential> {
    match model.to_device(Device::Cuda(0)) {
        Ok(model) => Some(model),
        Err((_, e)) if std::env::var_os("LOCKSTEP_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("LOCKSTEP_REQUIRE_GPU=1 but no GPU: {e}")
        }
        Err((_, e)) => {
            eprintln!("skipped: no GPU: {e}");
            None
        }
    }
}

#[test]
fn the_tutorial_cnn_trained_on_a_gpu_reaches_the_cpus_accuracy() {
    let Some(mut model) = on_gpu(cnn(0)) else {
        return;
    };
    let mnist = Mnist::embedded().unwrap();
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 3, 32, false);
    assert!(accuracy >= 0.96, "test accuracy {accuracy}");
}

#[test]
fn a_step_on_a_gpu_gives_the_cpus_loss_and_gradients() {
    let Some(gpu) = on_gpu(cnn(3)) else {
        return;
    };
    let cpu = cnn(3);
    let mnist = Mnist::embedded().unwrap();
    let images = mnist.train.images_f32();
    let x = to_tensor(
        images.slice(ndarray::s![..64, .., .., ..]).to_owned(),
        false,
    );
    let labels: Vec<usize> = mnist
        .train
        .labels
        .iter()
        .take(64)
        .map(|&l| usize::from(l))
        .collect();
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let step = |model: &Sequential| {
        let forward = model.forward(&x, ForwardContext::default()).unwrap();
        assert_eq!(forward.output.device(), model.device());
        let loss = loss_fn.call(&forward.output, &labels).unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        (loss.item().unwrap(), grads)
    };
    let ((cpu_loss, cpu_grads), (gpu_loss, gpu_grads)) = (step(&cpu), step(&gpu));
    assert!(
        (cpu_loss - gpu_loss).abs() <= 1e-4 * cpu_loss.abs(),
        "{cpu_loss} vs {gpu_loss}"
    );
    let scale = cpu_grads.iter().fold(1e-3_f32, |m, v| m.max(v.abs()));
    for (i, (c, g)) in cpu_grads.iter().zip(&gpu_grads).enumerate() {
        assert!(
            (c - g).abs() <= 1e-3 * scale,
            "gradient {i}: cpu {c} vs gpu {g}"
        );
    }
}

#[test]
fn moving_a_model_to_a_missing_gpu_hands_it_back_with_the_reason() {
    match cnn(0).to_device(Device::Cuda(0)) {
        Ok(model) => assert_eq!(model.device(), Device::Cuda(0)),
        Err((model, e)) => {
            assert_eq!(model.device(), Device::Cpu);
            assert!(e.to_string().contains("cuda:0"), "{e}");
        }
    }
}

#[test]
fn the_same_seed_gives_bit_identical_weights_after_training() {
    let mnist = Mnist::embedded().unwrap();
    let small = MnistSplit {
        images: mnist
            .train
            .images
            .slice(ndarray::s![..512, .., .., ..])
            .to_owned(),
        labels: mnist.train.labels.slice(ndarray::s![..512]).to_owned(),
    };
    let run = || {
        let mut model = cnn(3);
        train(&mut model, &small, &small, 1, 64, false);
        model.parameters().values().to_vec()
    };
    assert_eq!(run(), run());
    assert_ne!(cnn(3).parameters().values(), cnn(4).parameters().values());
}

#[test]
fn the_summary_lists_layers_shapes_and_counts_like_keras() {
    let summary = cnn(0).summary();
    for expected in [
        "conv2d (Conv2D)",
        "(None, 26, 26, 32)",
        "max_pooling2d_1 (MaxPooling2D)",
        "(None, 5, 5, 64)",
        "flatten (Flatten)",
        "(None, 1600)",
        "dense_1 (Dense)",
        "204928",
        "Total params: 225034",
    ] {
        assert!(
            summary.contains(expected),
            "missing {expected:?} in\n{summary}"
        );
    }
}

#[test]
fn a_batch_of_the_wrong_shape_is_an_error_naming_the_expected_shape() {
    let model = cnn(0);
    let err = model
        .predict(&Tensor::zeros(&[2, 28, 28]).unwrap())
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "model input: expected shape (None, 28, 28, 1), got [2, 28, 28]"
    );
    let too_small = Sequential::new(&[2, 2, 1], vec![Box::new(Conv2D::new(4, (3, 3)))], 0);
    assert!(
        too_small
            .err()
            .unwrap()
            .to_string()
            .contains("cannot apply to a 2×2 input")
    );
    assert!(Sequential::new(&[4], vec![Box::new(Dense::new(0))], 0).is_err());
}

#[test]
fn a_convolution_and_the_pooling_after_it_run_fused_with_the_results_of_running_apart() {
    // An activation layer between the two keeps them apart; its layer has no variables, so the
    // same seed gives both models the same weights.
    let fused = cnn(5);
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Conv2D::new(32, (3, 3))),
        Box::new(ActivationLayer(Activation::Relu)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Conv2D::new(64, (3, 3)).activation(Activation::Relu)),
        Box::new(ActivationLayer(Activation::Linear)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Flatten),
        Box::new(Dense::new(128).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    let apart = Sequential::new(&[28, 28, 1], layers, 5).unwrap();
    assert_eq!(fused.parameters().values(), apart.parameters().values());
    let mnist = Mnist::embedded().unwrap();
    let images = mnist.train.images_f32();
    let x = to_tensor(
        images.slice(ndarray::s![..16, .., .., ..]).to_owned(),
        false,
    );
    let labels: Vec<usize> = mnist
        .train
        .labels
        .iter()
        .take(16)
        .map(|&l| usize::from(l))
        .collect();
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let outputs_and_gradients = |model: &Sequential| {
        let forward = model.forward(&x, ForwardContext::default()).unwrap();
        let loss = loss_fn.call(&forward.output, &labels).unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        (forward.output.to_vec().unwrap(), grads)
    };
    let (fused_out, fused_grads) = outputs_and_gradients(&fused);
    let (apart_out, apart_grads) = outputs_and_gradients(&apart);
    let scale = |v: &[f32]| v.iter().fold(1e-3_f32, |m, x| m.max(x.abs()));
    for (what, f, a) in [
        ("outputs", &fused_out, &apart_out),
        ("gradients", &fused_grads, &apart_grads),
    ] {
        let tolerance = 1e-4 * scale(a);
        for (i, (f, a)) in f.iter().zip(a.iter()).enumerate() {
            assert!(
                (f - a).abs() <= tolerance,
                "{what}[{i}]: fused {f} vs apart {a}"
            );
        }
    }
}
