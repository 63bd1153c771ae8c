//! Dropout with a seeded mask.

use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// Zeroes each value with probability `rate` and scales the rest by `1 / (1 − rate)`, as
/// Keras' `Dropout` does in training. The mask is a function of `seed` alone on each kind of
/// device (a PCG stream on the CPU, a hash of the seed and the position on a GPU).
///
/// # Errors
///
/// When `rate` is not in `[0, 1)`; the GPU's error, when `x` is on one.
pub fn dropout(x: &Tensor, rate: f32, seed: u64) -> Result<Tensor, TensorError> {
    if !(0.0..1.0).contains(&rate) {
        return Err(TensorError::invalid(
            "dropout",
            format!("rate {rate} must be in [0, 1)"),
        ));
    }
    if let On::Cuda(buffers) = on("dropout", &[x])? {
        return gpu::dropout(x, &buffers, rate, seed);
    }
    let keep = 1.0 / (1.0 - rate);
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    // 24 random bits give a uniform f32 in [0, 1) exactly representable.
    let mask: Vec<f32> = (0..x.len())
        .map(|_| {
            if ((rng.next_u32() >> 8) as f32) * (1.0 / (1 << 24) as f32) < rate {
                0.0
            } else {
                keep
            }
        })
        .collect();
    let out: Vec<f32> = x.host().iter().zip(&mask).map(|(v, m)| v * m).collect();
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(out, shape.clone(), &[x], move |g, _| {
        Ok(vec![Some(Tensor::raw(
            g.host()
                .iter()
                .zip(&mask)
                .map(|(g, m)| g * m)
                .collect::<Vec<f32>>(),
            shape.clone(),
        ))])
    }))
}
