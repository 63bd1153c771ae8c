//! A first convolution, batch normalization's training pass, a relu and max pooling as one
//! operation that never computes the convolution's full-size output: what
//! `Conv2D → BatchNormalization → Activation("relu") → MaxPooling2D` computes at the input of
//! a network, the way inference engines fold batch normalization into the convolution before
//! it, here in training.
//!
//! - **Statistics.** The batch's mean and variance of each output channel follow from sums
//!   over the input patches ([`patch_moments`]): `Σx = Σpatch · w` and
//!   `Σx² = wᵀ (Σ patch ⊗ patch) w`, in `f64`, for kernel column `w`.
//! - **Forward.** The statistics fold into the kernel and bias (`x̂ = patch · w·s + (b − m)·s`),
//!   and the direct convolution pools `x̂ · γ + β` window by window
//!   ([`direct_forward_normalized`]), keeping each pooled value's `x̂`.
//! - **Backward.** `Σdy` and `Σdy · x̂` run over the pooled values (the only places `dy` is not
//!   zero); the kernel's gradient `Σ patch ⊗ dx`, with batch normalization's
//!   `dx = a·(dy − mean(dy) − x̂ · mean(dy · x̂))`, is `a·(Σ patch ⊗ dy)`, which the direct
//!   method's backward pass computes from the pooled gradient, less the mean terms, which the
//!   patch sums give: `Σ patch ⊗ (x − m) = (Σ patch ⊗ patch) w + Σpatch · (b − m)`.
//!
//! The values equal those of the operations apart up to rounding (the sums are taken in another
//! order); the work splits into fixed pieces, so results do not depend on the thread count.
//! Only where the direct method applies (a few values per patch, non-overlapping pooling) and
//! the input wants no gradient (a first layer); otherwise the operations run apart.

use std::sync::Arc;

use super::all_reduce::AllReduceSum;
use super::batch_norm::{
    Affine, Moments, batch_norm_max_pool, gradient_means, inverse_deviation, moments_from_sums,
};
use super::conv::{Padding, geometry};
use super::fused::{MaxPool, conv_geometry, conv2d_bias_relu, inputs};
use super::gpu::{On, on};
use crate::error::TensorError;
use crate::kernels::batch_norm::pooled_gradient_sums;
use crate::kernels::conv_pool::{
    NormalizedPooled, PooledConv, PooledLowering, direct_backward, direct_forward_normalized,
};
use crate::kernels::geometry::{Geometry, PoolWindow};
use crate::kernels::patch_gram::{PatchMoments, patch_moments};
use crate::kernels::window_max::PooledGrad;
use crate::tensor::Tensor;

/// `max_pool(relu?(batch_norm(conv2d(x, kernel) + bias)))` in training: the convolution with
/// `stride` and `padding`, batch normalization with the batch's statistics (synchronised over
/// `replicas` as [`super::batch_norm`] does), an optional relu and max pooling `pool`; returns
/// the pooled output and the statistics, as [`batch_norm_max_pool`] does. Differentiable in the
/// kernel, the bias, `γ` and `β`; a first layer's input gets no gradient here, so an input that
/// wants one runs the operations apart, as does any layer the fused method does not fit.
///
/// ```
/// use lockstep_tensor::{Tensor, ops::{self, MaxPool, Padding}};
///
/// let x = Tensor::from_vec((0..2 * 4 * 4).map(|i| (i % 7) as f32).collect(), &[2, 4, 4, 1])?;
/// let kernel = Tensor::parameter(vec![1.0, -1.0, 0.5, 2.0], &[2, 2, 1, 1])?;
/// let pool = MaxPool { size: (3, 3), stride: (3, 3), padding: Padding::Valid };
/// let (pooled, moments) = ops::conv2d_batch_norm_max_pool(
///     &x, (&kernel, None), ((1, 1), Padding::Valid), ops::Affine::default(), 1e-3, None, true, pool,
/// )?;
/// assert_eq!(pooled.shape(), [2, 1, 1, 1]);
/// // The statistics are those of the whole 3×3 output of each image, pooled or not.
/// let y = ops::conv2d(&x, &kernel, (1, 1), Padding::Valid)?.to_vec()?;
/// let mean = y.iter().sum::<f32>() / y.len() as f32;
/// assert!((moments.mean[0] - mean).abs() < 1e-5);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// As [`conv2d_bias_relu`] and [`batch_norm_max_pool`].
#[allow(
    clippy::too_many_arguments,
    reason = "the three layers' settings, as Keras' layers take them"
)]
pub fn conv2d_batch_norm_max_pool(
    x: &Tensor,
    (kernel, bias): (&Tensor, Option<&Tensor>),
    (stride, padding): ((usize, usize), Padding),
    affine_part: Affine<'_>,
    epsilon: f32,
    replicas: Option<&Arc<dyn AllReduceSum>>,
    relu: bool,
    pool: MaxPool,
) -> Result<(Tensor, Moments), TensorError> {
    let (g, filters) = conv_geometry(x, kernel, bias, stride, padding)?;
    let window = PoolWindow {
        h: pool.size.0,
        w: pool.size.1,
    };
    let conv_out = [g.batch, g.out_h, g.out_w, filters];
    geometry(
        "max_pool2d",
        &conv_out,
        pool.size,
        pool.stride,
        pool.padding,
    )?;
    let operands: Vec<&Tensor> = inputs(x, kernel, bias)
        .into_iter()
        .chain(affine_part.gamma)
        .chain(affine_part.beta)
        .collect();
    let on_cpu = matches!(on("conv2d", &operands)?, On::Cpu);
    let direct = on_cpu
        && !x.requires_grad()
        && pool.stride == pool.size
        && pool.padding == Padding::Valid
        && PooledConv::new(&g, filters, window, false)
            .is_some_and(|layer| layer.lowering == PooledLowering::Direct);
    if !direct {
        let y = conv2d_bias_relu(x, kernel, bias, false, stride, padding)?;
        return batch_norm_max_pool(&y, affine_part, epsilon, replicas, relu, pool);
    }
    affine_part.check(filters)?;
    let layer = Folded::new(x, (kernel, bias), (g, filters));
    let (moments, inverse_count) = moments_from_sums(layer.sums(), layer.count(), replicas)?;
    let inverse = inverse_deviation(&moments.variance, epsilon);
    let (a, _) = affine_part.coefficients(&moments.mean, &inverse);
    let per_filter = |t: Option<&Tensor>, default: f32| {
        t.map_or_else(|| vec![default; filters], |t| t.host().to_vec())
    };
    let gamma_beta = (
        per_filter(affine_part.gamma, 1.0),
        per_filter(affine_part.beta, 0.0),
    );
    let folded = layer.normalized(&moments.mean, &inverse);
    let NormalizedPooled {
        pooled,
        argmax,
        selected,
    } = direct_forward_normalized(
        x.host(),
        (&folded.0, &folded.1),
        (&gamma_beta.0, &gamma_beta.1),
        relu,
        filters,
        &g,
        window,
    );
    let replicas = replicas.cloned();
    let statistics = (moments.mean.clone(), inverse, a);
    let flags = (affine_part.gamma.is_some(), affine_part.beta.is_some());
    let shape = vec![g.batch, g.out_h / window.h, g.out_w / window.w, filters];
    let output = Tensor::from_op(pooled, shape, &operands, move |d, y| {
        let grad = PooledGrad {
            values: d.host(),
            relu_output: relu.then(|| y.host()),
            argmax: &argmax,
        };
        let sums = pooled_gradient_sums(grad, &selected, filters);
        let means = gradient_means((&sums.0, &sums.1), replicas.as_ref(), inverse_count)?;
        let (routed, _) = direct_backward(layer.x.host(), grad, filters, &g, window);
        let (kernel_grad, bias_grad) = layer.gradients(&routed, &sums.0, means, &statistics);
        let to_f32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
        let mut grads = vec![
            None,
            Some(Tensor::raw(kernel_grad, layer.kernel.shape().to_vec())),
        ];
        if layer.bias.is_some() {
            grads.push(Some(Tensor::raw(bias_grad, vec![filters])));
        }
        if flags.0 {
            grads.push(Some(Tensor::raw(to_f32(&sums.1), vec![filters])));
        }
        if flags.1 {
            grads.push(Some(Tensor::raw(to_f32(&sums.0), vec![filters])));
        }
        Ok(grads)
    });
    Ok((output, moments))
}

/// The convolution's operands and its input's patch sums, from which the batch statistics,
/// the folded kernel and the gradients follow.
struct Folded {
    x: Tensor,
    kernel: Tensor,
    bias: Option<Tensor>,
    filters: usize,
    patches: PatchMoments,
    /// `Σ patch ⊗ x` without the bias: `(Σ patch ⊗ patch) · kernel`, `[patch][filters]`.
    patch_outputs: Vec<f64>,
    /// `Σ x` without the bias: `Σpatch · kernel`, `[filters]`.
    output_sums: Vec<f64>,
}

impl Folded {
    fn new(
        x: &Tensor,
        (kernel, bias): (&Tensor, Option<&Tensor>),
        (g, filters): (Geometry, usize),
    ) -> Self {
        let patches = patch_moments(x.host(), &g);
        let (w, p) = (kernel.host(), g.patch());
        let mut patch_outputs = vec![0.0_f64; p * filters];
        for t in 0..p {
            let out = &mut patch_outputs[t * filters..(t + 1) * filters];
            for s in 0..p {
                let gram = patches.gram[t * p + s];
                for (o, &w) in out.iter_mut().zip(&w[s * filters..(s + 1) * filters]) {
                    *o += gram * f64::from(w);
                }
            }
        }
        let mut output_sums = vec![0.0_f64; filters];
        for t in 0..p {
            for (o, &w) in output_sums
                .iter_mut()
                .zip(&w[t * filters..(t + 1) * filters])
            {
                *o += patches.sums[t] * f64::from(w);
            }
        }
        Self {
            x: x.clone(),
            kernel: kernel.clone(),
            bias: bias.cloned(),
            filters,
            patches,
            patch_outputs,
            output_sums,
        }
    }

    fn count(&self) -> f64 {
        self.patches.count as f64
    }

    fn bias(&self, c: usize) -> f64 {
        self.bias.as_ref().map_or(0.0, |b| f64::from(b.host()[c]))
    }

    /// Per filter, `Σx` and `Σx²` of the convolution's output (bias included).
    fn sums(&self) -> (Vec<f64>, Vec<f64>) {
        let (w, n) = (self.kernel.host(), self.count());
        let f = self.filters;
        (0..f)
            .map(|c| {
                let b = self.bias(c);
                let sum = self.output_sums[c];
                let quadratic: f64 = (0..self.patches.sums.len())
                    .map(|t| f64::from(w[t * f + c]) * self.patch_outputs[t * f + c])
                    .sum();
                (sum + n * b, quadratic + 2.0 * b * sum + n * b * b)
            })
            .unzip()
    }

    /// The kernel and bias whose convolution is `x̂ = (x − mean) · inverse`.
    fn normalized(&self, mean: &[f32], inverse: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let f = self.filters;
        let kernel = self
            .kernel
            .host()
            .iter()
            .enumerate()
            .map(|(i, &w)| w * inverse[i % f])
            .collect();
        let bias = (0..f)
            .map(|c| ((self.bias(c) - f64::from(mean[c])) * f64::from(inverse[c])) as f32)
            .collect();
        (kernel, bias)
    }

    /// The kernel's and the bias's gradients: `a · (Σ patch ⊗ dy − mean(dy) · Σpatch −
    /// s · mean(dy·x̂) · Σ patch ⊗ (x − m))` and its sum over positions likewise, from
    /// `routed = Σ patch ⊗ dy`, this replica's `Σdy` and the global means.
    fn gradients(
        &self,
        routed: &[f32],
        sum_dy: &[f64],
        (mean_dy, mean_dy_xhat): (Vec<f64>, Vec<f64>),
        (mean, inverse, a): &(Vec<f32>, Vec<f32>, Vec<f32>),
    ) -> (Vec<f32>, Vec<f32>) {
        let (f, n) = (self.filters, self.count());
        let p = self.patches.sums.len();
        let mut kernel = vec![0.0_f32; p * f];
        for t in 0..p {
            let sum_patch = self.patches.sums[t];
            for c in 0..f {
                let m = f64::from(mean[c]);
                let centred = self.patch_outputs[t * f + c] + sum_patch * (self.bias(c) - m);
                let value = f64::from(routed[t * f + c])
                    - mean_dy[c] * sum_patch
                    - f64::from(inverse[c]) * mean_dy_xhat[c] * centred;
                kernel[t * f + c] = (f64::from(a[c]) * value) as f32;
            }
        }
        let bias = (0..f)
            .map(|c| {
                let m = f64::from(mean[c]);
                let centred = self.output_sums[c] + n * (self.bias(c) - m);
                let value =
                    sum_dy[c] - mean_dy[c] * n - f64::from(inverse[c]) * mean_dy_xhat[c] * centred;
                (f64::from(a[c]) * value) as f32
            })
            .collect();
        (kernel, bias)
    }
}
