//! Softmax and log-softmax along any axis.

use super::gpu::{self, On, on};
use super::permute::{axis_index, permute};
use crate::error::TensorError;
use crate::kernels::softmax::{self as kernel, Along};
use crate::tensor::Tensor;

/// Softmax along `axis` (negative counts from the end: `-1` is the last, Keras' default).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let x = Tensor::from_vec(vec![0.0, 1.0, 0.0, 1.0], &[2, 2])?; // two equal rows
/// assert_eq!(ops::softmax(&x, 0)?.host_data()?, [0.5, 0.5, 0.5, 0.5]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When `axis` is outside `x`'s rank (a scalar has none).
pub fn softmax(x: &Tensor, axis: isize) -> Result<Tensor, TensorError> {
    let axis = axis_index("softmax", x.shape(), axis)?;
    let last = x.rank() - 1;
    if let On::Cuda(buffers) = on("softmax", &[x])? {
        if axis == last {
            return gpu::softmax(x, &buffers, x.shape()[last]);
        }
        // The GPU's kernel works on rows: the axis is moved last and back.
        let swap = swapped(x.rank(), axis);
        return permute(&softmax(&permute(x, &swap)?, -1)?, &swap);
    }
    let along = Along::axis(x.shape(), axis);
    let probs: Vec<f32> = kernel::log_softmax_along(x.host(), along)
        .into_iter()
        .map(f32::exp)
        .collect();
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(probs, shape.clone(), &[x], move |g, y| {
        let d = kernel::softmax_grad_along(y.host(), g.host(), along);
        Ok(vec![Some(Tensor::raw(d, shape.clone()))])
    }))
}

/// Log-softmax along `axis` (negative counts from the end), stable for any values: each is
/// taken less the log-sum-exp of its lane, which is computed after subtracting the lane's
/// maximum.
///
/// # Errors
///
/// When `axis` is outside `x`'s rank, or `x` is on a GPU (the losses there use the fused
/// [`super::sparse_softmax_cross_entropy_with_logits`]).
pub fn log_softmax(x: &Tensor, axis: isize) -> Result<Tensor, TensorError> {
    let axis = axis_index("log_softmax", x.shape(), axis)?;
    if let On::Cuda(_) = on("log_softmax", &[x])? {
        return Err(TensorError::device(
            "log_softmax",
            x.device(),
            "runs on the CPU only",
        ));
    }
    let along = Along::axis(x.shape(), axis);
    let out = kernel::log_softmax_along(x.host(), along);
    let shape = x.shape().to_vec();
    Ok(Tensor::from_op(out, shape.clone(), &[x], move |g, y| {
        let d = kernel::log_softmax_grad_along(y.host(), g.host(), along);
        Ok(vec![Some(Tensor::raw(d, shape.clone()))])
    }))
}

/// The permutation of `rank` axes that swaps `axis` with the last (its own inverse).
fn swapped(rank: usize, axis: usize) -> Vec<usize> {
    let mut axes: Vec<usize> = (0..rank).collect();
    axes.swap(axis, rank - 1);
    axes
}
