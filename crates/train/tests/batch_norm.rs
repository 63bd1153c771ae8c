//! Batch normalization under the strategies: the moving statistics every replica keeps alike,
//! and the synchronised form, whose statistics over the global batch make any layout train as
//! one replica on the whole batch.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::{CrashAt, digits, loss, workers};
use lockstep_data::Dataset;
use lockstep_nn::{
    Activation, ActivationLayer, BatchNormalization, Conv2D, Dense, Flatten, MaxPooling2D, Network,
    NnError, Reshape, Sequential, Sgd,
};
use lockstep_train::{
    BackupAndRestore, Callback, MirroredStrategy, Model, OneDeviceStrategy, SaveFreq, Strategy,
    TrainError,
};

/// Dense → batch normalization → relu → dense, on the flattened digits.
fn normalised_mlp(synchronized: bool) -> Result<Network, NnError> {
    Sequential::new(
        &[784],
        vec![
            Box::new(Dense::new(32)),
            Box::new(
                BatchNormalization::new()
                    .momentum(0.9)
                    .synchronized(synchronized),
            ),
            Box::new(ActivationLayer(Activation::Relu)),
            Box::new(Dense::new(10)),
        ],
        5,
    )
    .map(Into::into)
}

/// Reshape → 3×3 convolution → batch normalization → relu → 2×2 max pooling → dense: a first
/// convolution that folds the normalization into itself.
fn normalised_cnn(synchronized: bool) -> Result<Network, NnError> {
    Sequential::new(
        &[784],
        vec![
            Box::new(Reshape::new(&[28, 28, 1])),
            Box::new(Conv2D::new(8, (3, 3))),
            Box::new(
                BatchNormalization::new()
                    .momentum(0.9)
                    .synchronized(synchronized),
            ),
            Box::new(ActivationLayer(Activation::Relu)),
            Box::new(MaxPooling2D::new((2, 2))),
            Box::new(Flatten),
            Box::new(Dense::new(10)),
        ],
        5,
    )
    .map(Into::into)
}

/// The variables after `steps` steps of SGD on global batches of 64.
fn train(strategy: impl Strategy, synchronized: bool, steps: u64) -> Vec<f32> {
    train_on(strategy, synchronized, steps, common::EXAMPLES)
}

/// Two epochs of the synchronised model on two mirrored replicas, with the callbacks.
fn two_epochs(callbacks: Vec<Box<dyn Callback>>) -> Result<Model, TrainError> {
    let mut model = Model::new(MirroredStrategy::new(2).unwrap(), || normalised_mlp(true))?;
    model.compile(Sgd::new(0.1), loss(), &["accuracy"])?;
    let data = model.distribute_dataset(digits(), 64)?;
    let mut fit = model.fit(&data).epochs(2).verbose(false);
    for callback in callbacks {
        fit = fit.callback(callback);
    }
    fit.run()?;
    Ok(model)
}

/// [`train`] on the first `examples` digits.
fn train_on(strategy: impl Strategy, synchronized: bool, steps: u64, examples: usize) -> Vec<f32> {
    train_model(strategy, || normalised_mlp(synchronized), steps, examples)
}

/// [`train_on`] for the model `build` builds.
fn train_model(
    strategy: impl Strategy,
    build: impl Fn() -> Result<Network, NnError>,
    steps: u64,
    examples: usize,
) -> Vec<f32> {
    let mut model = Model::new(strategy, build).unwrap();
    model.compile(Sgd::new(0.1), loss(), &["accuracy"]).unwrap();
    let data = model
        .distribute_dataset(digits().take(examples as u64), 64)
        .unwrap();
    model
        .fit(&data)
        .epochs(1)
        .steps_per_epoch(steps)
        .verbose(false)
        .run()
        .unwrap();
    model.network().parameters().values().to_vec()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn view<'a>(model: &'a Network, values: &'a [f32], name: &str) -> &'a [f32] {
    let spec = model
        .parameters()
        .specs()
        .iter()
        .find(|s| s.name == name)
        .unwrap();
    &values[spec.range()]
}

#[test]
fn synchronised_batch_normalization_on_two_workers_of_two_replicas_trains_as_one_replica() {
    let one = train(OneDeviceStrategy::new(), true, 4);
    let results = workers(2, 2, |strategy| train(strategy, true, 4));
    assert_eq!(
        results[0], results[1],
        "both workers hold the same variables"
    );
    let difference = max_difference(&one, &results[0]);
    assert!(difference < 1e-6, "{difference}");
    let net = normalised_mlp(true).unwrap();
    let moving = view(&net, &one, "batch_normalization/moving_variance");
    assert!(
        moving.iter().any(|&v| (v - 1.0).abs() > 1e-3),
        "the moving variance moved: {moving:?}"
    );
}

#[test]
fn synchronised_batch_normalization_folded_into_a_first_convolution_trains_as_one_replica() {
    let one = train_model(
        OneDeviceStrategy::new(),
        || normalised_cnn(true),
        3,
        common::EXAMPLES,
    );
    let results = workers(2, 2, |strategy| {
        train_model(strategy, || normalised_cnn(true), 3, common::EXAMPLES)
    });
    assert_eq!(
        results[0], results[1],
        "both workers hold the same variables"
    );
    let difference = max_difference(&one, &results[0]);
    assert!(difference < 1e-5, "{difference}");
    let net = normalised_cnn(true).unwrap();
    let moving = view(&net, &one, "batch_normalization/moving_variance");
    assert!(
        moving.iter().any(|&v| (v - 1.0).abs() > 1e-3),
        "the moving variance moved: {moving:?}"
    );
}

#[test]
fn replicas_without_data_in_a_last_short_batch_still_meet_the_synchronised_statistics() {
    // 70 examples: the second step's global batch of 6 leaves some of four replicas empty
    // (a batch of 16 each), which pass empty batches so that the statistics' collectives meet.
    let one = train_on(OneDeviceStrategy::new(), true, 2, 70);
    let four = train_on(MirroredStrategy::new(4).unwrap(), true, 2, 70);
    let difference = max_difference(&one, &four);
    assert!(difference < 1e-6, "{difference}");
}

#[test]
fn unsynchronised_moving_statistics_average_each_replicas_own() {
    // One step from the initial variables: the moving mean moves to a tenth of the mean
    // of the two replicas' batch means (equal halves: the global batch's mean), the
    // moving variance likewise towards the mean of the two halves' variances, which is
    // less than the whole batch's.
    let initial = normalised_mlp(false).unwrap();
    let two = train(MirroredStrategy::new(2).unwrap(), false, 1);
    let one = train(OneDeviceStrategy::new(), false, 1);
    let kernel = view(&initial, initial.parameters().values(), "dense/kernel").to_vec();
    let bias = view(&initial, initial.parameters().values(), "dense/bias").to_vec();
    let batch: Vec<Vec<f32>> = digits()
        .iter()
        .unwrap()
        .take(64)
        .map(|e| e.unwrap().0.to_vec())
        .collect();
    let hidden: Vec<Vec<f64>> = batch
        .iter()
        .map(|x| {
            (0..32)
                .map(|j| {
                    f64::from(bias[j])
                        + x.iter()
                            .enumerate()
                            .map(|(i, &v)| f64::from(v) * f64::from(kernel[i * 32 + j]))
                            .sum::<f64>()
                })
                .collect()
        })
        .collect();
    let moments = |rows: &[Vec<f64>], j: usize| {
        let n = rows.len() as f64;
        let mean = rows.iter().map(|r| r[j]).sum::<f64>() / n;
        let var = rows.iter().map(|r| (r[j] - mean).powi(2)).sum::<f64>() / n;
        (mean, var)
    };
    for (values, halves) in [(&two, 2), (&one, 1)] {
        let mean = view(&initial, values, "batch_normalization/moving_mean");
        let variance = view(&initial, values, "batch_normalization/moving_variance");
        for j in 0..32 {
            let parts: Vec<(f64, f64)> = hidden
                .chunks(64 / halves)
                .map(|rows| moments(rows, j))
                .collect();
            let batch_mean = parts.iter().map(|p| p.0).sum::<f64>() / halves as f64;
            let batch_var = parts.iter().map(|p| p.1).sum::<f64>() / halves as f64;
            let want_mean = 0.1 * batch_mean;
            let want_var = 0.9 + 0.1 * batch_var;
            assert!(
                (f64::from(mean[j]) - want_mean).abs() < 1e-5 * (1.0 + want_mean.abs()),
                "{halves} replicas, channel {j}: moving mean {} want {want_mean}",
                mean[j]
            );
            assert!(
                (f64::from(variance[j]) - want_var).abs() < 1e-5 * want_var,
                "{halves} replicas, channel {j}: moving variance {} want {want_var}",
                variance[j]
            );
        }
    }
    let halves_spread = view(&initial, &two, "batch_normalization/moving_variance");
    let whole_spread = view(&initial, &one, "batch_normalization/moving_variance");
    assert!(
        halves_spread
            .iter()
            .zip(whole_spread)
            .all(|(h, w)| h <= &(w + 1e-6)),
        "each half's variance is at most the whole batch's"
    );
}

#[test]
fn the_moving_statistics_are_saved_loaded_and_resumed_with_the_weights() {
    let uninterrupted = two_epochs(Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    uninterrupted.save(dir.path().join("model")).unwrap();
    let loaded = Model::load(OneDeviceStrategy::new(), dir.path().join("model")).unwrap();
    assert_eq!(
        loaded.network().parameters(),
        uninterrupted.network().parameters()
    );
    let batch = digits().iter().unwrap().take(8).map(|e| e.unwrap().0);
    let x: Vec<f32> = batch.flat_map(|row| row.to_vec()).collect();
    let x = lockstep_tensor::Tensor::from_vec(x, &[8, 784]).unwrap();
    assert_eq!(
        loaded.network().predict(&x).unwrap().to_vec().unwrap(),
        uninterrupted
            .network()
            .predict(&x)
            .unwrap()
            .to_vec()
            .unwrap(),
        "inference reads the moving statistics that were saved"
    );

    let backup = || BackupAndRestore::new(dir.path().join("backup")).save_freq(SaveFreq::Steps(4));
    let Err(err) = two_epochs(vec![Box::new(backup()), Box::new(CrashAt(13))]) else {
        panic!("the run crashed on purpose")
    };
    assert!(err.to_string().contains("crashed on purpose"), "{err}");
    let resumed = two_epochs(vec![Box::new(backup())]).unwrap();
    assert_eq!(
        resumed.network().parameters(),
        uninterrupted.network().parameters(),
        "a resumed run ends bit-identical, moving statistics included"
    );
}
