//! Broadcasting arithmetic and the bias add of dense and convolution layers.

use lockstep_cuda::ops::Binary;

use super::broadcast::{broadcast_shape, source_offsets, stretched, sum_to};
use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::{elementwise, reduce};
use crate::tensor::Tensor;

fn binary(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<(Vec<f32>, Vec<usize>), TensorError> {
    let shape = broadcast_shape(op, a.shape(), b.shape())?;
    if a.shape() == b.shape() {
        return Ok((elementwise::zip(a.host(), b.host(), f), shape));
    }
    let (ia, ib) = (
        source_offsets(a.shape(), &shape),
        source_offsets(b.shape(), &shape),
    );
    let data = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| f(a.host()[i], b.host()[j]))
        .collect();
    Ok((data, shape))
}

/// `a + b`, broadcasting.
///
/// # Errors
///
/// When the shapes do not broadcast.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("add", &[a, b])? {
        return gpu::arithmetic("add", Binary::Add, (a, b), &buffers);
    }
    let (data, shape) = binary("add", a, b, |x, y| x + y)?;
    let (sa, sb, out) = (a.shape().to_vec(), b.shape().to_vec(), shape.clone());
    Ok(Tensor::from_op(data, shape, &[a, b], move |g, _| {
        Ok(vec![
            Some(Tensor::raw(sum_to(g.host(), &out, &sa), sa.clone())),
            Some(Tensor::raw(sum_to(g.host(), &out, &sb), sb.clone())),
        ])
    }))
}

/// `a − b`, broadcasting.
///
/// # Errors
///
/// When the shapes do not broadcast.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("sub", &[a, b])? {
        return gpu::arithmetic("sub", Binary::Sub, (a, b), &buffers);
    }
    let (data, shape) = binary("sub", a, b, |x, y| x - y)?;
    let (sa, sb, out) = (a.shape().to_vec(), b.shape().to_vec(), shape.clone());
    Ok(Tensor::from_op(data, shape, &[a, b], move |g, _| {
        let neg: Vec<f32> = g.host().iter().map(|v| -v).collect();
        Ok(vec![
            Some(Tensor::raw(sum_to(g.host(), &out, &sa), sa.clone())),
            Some(Tensor::raw(sum_to(&neg, &out, &sb), sb.clone())),
        ])
    }))
}

/// `a · b` elementwise, broadcasting.
///
/// # Errors
///
/// When the shapes do not broadcast.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("mul", &[a, b])? {
        return gpu::arithmetic("mul", Binary::Mul, (a, b), &buffers);
    }
    let (data, shape) = binary("mul", a, b, |x, y| x * y)?;
    let (ca, cb, out) = (a.clone(), b.clone(), shape.clone());
    Ok(Tensor::from_op(data, shape, &[a, b], move |g, _| {
        let (va, vb) = (stretched(&ca, &out), stretched(&cb, &out));
        let da = elementwise::zip(g.host(), &vb, |g, y| g * y);
        let db = elementwise::zip(g.host(), &va, |g, x| g * x);
        Ok(vec![
            Some(Tensor::raw(
                sum_to(&da, &out, ca.shape()),
                ca.shape().to_vec(),
            )),
            Some(Tensor::raw(
                sum_to(&db, &out, cb.shape()),
                cb.shape().to_vec(),
            )),
        ])
    }))
}

/// `a / b` elementwise, broadcasting.
///
/// # Errors
///
/// When the shapes do not broadcast.
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("div", &[a, b])? {
        return gpu::arithmetic("div", Binary::Div, (a, b), &buffers);
    }
    let (data, shape) = binary("div", a, b, |x, y| x / y)?;
    let (ca, cb, out) = (a.clone(), b.clone(), shape.clone());
    Ok(Tensor::from_op(data, shape, &[a, b], move |g, _| {
        let (va, vb) = (stretched(&ca, &out), stretched(&cb, &out));
        let da = elementwise::zip(g.host(), &vb, |g, y| g / y);
        let db: Vec<f32> = g
            .host()
            .iter()
            .zip(&va)
            .zip(&vb)
            .map(|((g, x), y)| -g * x / (y * y))
            .collect();
        Ok(vec![
            Some(Tensor::raw(
                sum_to(&da, &out, ca.shape()),
                ca.shape().to_vec(),
            )),
            Some(Tensor::raw(
                sum_to(&db, &out, cb.shape()),
                cb.shape().to_vec(),
            )),
        ])
    }))
}

/// `x · factor` for a constant factor.
///
/// # Errors
///
/// The GPU's error, when `x` is on one.
pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor, TensorError> {
    if let On::Cuda(buffers) = on("scale", &[x])? {
        return gpu::scale(x, &buffers, factor);
    }
    let data = elementwise::map(x.host(), |v| v * factor);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(data, shape.clone(), &[x], move |g, _| {
        Ok(vec![Some(Tensor::raw(
            elementwise::map(g.host(), |v| v * factor),
            shape.clone(),
        ))])
    }))
}

/// Adds `bias [c]` along the last axis of `x [..., c]` (the bias of `Dense` and `Conv2D` layers).
///
/// # Errors
///
/// When `bias` is not 1-D or its length differs from `x`'s last dimension.
pub fn bias_add(x: &Tensor, bias: &Tensor) -> Result<Tensor, TensorError> {
    let c = bias.len();
    if bias.rank() != 1 || x.shape().last() != Some(&c) {
        return Err(TensorError::mismatch(
            "bias_add",
            x.shape(),
            bias.shape(),
            "the bias must be 1-D with the input's last dimension",
        ));
    }
    if let On::Cuda(buffers) = on("bias_add", &[x, bias])? {
        return gpu::bias_add(x, bias, &buffers);
    }
    let data = elementwise::add_rows(x.host(), bias.host(), |v| v);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(
        data,
        shape.clone(),
        &[x, bias],
        move |g, _| {
            Ok(vec![
                Some(Tensor::raw(g.host().to_vec(), shape.clone())),
                Some(Tensor::raw(reduce::sum_rows(g.host(), c), vec![c])),
            ])
        },
    ))
}
