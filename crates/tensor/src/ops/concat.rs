//! Joining tensors along an axis, as Keras' `Concatenate` and `tf.concat`.

use super::gpu::{On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// The tensors joined along `axis`: every other axis must agree. The gradient is cut back
/// into each input's part. Runs on the CPU (on a GPU it is an error naming the operation).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::from_vec(vec![5.0, 6.0], &[2, 1])?;
/// let c = ops::concat(&[&a, &b], 1)?;
/// assert_eq!(c.shape(), [2, 3]);
/// assert_eq!(c.to_vec()?, [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// No tensors, an axis past their rank, shapes that differ off the axis, or tensors on a GPU.
pub fn concat(tensors: &[&Tensor], axis: usize) -> Result<Tensor, TensorError> {
    const OP: &str = "concat";
    let (first, rest) = tensors
        .split_first()
        .ok_or_else(|| TensorError::invalid(OP, "needs at least one tensor"))?;
    if axis >= first.rank() {
        return Err(TensorError::invalid(
            OP,
            format!("axis {axis} of a rank-{} tensor", first.rank()),
        ));
    }
    for t in rest {
        let agrees = t.rank() == first.rank()
            && t.shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !agrees {
            return Err(TensorError::mismatch(
                OP,
                first.shape(),
                t.shape(),
                "the shapes differ off the joined axis",
            ));
        }
    }
    if let On::Cuda(_) = on(OP, tensors)? {
        return Err(TensorError::device(
            OP,
            first.device(),
            "runs on the CPU only",
        ));
    }
    let outer: usize = first.shape()[..axis].iter().product();
    let inner: usize = first.shape()[axis + 1..].iter().product();
    // Values of each input per outer index, and of the output.
    let widths: Vec<usize> = tensors.iter().map(|t| t.shape()[axis] * inner).collect();
    let total: usize = widths.iter().sum();
    let mut data = Vec::with_capacity(outer * total);
    for o in 0..outer {
        for (t, &w) in tensors.iter().zip(&widths) {
            data.extend_from_slice(&t.host()[o * w..(o + 1) * w]);
        }
    }
    let mut shape = first.shape().to_vec();
    shape[axis] = tensors.iter().map(|t| t.shape()[axis]).sum();
    let shapes: Vec<Vec<usize>> = tensors.iter().map(|t| t.shape().to_vec()).collect();
    Ok(Tensor::from_op(data, shape, tensors, move |g, _| {
        let g = g.host();
        let mut parts: Vec<Vec<f32>> = widths
            .iter()
            .map(|w| Vec::with_capacity(outer * w))
            .collect();
        for o in 0..outer {
            let mut at = o * total;
            for (part, &w) in parts.iter_mut().zip(&widths) {
                part.extend_from_slice(&g[at..at + w]);
                at += w;
            }
        }
        Ok(parts
            .into_iter()
            .zip(&shapes)
            .map(|(part, shape)| Some(Tensor::raw(part, shape.clone())))
            .collect())
    }))
}
