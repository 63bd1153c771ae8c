//! What the training tests share: a small slice of real MNIST and the guide's MLP.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]
#![allow(
    dead_code,
    reason = "each test file uses its own part of these helpers"
)]

use lockstep_data::mnist::{Mnist, scale};
use lockstep_data::{Dataset, from_vec};
use lockstep_nn::{Sequential, SparseCategoricalCrossentropy, models};
use ndarray::Array1;

pub(crate) const EXAMPLES: usize = 640;

pub(crate) fn loss() -> SparseCategoricalCrossentropy {
    SparseCategoricalCrossentropy {
        from_logits: true,
        ..Default::default()
    }
}

/// The first `EXAMPLES` training digits, scaled and flattened for the MLP.
pub(crate) fn digits() -> impl Dataset<Item = (Array1<f32>, u8)> {
    let mnist = Mnist::embedded().unwrap();
    let (x, y): (Vec<Array1<f32>>, Vec<u8>) = mnist
        .train
        .dataset()
        .unwrap()
        .iter()
        .unwrap()
        .take(EXAMPLES)
        .map(|e| {
            let (x, y) = e.unwrap();
            let flat: Array1<f32> = scale(&x).into_iter().collect();
            (flat, y)
        })
        .unzip();
    from_vec(x.into_iter().zip(y).collect())
}

pub(crate) fn mlp() -> Result<Sequential, lockstep_nn::NnError> {
    models::mnist_mlp(3)
}
