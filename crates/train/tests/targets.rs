//! Targets, losses and metrics beyond class ids through `compile`/`fit`/`evaluate`: the
//! guide's float labels, one-hot labels with the categorical cross-entropy, regression
//! targets, binary labels with AUC, precision and recall, sample weights, and the logged names.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::digits;
use lockstep_data::{Dataset, from_vec};
use lockstep_nn::{
    Activation, Adam, BinaryCrossentropy, CategoricalCrossentropy, Dense, FnLoss, Input, LayerCall,
    MeanSquaredError, Network, NnError, Reduction, SparseCategoricalCrossentropy, Targets, models,
};
use lockstep_train::{MirroredStrategy, Model, OneDeviceStrategy, Strategy};
use ndarray::Array1;

/// The digits with their labels cast to `f32`, as the Keras guide casts them.
fn float_labelled() -> impl Dataset<Item = (Array1<f32>, f32)> {
    let items: Vec<(Array1<f32>, f32)> = digits()
        .iter()
        .unwrap()
        .map(|e| {
            let (x, y) = e.unwrap();
            (x, f32::from(y))
        })
        .collect();
    from_vec(items)
}

/// The digits with one-hot labels.
fn one_hot() -> impl Dataset<Item = (Array1<f32>, Array1<f32>)> {
    let items: Vec<(Array1<f32>, Array1<f32>)> = digits()
        .iter()
        .unwrap()
        .map(|e| {
            let (x, y) = e.unwrap();
            let mut hot = Array1::zeros(10);
            hot[usize::from(y)] = 1.0;
            (x, hot)
        })
        .collect();
    from_vec(items)
}

/// A regression: the mean brightness of each digit, and whether it is a 0 (binary).
fn regression() -> impl Dataset<Item = (Array1<f32>, Array1<f32>)> {
    let items: Vec<(Array1<f32>, Array1<f32>)> = digits()
        .iter()
        .unwrap()
        .map(|e| {
            let (x, _) = e.unwrap();
            let mean = x.mean().unwrap_or(0.0);
            (x, Array1::from(vec![mean * 4.0]))
        })
        .collect();
    from_vec(items)
}

fn zero_or_not() -> impl Dataset<Item = (Array1<f32>, Array1<f32>)> {
    let items: Vec<(Array1<f32>, Array1<f32>)> = digits()
        .iter()
        .unwrap()
        .map(|e| {
            let (x, y) = e.unwrap();
            (x, Array1::from(vec![f32::from(u8::from(y == 0))]))
        })
        .collect();
    from_vec(items)
}

fn mlp(outputs: usize) -> Result<Network, NnError> {
    mlp_to(outputs, Activation::Linear)
}

fn mlp_to(outputs: usize, activation: Activation) -> Result<Network, NnError> {
    let inputs = Input::new(&[784]);
    let x = Dense::new(32).activation(Activation::Relu).call(&inputs)?;
    let outputs = Dense::new(outputs).activation(activation).call(&x)?;
    Network::new(&[&inputs], &[&outputs], 11)
}

#[test]
fn the_guides_float_labels_train_as_the_integer_ones_do() {
    let train = |float: bool| {
        let mut model =
            Model::new(MirroredStrategy::new(2).unwrap(), || models::mnist_mlp(3)).unwrap();
        let loss = SparseCategoricalCrossentropy {
            from_logits: true,
            ..Default::default()
        };
        model
            .compile(Adam::default(), loss, &["sparse_categorical_accuracy"])
            .unwrap();
        let history = if float {
            let data = model.distribute_dataset(float_labelled(), 64).unwrap();
            model.fit(&data).epochs(1).verbose(false).run().unwrap()
        } else {
            let data = model.distribute_dataset(digits(), 64).unwrap();
            model.fit(&data).epochs(1).verbose(false).run().unwrap()
        };
        (model.network().parameters().values().to_vec(), history)
    };
    let ((a, ha), (b, hb)) = (train(true), train(false));
    assert_eq!(a, b);
    assert_eq!(ha.history, hb.history);
    assert!(
        ha.history.contains_key("sparse_categorical_accuracy"),
        "{:?}",
        ha.history
    );
}

#[test]
fn one_hot_labels_train_with_the_categorical_cross_entropy_and_its_metrics() {
    let mut model = Model::new(MirroredStrategy::new(2).unwrap(), || mlp(10)).unwrap();
    let loss = CategoricalCrossentropy {
        from_logits: true,
        label_smoothing: 0.1,
        reduction: Reduction::SumOverBatchSize,
    };
    model
        .compile(
            Adam::default(),
            loss,
            &["categorical_accuracy", "top_k_categorical_accuracy"],
        )
        .unwrap();
    let data = model.distribute_dataset(one_hot(), 64).unwrap();
    let history = model.fit(&data).epochs(3).verbose(false).run().unwrap();
    let accuracy = history.history["categorical_accuracy"].clone();
    assert!(
        accuracy[2] > 0.6 && accuracy[2] > accuracy[0],
        "{accuracy:?}"
    );
    assert!(history.history["top_k_categorical_accuracy"][2] >= accuracy[2]);
    let logs = model.evaluate(&data).unwrap();
    assert!(logs.get("categorical_accuracy").unwrap() > 0.6, "{logs:?}");
    // Saved and loaded, the model is compiled with the same loss again.
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let mut loaded = Model::load(MirroredStrategy::new(2).unwrap(), dir.path()).unwrap();
    let data = loaded.distribute_dataset(one_hot(), 64).unwrap();
    assert_eq!(loaded.evaluate(&data).unwrap(), logs);
}

#[test]
fn a_regression_target_trains_with_the_mean_squared_error() {
    let mut model = Model::new(OneDeviceStrategy::new(), || mlp(1)).unwrap();
    model
        .compile(
            Adam::default(),
            MeanSquaredError::default(),
            &["mean_absolute_error", "mean_squared_error"],
        )
        .unwrap();
    let data = model.distribute_dataset(regression(), 64).unwrap();
    let history = model.fit(&data).epochs(4).verbose(false).run().unwrap();
    let (loss, mse) = (
        &history.history["loss"],
        &history.history["mean_squared_error"],
    );
    assert!(loss[3] < 0.3 * loss[0], "{loss:?}");
    // The loss is the metric, averaged the same way.
    for (l, m) in loss.iter().zip(mse) {
        assert!((l - m).abs() <= 1e-5 * l.max(1e-3), "{loss:?} vs {mse:?}");
    }
}

#[test]
fn binary_labels_train_with_auc_precision_and_recall_equal_on_any_layout() {
    let train = |strategy: Box<dyn FnOnce() -> Box<dyn Strategy>>| {
        let strategy = strategy();
        // Probabilities out of a sigmoid, as the thresholds of the metrics expect.
        let mut model = Model::new(strategy, || mlp_to(1, Activation::Sigmoid)).unwrap();
        let loss = BinaryCrossentropy::default();
        model
            .compile(
                Adam::default(),
                loss,
                &["binary_accuracy", "auc", "precision", "recall"],
            )
            .unwrap();
        let data = model.distribute_dataset(zero_or_not(), 64).unwrap();
        model.fit(&data).epochs(6).verbose(false).run().unwrap()
    };
    let one = train(Box::new(|| Box::new(OneDeviceStrategy::new())));
    let two = train(Box::new(|| Box::new(MirroredStrategy::new(2).unwrap())));
    let auc = &one.history["auc"];
    assert!(auc[5] > 0.95 && auc[5] > auc[0], "{:?}", one.history);
    assert!(one.history["recall"][5] > one.history["recall"][0]);
    for name in ["auc", "precision", "recall", "binary_accuracy"] {
        let (a, b) = (&one.history[name], &two.history[name]);
        for (a, b) in a.iter().zip(b) {
            assert!((a - b).abs() < 1e-3, "{name}: {a} vs {b}");
        }
    }
}

#[test]
fn sample_weights_of_one_change_nothing_and_weights_scale_the_loss() {
    let train = |weight: Option<f32>| {
        let mut model = Model::new(OneDeviceStrategy::new(), || mlp(10)).unwrap();
        let loss = SparseCategoricalCrossentropy {
            from_logits: true,
            ..Default::default()
        };
        model.compile(Adam::default(), loss, &["accuracy"]).unwrap();
        let history = match weight {
            None => {
                let data = model.distribute_dataset(digits(), 64).unwrap();
                model.fit(&data).epochs(1).verbose(false).run().unwrap()
            }
            Some(w) => {
                let items: Vec<(Array1<f32>, u8, f32)> = digits()
                    .iter()
                    .unwrap()
                    .map(|e| {
                        let (x, y) = e.unwrap();
                        (x, y, w)
                    })
                    .collect();
                let data = model.distribute_dataset(from_vec(items), 64).unwrap();
                model.fit(&data).epochs(1).verbose(false).run().unwrap()
            }
        };
        (model.network().parameters().values().to_vec(), history)
    };
    let (plain, plain_history) = train(None);
    let (ones, ones_history) = train(Some(1.0));
    assert_eq!(plain, ones);
    assert_eq!(plain_history.history, ones_history.history);
    let (_, doubled) = train(Some(2.0));
    assert!(doubled.history["loss"][0] > 1.5 * plain_history.history["loss"][0]);
}

#[test]
fn a_users_loss_trains_and_a_model_compiled_with_it_names_it_when_it_cannot_load() {
    let mut model = Model::new(OneDeviceStrategy::new(), || mlp(1)).unwrap();
    // The mean squared error written as a user would.
    let mine =
        FnLoss::new(
            "my_squared_error",
            Reduction::SumOverBatchSize,
            |p, targets| {
                let Targets::Values(y) = targets else {
                    return Err(NnError::InvalidConfig {
                        layer: "my_squared_error".into(),
                        why: "takes values".into(),
                    });
                };
                let y = lockstep_tensor::ops::reshape(y, p.shape()).unwrap();
                let d = lockstep_tensor::ops::sub(p, &y).unwrap();
                Ok(lockstep_tensor::ops::mean(
                    &lockstep_tensor::ops::mul(&d, &d).unwrap(),
                    &[1],
                    false,
                )
                .unwrap())
            },
        );
    model.compile(Adam::default(), mine, &[]).unwrap();
    let data = model.distribute_dataset(regression(), 64).unwrap();
    let history = model.fit(&data).epochs(3).verbose(false).run().unwrap();
    assert!(history.history["loss"][2] < history.history["loss"][0]);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let err = Model::load(OneDeviceStrategy::new(), dir.path())
        .err()
        .unwrap();
    assert!(err.to_string().contains("my_squared_error"), "{err}");
}

#[test]
fn an_unknown_metric_is_an_error_listing_the_known_ones() {
    let mut model = Model::new(OneDeviceStrategy::new(), || mlp(10)).unwrap();
    let err = model
        .compile(Adam::default(), MeanSquaredError::default(), &["f1_score"])
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("f1_score") && text.contains("auc"), "{text}");
}
