//! Batch normalization over the last axis, fused: statistics in one pass, normalisation in
//! another, and an analytic backward pass of two more, where the same computation composed of
//! broadcasting operations takes a dozen.

use std::sync::Arc;

use super::all_reduce::AllReduceSum;
use super::conv::{Padding, geometry, max_pool2d};
use super::fused::MaxPool;
use super::gpu::{On, on};
use crate::error::TensorError;
use crate::kernels::batch_norm::{affine, channel_sums, gradient_sums};
use crate::kernels::batch_norm_pool;
use crate::kernels::window_max::{NO_POSITION, PooledGrad};
use crate::tensor::Tensor;

const OP: &str = "batch_norm";

/// The statistics a training pass of [`batch_norm`] normalised with, per channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    /// The mean of each channel over the batch (over every replica's, when reduced).
    pub mean: Vec<f32>,
    /// The biased variance of each channel, likewise.
    pub variance: Vec<f32>,
}

/// The learned scale and offset, each `[channels]`, both optional (Keras' `scale` and
/// `center`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Affine<'a> {
    /// `γ`, multiplying the normalised values.
    pub gamma: Option<&'a Tensor>,
    /// `β`, added after.
    pub beta: Option<&'a Tensor>,
}

/// An error unless `t` holds one value per channel (the input's last axis).
fn per_channel(t: &Tensor, channels: usize, what: &str) -> Result<(), TensorError> {
    if t.shape() == [channels] {
        return Ok(());
    }
    Err(TensorError::mismatch(
        OP,
        &[channels],
        t.shape(),
        format!("{what} holds one value per channel (the last axis)"),
    ))
}

impl Affine<'_> {
    pub(super) fn check(&self, channels: usize) -> Result<(), TensorError> {
        for (t, what) in [(self.gamma, "gamma"), (self.beta, "beta")] {
            if let Some(t) = t {
                per_channel(t, channels, what)?;
            }
        }
        Ok(())
    }

    pub(super) fn inputs<'t>(&'t self, x: &'t Tensor) -> Vec<&'t Tensor> {
        std::iter::once(x)
            .chain(self.gamma)
            .chain(self.beta)
            .collect()
    }

    /// Per channel, `a = γ · inverse_deviation` and `b = β − mean · a`: `y = x · a + b`.
    pub(super) fn coefficients(&self, mean: &[f32], inverse: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let gamma = self.gamma.map(Tensor::host);
        let beta = self.beta.map(Tensor::host);
        let a: Vec<f32> = inverse
            .iter()
            .enumerate()
            .map(|(c, &s)| gamma.map_or(s, |g| g[c] * s))
            .collect();
        let b = mean
            .iter()
            .zip(&a)
            .enumerate()
            .map(|(c, (&m, &a))| beta.map_or(0.0, |b| b[c]) - m * a)
            .collect();
        (a, b)
    }
}

fn channels_of(x: &Tensor) -> Result<usize, TensorError> {
    let Some(&channels) = x.shape().last() else {
        return Err(TensorError::invalid(
            OP,
            "a scalar has no channels to normalise",
        ));
    };
    if let On::Cuda(_) = on(OP, &[x])? {
        return Err(TensorError::device(OP, x.device(), "runs on the CPU only"));
    }
    Ok(channels)
}

/// `1/√(variance + ε)` per channel.
pub(super) fn inverse_deviation(variance: &[f32], epsilon: f32) -> Vec<f32> {
    variance
        .iter()
        .map(|&v| (1.0 / (f64::from(v) + f64::from(epsilon)).sqrt()) as f32)
        .collect()
}

/// What the backward pass of either form needs.
struct Saved {
    x: Tensor,
    mean: Vec<f32>,
    inverse: Vec<f32>,
    a: Vec<f32>,
    has_gamma: bool,
    has_beta: bool,
}

impl Saved {
    /// What the backward pass keeps of a pass over `x` that normalised with `mean` and
    /// `inverse` into `y = x · a + b`.
    fn new(
        x: &Tensor,
        affine_part: Affine<'_>,
        (mean, inverse): (Vec<f32>, Vec<f32>),
        a: Vec<f32>,
    ) -> Self {
        Self {
            x: x.clone(),
            a,
            mean,
            inverse,
            has_gamma: affine_part.gamma.is_some(),
            has_beta: affine_part.beta.is_some(),
        }
    }

    /// The gradients of `x` (when `input` gives it from the per-channel sums), `γ` and `β`,
    /// from this replica's `Σdy` and `Σdy · x̂`.
    fn gradients(
        &self,
        (sum_dy, sum_dy_xhat): (Vec<f64>, Vec<f64>),
        input: impl FnOnce(&Self, &[f64], &[f64]) -> Result<Option<Tensor>, TensorError>,
    ) -> Result<Vec<Option<Tensor>>, TensorError> {
        let channels = self.mean.len();
        let to_tensor = |sums: &[f64]| {
            Tensor::raw(
                sums.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                vec![channels],
            )
        };
        let mut grads = vec![input(self, &sum_dy, &sum_dy_xhat)?];
        if self.has_gamma {
            grads.push(Some(to_tensor(&sum_dy_xhat)));
        }
        if self.has_beta {
            grads.push(Some(to_tensor(&sum_dy)));
        }
        Ok(grads)
    }

    /// [`Saved::gradients`] of a training pass: the input's gradient is `dx(a, (k1, k2))`
    /// once the sums are all-reduced over `replicas` ([`Saved::input_coefficients`]).
    fn training_gradients(
        &self,
        sums: (Vec<f64>, Vec<f64>),
        (replicas, inverse_count): (Option<&Arc<dyn AllReduceSum>>, f64),
        shape: &[usize],
        dx: impl FnOnce(&[f32], (&[f32], &[f32])) -> Vec<f32>,
    ) -> Result<Vec<Option<Tensor>>, TensorError> {
        self.gradients(sums, |saved, sum_dy, sum_dy_xhat| {
            if !saved.x.requires_grad() {
                return Ok(None);
            }
            let (k1, k2) =
                saved.input_coefficients((sum_dy, sum_dy_xhat), replicas, inverse_count)?;
            Ok(Some(Tensor::raw(dx(&saved.a, (&k1, &k2)), shape.to_vec())))
        })
    }

    /// Per channel, `(k1, k2)` of a training pass's input gradient `dx = a·dy + k1 + x·k2`
    /// (that is `a·(dy − Σdy/N − x̂·Σ(dy·x̂)/N)`), the sums all-reduced over `replicas`.
    fn input_coefficients(
        &self,
        sums: (&[f64], &[f64]),
        replicas: Option<&Arc<dyn AllReduceSum>>,
        inverse_count: f64,
    ) -> Result<(Vec<f32>, Vec<f32>), TensorError> {
        let (mean_dy, mean_dy_xhat) = gradient_means(sums, replicas, inverse_count)?;
        let mut k1 = Vec::with_capacity(self.mean.len());
        let mut k2 = Vec::with_capacity(self.mean.len());
        for c in 0..self.mean.len() {
            let a = f64::from(self.a[c]);
            let s = f64::from(self.inverse[c]);
            let m = f64::from(self.mean[c]);
            k1.push((a * (s * m * mean_dy_xhat[c] - mean_dy[c])) as f32);
            k2.push((-a * s * mean_dy_xhat[c]) as f32);
        }
        Ok((k1, k2))
    }
}

/// Per channel, the means of `dy` and `dy · x̂` over every replica's batch: this replica's
/// sums (`f32` on the wire) all-reduced over `replicas`, times `1/N`.
pub(super) fn gradient_means(
    (sum_dy, sum_dy_xhat): (&[f64], &[f64]),
    replicas: Option<&Arc<dyn AllReduceSum>>,
    inverse_count: f64,
) -> Result<(Vec<f64>, Vec<f64>), TensorError> {
    let channels = sum_dy.len();
    let mut global: Vec<f32> = sum_dy
        .iter()
        .chain(sum_dy_xhat)
        .map(|&v| v as f32)
        .collect();
    if let Some(replicas) = replicas {
        replicas
            .all_reduce_sum(&mut global)
            .map_err(|why| TensorError::Collective { op: OP, why })?;
    }
    let mean = |v: &[f32]| v.iter().map(|&v| f64::from(v) * inverse_count).collect();
    Ok((mean(&global[..channels]), mean(&global[channels..])))
}

/// The batch statistics of a training pass: per channel the mean and biased variance of `x`
/// (of every replica's batch together, with `replicas`), and `1/N` for the `N` examples'
/// values they cover (0 when there are none).
fn batch_moments(
    x: &Tensor,
    channels: usize,
    replicas: Option<&Arc<dyn AllReduceSum>>,
) -> Result<(Moments, f64), TensorError> {
    let count = (x.len() / channels.max(1)) as f64;
    moments_from_sums(channel_sums(x.host(), channels), count, replicas)
}

/// [`batch_moments`] from this replica's per-channel `Σx` and `Σx²` over `count` values each.
pub(super) fn moments_from_sums(
    (mut sums, mut squares): (Vec<f64>, Vec<f64>),
    mut count: f64,
    replicas: Option<&Arc<dyn AllReduceSum>>,
) -> Result<(Moments, f64), TensorError> {
    let channels = sums.len();
    if let Some(replicas) = replicas {
        let mut packed: Vec<f32> = sums.iter().chain(&squares).map(|&v| v as f32).collect();
        packed.push(count as f32);
        replicas
            .all_reduce_sum(&mut packed)
            .map_err(|why| TensorError::Collective { op: OP, why })?;
        count = f64::from(packed[2 * channels]);
        sums = packed[..channels].iter().map(|&v| f64::from(v)).collect();
        squares = packed[channels..2 * channels]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
    }
    // No example anywhere: nothing is normalised, and nothing is divided by zero.
    let inverse_count = if count > 0.0 { 1.0 / count } else { 0.0 };
    let mean = sums.iter().map(|s| (s * inverse_count) as f32).collect();
    let variance = sums
        .iter()
        .zip(&squares)
        .map(|(s, q)| {
            let m = s * inverse_count;
            // E[x²] − E[x]², never below zero (rounding can take it there).
            (q * inverse_count - m * m).max(0.0) as f32
        })
        .collect();
    Ok((Moments { mean, variance }, inverse_count))
}

/// A training pass of batch normalization over the last axis of `x`: each channel normalised
/// with the batch's mean and biased variance, `(x − mean)/√(variance + ε) · γ + β`, and those
/// statistics returned. With `replicas`, the statistics are those of every replica's batch
/// together (their sums of `x` and `x²` and their counts in one all-reduce), and the backward
/// pass all-reduces its two per-channel sums likewise, as a synchronised batch normalization
/// (every replica must then run it). Sums accumulate in `f64`. Runs on the CPU.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let x = Tensor::from_vec(vec![1.0, 10.0, 3.0, 10.0], &[2, 2])?;
/// let (y, moments) = ops::batch_norm(&x, ops::Affine::default(), 0.0, None)?;
/// assert_eq!(moments.mean, [2.0, 10.0]);
/// assert_eq!(moments.variance, [1.0, 0.0]);
/// assert_eq!(y.to_vec()?[..1], [-1.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// A scalar `x`, `γ` or `β` of another length than the channels, a tensor on a GPU, or the
/// replicas' collective failing.
pub fn batch_norm(
    x: &Tensor,
    affine_part: Affine<'_>,
    epsilon: f32,
    replicas: Option<&Arc<dyn AllReduceSum>>,
) -> Result<(Tensor, Moments), TensorError> {
    let channels = channels_of(x)?;
    affine_part.check(channels)?;
    let (moments, inverse_count) = batch_moments(x, channels, replicas)?;
    let inverse = inverse_deviation(&moments.variance, epsilon);
    let (a, b) = affine_part.coefficients(&moments.mean, &inverse);
    let y = affine(x.host(), &a, &b, None);
    let saved = Saved::new(x, affine_part, (moments.mean.clone(), inverse), a);
    let replicas = replicas.cloned();
    let shape = x.shape().to_vec();
    let output = Tensor::from_op(y, shape.clone(), &affine_part.inputs(x), move |dy, _| {
        let sums = gradient_sums(dy.host(), saved.x.host(), &saved.mean, &saved.inverse);
        let reduce = (replicas.as_ref(), inverse_count);
        saved.training_gradients(sums, reduce, &shape, |a, (k1, k2)| {
            affine(dy.host(), a, k1, Some((saved.x.host(), k2)))
        })
    });
    Ok((output, moments))
}

/// [`batch_norm`] followed by a relu (when `relu`) and max pooling `pool` over NHWC `x`: what
/// `BatchNormalization → Activation("relu") → MaxPooling2D` computes, with the same values and
/// gradients bit for bit. Where the pooling windows do not overlap (stride equal to the
/// window, `valid` padding) it runs as one pass that never stores the full-size normalised
/// activation or its gradient; otherwise it is the three operations one after the other.
///
/// # Errors
///
/// As [`batch_norm`], and as [`super::max_pool2d`] for the pooling of its output.
pub fn batch_norm_max_pool(
    x: &Tensor,
    affine_part: Affine<'_>,
    epsilon: f32,
    replicas: Option<&Arc<dyn AllReduceSum>>,
    relu: bool,
    pool: MaxPool,
) -> Result<(Tensor, Moments), TensorError> {
    let channels = channels_of(x)?;
    affine_part.check(channels)?;
    let g = geometry(
        "max_pool2d",
        x.shape(),
        pool.size,
        pool.stride,
        pool.padding,
    )?;
    let fused = pool.stride == pool.size
        && pool.padding == Padding::Valid
        && (1..usize::from(NO_POSITION)).contains(&(pool.size.0 * pool.size.1));
    if !fused {
        let (y, moments) = batch_norm(x, affine_part, epsilon, replicas)?;
        let pooled = max_pool2d(&y, pool.size, pool.stride, pool.padding)?;
        let pooled = if relu { super::relu(&pooled)? } else { pooled };
        return Ok((pooled, moments));
    }
    let (moments, inverse_count) = batch_moments(x, channels, replicas)?;
    let inverse = inverse_deviation(&moments.variance, epsilon);
    let (a, b) = affine_part.coefficients(&moments.mean, &inverse);
    let (pooled, argmax) = batch_norm_pool::forward(x.host(), (&a, &b), relu, &g);
    let saved = Saved::new(x, affine_part, (moments.mean.clone(), inverse), a);
    let replicas = replicas.cloned();
    let shape = x.shape().to_vec();
    let pooled_shape = vec![g.batch, g.out_h, g.out_w, g.channels];
    let output = Tensor::from_op(pooled, pooled_shape, &affine_part.inputs(x), move |d, y| {
        let grad = PooledGrad {
            values: d.host(),
            relu_output: relu.then(|| y.host()),
            argmax: &argmax,
        };
        let routing = batch_norm_pool::Routing::new(grad);
        let statistics = (&saved.mean[..], &saved.inverse[..]);
        let sums = batch_norm_pool::gradient_sums(&routing, saved.x.host(), statistics, &g);
        let reduce = (replicas.as_ref(), inverse_count);
        saved.training_gradients(sums, reduce, &shape, |a, k| {
            batch_norm_pool::input_gradient(&routing, saved.x.host(), a, k, &g)
        })
    });
    Ok((output, moments))
}

/// An inference pass of batch normalization over the last axis of `x`, with given statistics
/// (the moving mean and variance, `[channels]` each): `(x − mean)/√(variance + ε) · γ + β`.
/// Differentiable in `x`, `γ` and `β`. Runs on the CPU.
///
/// # Errors
///
/// A scalar `x`, statistics, `γ` or `β` of another length than the channels, or a tensor on a
/// GPU.
pub fn batch_norm_inference(
    x: &Tensor,
    affine_part: Affine<'_>,
    mean: &Tensor,
    variance: &Tensor,
    epsilon: f32,
) -> Result<Tensor, TensorError> {
    let channels = channels_of(x)?;
    affine_part.check(channels)?;
    per_channel(mean, channels, "the mean")?;
    per_channel(variance, channels, "the variance")?;
    let mean = mean.to_vec()?;
    let inverse = inverse_deviation(&variance.to_vec()?, epsilon);
    let (a, b) = affine_part.coefficients(&mean, &inverse);
    let y = affine(x.host(), &a, &b, None);
    let saved = Saved::new(x, affine_part, (mean, inverse), a);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(
        y,
        shape.clone(),
        &affine_part.inputs(x),
        move |dy, _| {
            let sums = gradient_sums(dy.host(), saved.x.host(), &saved.mean, &saved.inverse);
            saved.gradients(sums, |saved, _, _| {
                if !saved.x.requires_grad() {
                    return Ok(None);
                }
                let zeros = vec![0.0; saved.a.len()];
                Ok(Some(Tensor::raw(
                    affine(dy.host(), &saved.a, &zeros, None),
                    shape.clone(),
                )))
            })
        },
    ))
}
