//! The models of the tutorials Lockstep follows, defined once for the examples, tests and
//! benchmarks that train them.

use crate::error::NnError;
use crate::functional::{Input, LayerCall};
use crate::layers::{
    Activation, ActivationLayer, BatchNormalization, Conv2D, Dense, Flatten, Layer, MaxPooling2D,
};
use crate::model::Sequential;
use crate::network::Network;

/// The CNN of TensorFlow's multi-worker tutorials, on 28×28 grey images: Conv2D(32, 3×3,
/// relu) → MaxPooling2D(2×2) → Conv2D(64, 3×3, relu) → MaxPooling2D(2×2) → Flatten →
/// Dense(128, relu) → Dense(10) (logits).
///
/// ```
/// let model = lockstep_nn::models::mnist_cnn(42)?;
/// assert_eq!(model.output_shape(), [10]);
/// assert_eq!(model.parameters().len(), 225_034);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// None in practice: the shapes are fixed and fit; the `Result` is [`Sequential::new`]'s.
pub fn mnist_cnn(seed: u64) -> Result<Sequential, NnError> {
    mnist_cnn_with_dense_units(seed, 128)
}

/// [`mnist_cnn`] with `units` in its hidden dense layer instead of the tutorial's 128.
///
/// # Errors
///
/// When `units` is 0.
pub fn mnist_cnn_with_dense_units(seed: u64, units: usize) -> Result<Sequential, NnError> {
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Conv2D::new(32, (3, 3)).activation(Activation::Relu)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Conv2D::new(64, (3, 3)).activation(Activation::Relu)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Flatten),
        Box::new(Dense::new(units).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    Sequential::new(&[28, 28, 1], layers, seed)
}

/// The literal model of TensorFlow's *Multi-worker training with Keras* tutorial
/// (`mnist_setup.py`), on 28×28 grey images: Conv2D(32, 3×3, relu) → Flatten → Dense(128,
/// relu) → Dense(10) (logits). Without pooling its dense layer sees 26×26×32 values: 12× the
/// parameters of [`mnist_cnn`], nearly all in that layer, and so 12× the gradient bytes a step.
///
/// ```
/// let model = lockstep_nn::models::mnist_tutorial_literal(0)?;
/// assert_eq!(model.parameters().len(), 2_770_634);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// As [`mnist_cnn`].
pub fn mnist_tutorial_literal(seed: u64) -> Result<Sequential, NnError> {
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Conv2D::new(32, (3, 3)).activation(Activation::Relu)),
        Box::new(Flatten),
        Box::new(Dense::new(128).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    Sequential::new(&[28, 28, 1], layers, seed)
}

/// The Keras distributed-training guide's MLP, on flattened 784-pixel images: Dense(256,
/// relu) → Dense(256, relu) → Dense(10) (logits).
///
/// ```
/// let model = lockstep_nn::models::mnist_mlp(0)?;
/// assert_eq!(model.parameters().len(), 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// As [`mnist_cnn`].
pub fn mnist_mlp(seed: u64) -> Result<Sequential, NnError> {
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Dense::new(256).activation(Activation::Relu)),
        Box::new(Dense::new(256).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    Sequential::new(&[784], layers, seed)
}

/// [`mnist_cnn`] written with the functional API: the same layers, names and, for the same
/// seed, the same variables.
///
/// ```
/// use lockstep_nn::models;
///
/// let functional = models::mnist_cnn_functional(7)?;
/// assert_eq!(functional.parameters(), models::mnist_cnn(7)?.parameters());
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// As [`mnist_cnn`].
pub fn mnist_cnn_functional(seed: u64) -> Result<Network, NnError> {
    let inputs = Input::new(&[28, 28, 1]);
    let x = Conv2D::new(32, (3, 3))
        .activation(Activation::Relu)
        .call(&inputs)?;
    let x = MaxPooling2D::new((2, 2)).call(&x)?;
    let x = Conv2D::new(64, (3, 3))
        .activation(Activation::Relu)
        .call(&x)?;
    let x = MaxPooling2D::new((2, 2)).call(&x)?;
    let x = Flatten.call(&x)?;
    let x = Dense::new(128).activation(Activation::Relu).call(&x)?;
    let outputs = Dense::new(10).call(&x)?;
    Network::new(&[&inputs], &[&outputs], seed)
}

/// [`mnist_cnn`] with batch normalization after each convolution, as Keras' examples place
/// it: Conv2D(32, 3×3, no bias) → `BatchNormalization` → relu → MaxPooling2D(2×2) →
/// Conv2D(64, 3×3, no bias) → `BatchNormalization` → relu → MaxPooling2D(2×2) → Flatten →
/// Dense(128, relu) → Dense(10) (logits), in the functional API; `synchronized` makes the
/// normalizations use statistics over every replica's batch.
///
/// ```
/// let model = lockstep_nn::models::cnn_batch_norm(0, true)?;
/// assert_eq!(model.parameters().trainable_len(), 225_034 - 32 - 64 + 2 * (32 + 64));
/// assert_eq!(model.parameters().len() - model.parameters().trainable_len(), 2 * (32 + 64));
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// As [`mnist_cnn`].
pub fn cnn_batch_norm(seed: u64, synchronized: bool) -> Result<Network, NnError> {
    cnn_batch_norm_with_dense_units(seed, synchronized, 128)
}

/// [`cnn_batch_norm`] with `units` in its hidden dense layer instead of 128: with 2048, a
/// model of 3.3 M parameters (99% of them in that layer), for benchmarks of links slower than
/// loopback.
///
/// ```
/// let model = lockstep_nn::models::cnn_batch_norm_with_dense_units(0, false, 2048)?;
/// assert_eq!(model.parameters().trainable_len(), 3_318_250);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// When `units` is 0.
pub fn cnn_batch_norm_with_dense_units(
    seed: u64,
    synchronized: bool,
    units: usize,
) -> Result<Network, NnError> {
    let inputs = Input::new(&[28, 28, 1]);
    let mut x = inputs.clone();
    for filters in [32, 64] {
        x = Conv2D::new(filters, (3, 3)).without_bias().call(&x)?;
        x = BatchNormalization::new()
            .synchronized(synchronized)
            .call(&x)?;
        x = ActivationLayer(Activation::Relu).call(&x)?;
        x = MaxPooling2D::new((2, 2)).call(&x)?;
    }
    let x = Flatten.call(&x)?;
    let x = Dense::new(units).activation(Activation::Relu).call(&x)?;
    let outputs = Dense::new(10).call(&x)?;
    Network::new(&[&inputs], &[&outputs], seed)
}
