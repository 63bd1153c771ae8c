//! The smooth functions of one value that sequence models use: `tanh`, GELU (exact and
//! tanh-approximated), `SiLU`, `sqrt` and `rsqrt`. One recipe per function, the same on the CPU
//! as in `lockstep-cuda`'s kernels, and a derivative taken from the input or from the output,
//! whichever needs no recomputation.

pub use lockstep_cuda::ops::Pointwise;

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::elementwise;
use crate::tensor::Tensor;

/// `1/√2`, `1/√(2π)` and `√(2/π)`, rounded to `f32` as the kernels' constants are.
const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f32 = 0.398_942_3;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term of GELU's tanh approximation (Hendrycks and Gimpel; Keras' `approximate`).
const GELU_CUBIC: f32 = 0.044_715;

/// Which GELU: Keras' `gelu(x, approximate=…)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gelu {
    /// `x·Φ(x)` through `erf` (`approximate=False`, PyTorch's default).
    #[default]
    Exact,
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (`approximate=True`, GPT-2's).
    Tanh,
}

/// The logistic function, with no overflow: each branch takes `e^−|v|` only.
fn logistic(v: f32) -> f32 {
    if v >= 0.0 {
        1.0 / (1.0 + (-v).exp())
    } else {
        let e = v.exp();
        e / (1.0 + e)
    }
}

/// `f(x)`.
fn value(f: Pointwise, x: f32) -> f32 {
    match f {
        Pointwise::Tanh => x.tanh(),
        Pointwise::Gelu => 0.5 * x * (1.0 + libm::erff(x * SQRT_HALF)),
        Pointwise::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh();
            0.5 * x * (1.0 + t)
        }
        Pointwise::Silu => x * logistic(x),
        Pointwise::Sqrt => x.sqrt(),
        Pointwise::Rsqrt => 1.0 / x.sqrt(),
    }
}

/// `g·f′`, at the output `at` where [`Pointwise::grad_from_output`], else at the input.
fn grad(f: Pointwise, g: f32, at: f32) -> f32 {
    match f {
        Pointwise::Tanh => g * (1.0 - at * at),
        Pointwise::Gelu => {
            let cdf = 0.5 * (1.0 + libm::erff(at * SQRT_HALF));
            let pdf = INV_SQRT_2PI * (-0.5 * at * at).exp();
            g * (cdf + at * pdf)
        }
        Pointwise::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (at + GELU_CUBIC * at * at * at)).tanh();
            let slope = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * at * at);
            g * (0.5 * (1.0 + t) + 0.5 * at * (1.0 - t * t) * slope)
        }
        Pointwise::Silu => {
            let s = logistic(at);
            g * (s * (1.0 + at * (1.0 - s)))
        }
        Pointwise::Sqrt => g * 0.5 / at,
        Pointwise::Rsqrt => g * (-0.5 * at * at * at),
    }
}

fn apply(op: &'static str, f: Pointwise, x: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on(op, &[x])? {
        return gpu::pointwise(op, f, x, &buffers);
    }
    let out = elementwise::map(x.host(), |v| value(f, v));
    let input = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, y| {
            let at = if f.grad_from_output() { y } else { &input };
            Ok(vec![Some(Tensor::raw(
                elementwise::zip(g.host(), at.host(), |g, at| grad(f, g, at)),
                input.shape().to_vec(),
            ))])
        },
    ))
}

/// The hyperbolic tangent.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn tanh(x: &Tensor) -> Result<Tensor, TensorError> {
    apply("tanh", Pointwise::Tanh, x)
}

/// The Gaussian error linear unit, exact or tanh-approximated.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let x = Tensor::from_vec(vec![-1.0, 0.0, 1.0], &[3])?;
/// let y = ops::gelu(&x, ops::Gelu::Exact)?.to_vec()?;
/// assert!((y[2] - 0.841_344_7).abs() < 1e-6 && y[1] == 0.0);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn gelu(x: &Tensor, kind: Gelu) -> Result<Tensor, TensorError> {
    match kind {
        Gelu::Exact => apply("gelu", Pointwise::Gelu, x),
        Gelu::Tanh => apply("gelu", Pointwise::GeluTanh, x),
    }
}

/// `x·σ(x)`, the sigmoid linear unit (swish).
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn silu(x: &Tensor) -> Result<Tensor, TensorError> {
    apply("silu", Pointwise::Silu, x)
}

/// The square root (NaN below zero, as `f32::sqrt`).
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn sqrt(x: &Tensor) -> Result<Tensor, TensorError> {
    apply("sqrt", Pointwise::Sqrt, x)
}

/// `1 / √x`, as `1 / sqrt(x)` rounded twice (not a hardware estimate), so that the CPU and the
/// GPU agree.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn rsqrt(x: &Tensor) -> Result<Tensor, TensorError> {
    apply("rsqrt", Pointwise::Rsqrt, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_its_definition_and_the_approximation_stays_close() {
        for x in [-3.0_f32, -1.0, -0.25, 0.0, 0.5, 2.0] {
            let exact = value(Pointwise::Gelu, x);
            let phi = 0.5 * (1.0 + libm::erf(f64::from(x) / std::f64::consts::SQRT_2));
            assert!(
                (f64::from(exact) - f64::from(x) * phi).abs() < 1e-6,
                "{x}: {exact}"
            );
            let approx = value(Pointwise::GeluTanh, x);
            assert!((approx - exact).abs() < 2e-3, "{x}: {approx} vs {exact}");
        }
    }

    #[test]
    fn silu_saturates_without_overflow() {
        assert_eq!(value(Pointwise::Silu, -200.0), -0.0);
        assert_eq!(value(Pointwise::Silu, 200.0), 200.0);
        assert!(grad(Pointwise::Silu, 1.0, -200.0).abs() < 1e-30);
    }
}
