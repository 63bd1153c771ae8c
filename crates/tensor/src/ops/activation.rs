//! Elementwise nonlinearities.

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::elementwise;
use crate::tensor::Tensor;

/// `max(x, 0)`.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn relu(x: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("relu", &[x])? {
        return gpu::relu(x, &buffers);
    }
    let out = elementwise::map(x.host(), |v| v.max(0.0));
    Ok(Tensor::from_op(out, x.shape().to_vec(), &[x], |g, y| {
        Ok(vec![Some(relu_grad(g, y)?)])
    }))
}

/// The gradient through a relu, from its output: it passed exactly where the output is positive.
pub(crate) fn relu_grad(g: &Tensor, y: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(_) = on("relu", &[g, y])? {
        return gpu::relu_grad(g, y);
    }
    Ok(Tensor::raw(
        elementwise::zip(g.host(), y.host(), |g, y| if y > 0.0 { g } else { 0.0 }),
        y.shape().to_vec(),
    ))
}

/// Natural logarithm.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn log(x: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("log", &[x])? {
        return gpu::log(x, &buffers);
    }
    let out = elementwise::map(x.host(), f32::ln);
    let input = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            Ok(vec![Some(Tensor::raw(
                elementwise::zip(g.host(), input.host(), |g, v| g / v),
                input.shape().to_vec(),
            ))])
        },
    ))
}

/// `e` to the power of each value.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn exp(x: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("exp", &[x])? {
        return gpu::exp(x, &buffers);
    }
    let out = elementwise::map(x.host(), f32::exp);
    Ok(Tensor::from_op(out, x.shape().to_vec(), &[x], |g, y| {
        Ok(vec![Some(Tensor::raw(
            elementwise::zip(g.host(), y.host(), |g, e| g * e),
            y.shape().to_vec(),
        ))])
    }))
}

/// The logistic function `1 / (1 + e^−x)`, with the gradient `y·(1 − y)` from its output.
///
/// On a GPU it is composed of the GPU's operations, on `x` clipped to `±80` (where `f32`'s
/// sigmoid has saturated), so that no intermediate overflows into the gradient.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn sigmoid(x: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(_) = on("sigmoid", &[x])? {
        let bounded = clip(x, -80.0, 80.0)?;
        let decay = exp(&super::scale(&bounded, -1.0)?)?;
        let one = Tensor::full(x.shape(), 1.0)?.to_device(x.device())?;
        return super::div(&one, &super::add(&one, &decay)?);
    }
    let out = elementwise::map(x.host(), |v| {
        // Each branch computes e^−|v| only, which cannot overflow.
        if v >= 0.0 {
            1.0 / (1.0 + (-v).exp())
        } else {
            let e = v.exp();
            e / (1.0 + e)
        }
    });
    Ok(Tensor::from_op(out, x.shape().to_vec(), &[x], |g, y| {
        Ok(vec![Some(Tensor::raw(
            elementwise::zip(g.host(), y.host(), |g, y| g * y * (1.0 - y)),
            y.shape().to_vec(),
        ))])
    }))
}

/// `|x|`, as `relu(x) + relu(−x)`: on every device, with the gradient `sign(x)` (0 at 0).
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn abs(x: &Tensor) -> Result<Tensor, TensorError> {
    super::add(&relu(x)?, &relu(&super::scale(x, -1.0)?)?)
}

/// Values limited to `[min, max]`; the gradient passes where the value was inside.
///
/// # Errors
///
/// When `min > max`; the GPU's error, when `x` is on one.
pub fn clip(x: &Tensor, min: f32, max: f32) -> Result<Tensor, TensorError> {
    if min > max || min.is_nan() || max.is_nan() {
        return Err(TensorError::invalid(
            "clip",
            format!("min {min} must not exceed max {max}"),
        ));
    }
    if let On::Cuda(buffers) = on("clip", &[x])? {
        return gpu::clip(x, &buffers, (min, max));
    }
    let out = elementwise::map(x.host(), |v| v.clamp(min, max));
    let input = x.clone();
    Ok(Tensor::from_op(
        out,
        x.shape().to_vec(),
        &[x],
        move |g, _| {
            let d = elementwise::zip(g.host(), input.host(), |g, v| {
                if (min..=max).contains(&v) { g } else { 0.0 }
            });
            Ok(vec![Some(Tensor::raw(d, input.shape().to_vec()))])
        },
    ))
}
