//! Reordering axes: `permute` (TensorFlow's `transpose` with `perm`, PyTorch's `permute`) and
//! `transpose` of two axes.

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::permute as kernel;
use crate::tensor::Tensor;

/// `axis` of a tensor of `shape` as an index: negative counts from the end (`-1` the last).
///
/// # Errors
///
/// When it is outside the rank.
pub(crate) fn axis_index(
    op: &'static str,
    shape: &[usize],
    axis: isize,
) -> Result<usize, TensorError> {
    let rank = shape.len().cast_signed();
    let index = if axis < 0 { axis + rank } else { axis };
    if (0..rank).contains(&index) {
        Ok(index.cast_unsigned())
    } else {
        Err(TensorError::invalid(
            op,
            format!("axis {axis} is outside shape {shape:?}"),
        ))
    }
}

/// `x` with its axes reordered: axis `i` of the result is axis `axes[i]` of `x`. A copy.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3])?;
/// let t = ops::permute(&x, &[1, 0])?;
/// assert_eq!(t.shape(), [3, 2]);
/// assert_eq!(t.host_data()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When `axes` is not a permutation of `0..x.rank()`; the GPU's error, when `x` is on one.
pub fn permute(x: &Tensor, axes: &[usize]) -> Result<Tensor, TensorError> {
    let rank = x.rank();
    let mut seen = vec![false; rank];
    let is_permutation = axes.len() == rank
        && axes
            .iter()
            .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true));
    if !is_permutation {
        return Err(TensorError::invalid(
            "permute",
            format!(
                "{axes:?} is not a permutation of the axes of shape {:?}",
                x.shape()
            ),
        ));
    }
    let shape: Vec<usize> = axes.iter().map(|&a| x.shape()[a]).collect();
    let inverse = kernel::inverse(axes);
    if let On::Cuda(buffers) = on("permute", &[x])? {
        return gpu::permute(x, &buffers, axes, shape, inverse);
    }
    let out = kernel::permute(x.host(), x.shape(), axes);
    Ok(Tensor::from_op(out, shape, &[x], move |g, _| {
        Ok(vec![Some(permute(g, &inverse)?)])
    }))
}

/// `x` with axes `a` and `b` swapped (negative counts from the end), as PyTorch's
/// `transpose(a, b)`; `transpose(x, -2, -1)` transposes the matrices of a batch.
///
/// # Errors
///
/// When an axis is outside `x`'s rank; the GPU's error, when `x` is on one.
pub fn transpose(x: &Tensor, a: isize, b: isize) -> Result<Tensor, TensorError> {
    let a = axis_index("transpose", x.shape(), a)?;
    let b = axis_index("transpose", x.shape(), b)?;
    let mut axes: Vec<usize> = (0..x.rank()).collect();
    axes.swap(a, b);
    permute(x, &axes)
}
