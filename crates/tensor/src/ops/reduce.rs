//! Sums and means over axes.

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::reduce::sum_middle;
use crate::tensor::{Tensor, count_values};

/// The input viewed as `[outer, mid, inner]` around a contiguous run of reduced axes.
fn reduction_plan(
    op: &'static str,
    shape: &[usize],
    axes: &[usize],
) -> Result<Vec<bool>, TensorError> {
    let mut reduced = vec![false; shape.len()];
    for &axis in axes {
        match reduced.get_mut(axis) {
            Some(r) if !*r => *r = true,
            Some(_) => {
                return Err(TensorError::invalid(
                    op,
                    format!("axis {axis} is listed twice"),
                ));
            }
            None => {
                return Err(TensorError::invalid(
                    op,
                    format!("axis {axis} is out of range for shape {shape:?}"),
                ));
            }
        }
    }
    Ok(reduced)
}

/// Sums `x` over `axes`, keeping them as size-1 dimensions when `keepdims` is set.
///
/// Axes are reduced one at a time from the last, each as a fixed-order sum, so the result is
/// deterministic.
///
/// # Errors
///
/// When an axis is out of range or repeated.
pub fn sum(x: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor, TensorError> {
    let reduced = reduction_plan("sum", x.shape(), axes)?;
    if let On::Cuda(buffers) = on("sum", &[x])? {
        return sum_on_gpu(x, &buffers, &reduced, keepdims);
    }
    let mut data = x.host().to_vec();
    let mut shape = x.shape().to_vec();
    for axis in (0..shape.len()).rev().filter(|&a| reduced[a]) {
        // Sub-products of a tensor's shape always fit (`element_count`).
        let outer = count_values("sum", &shape[..axis])?;
        let inner = count_values("sum", &shape[axis + 1..])?;
        data = sum_middle(&data, outer, shape[axis], inner);
        shape[axis] = 1;
    }
    let out_shape = reduced_shape(&shape, &reduced, keepdims);
    let kept = shape;
    let input_shape = x.shape().to_vec();
    Ok(Tensor::from_op(data, out_shape, &[x], move |g, _| {
        // Every input element receives the gradient of the sum it went into.
        let offsets = super::broadcast::source_offsets(&kept, &input_shape);
        let d: Vec<f32> = offsets.into_iter().map(|i| g.host()[i]).collect();
        Ok(vec![Some(Tensor::raw(d, input_shape.clone()))])
    }))
}

/// The mean of `x` over `axes`.
///
/// # Errors
///
/// When an axis is out of range or repeated.
pub fn mean(x: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor, TensorError> {
    let total = sum(x, axes, keepdims)?;
    let count: usize = axes.iter().filter_map(|&a| x.shape().get(a)).product();
    super::scale(&total, 1.0 / count.max(1) as f32)
}

/// The kept dimensions of `shape`: size 1 where reduced when `keepdims`, else left out.
fn reduced_shape(shape: &[usize], reduced: &[bool], keepdims: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(reduced)
        .filter(|&(_, &r)| keepdims || !r)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect()
}

/// A sum on a GPU: over leading axes (all of them included: a loss's mean, a bias's
/// gradient), which is one kernel; other axes are reduced on the CPU only.
fn sum_on_gpu(
    x: &Tensor,
    buffers: &[&lockstep_cuda::CudaBuffer],
    reduced: &[bool],
    keepdims: bool,
) -> Result<Tensor, TensorError> {
    let leading = reduced.iter().take_while(|&&r| r).count();
    if reduced[leading..].iter().any(|&r| r) {
        return Err(TensorError::device(
            "sum",
            x.device(),
            format!(
                "reducing axes {:?} of shape {:?}: a GPU reduces leading axes only",
                (0..reduced.len())
                    .filter(|&a| reduced[a])
                    .collect::<Vec<_>>(),
                x.shape()
            ),
        ));
    }
    let inner = count_values("sum", &x.shape()[leading..])?;
    let out_shape = reduced_shape(x.shape(), reduced, keepdims);
    gpu::sum_leading(x, buffers, inner, out_shape)
}
