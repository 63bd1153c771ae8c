//! `NumPy` broadcasting: shapes aligned on the right, size-1 dimensions stretched.

use crate::error::TensorError;
use crate::tensor::{Tensor, count_values};

/// The shape two operands broadcast to.
pub(crate) fn broadcast_shape(
    op: &'static str,
    a: &[usize],
    b: &[usize],
) -> Result<Vec<usize>, TensorError> {
    let rank = a.len().max(b.len());
    let shape = (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank {
                a[i + a.len() - rank]
            } else {
                1
            };
            let db = if i + b.len() >= rank {
                b[i + b.len() - rank]
            } else {
                1
            };
            match (da, db) {
                _ if da == db => Ok(da),
                (1, d) | (d, 1) => Ok(d),
                _ => Err(TensorError::mismatch(
                    op,
                    a,
                    b,
                    format!("dimension {da} cannot broadcast with {db}"),
                )),
            }
        })
        .collect::<Result<Vec<usize>, TensorError>>()?;
    count_values(op, &shape)?;
    Ok(shape)
}

/// For each element of a tensor of shape `out`, the offset of the element of a tensor of shape
/// `shape` (broadcast to `out`) that it reads.
pub(crate) fn source_offsets(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let rank = out.len();
    let mut strides = vec![0_usize; rank];
    let mut stride = 1;
    for i in (0..shape.len()).rev() {
        let o = i + rank - shape.len();
        strides[o] = if shape[i] == 1 { 0 } else { stride };
        stride *= shape[i];
    }
    let total: usize = out.iter().product();
    let mut offsets = Vec::with_capacity(total);
    let mut index = vec![0_usize; rank];
    let mut offset = 0;
    for _ in 0..total {
        offsets.push(offset);
        for d in (0..rank).rev() {
            index[d] += 1;
            offset += strides[d];
            if index[d] < out[d] {
                break;
            }
            offset -= strides[d] * index[d];
            index[d] = 0;
        }
    }
    offsets
}

/// Sums a gradient of shape `out` down to the shape `shape` it was broadcast from.
pub(crate) fn sum_to(grad: &[f32], out: &[usize], shape: &[usize]) -> Vec<f32> {
    if out == shape {
        return grad.to_vec();
    }
    let mut reduced = vec![0.0_f32; shape.iter().product()];
    for (&g, offset) in grad.iter().zip(source_offsets(shape, out)) {
        reduced[offset] += g;
    }
    reduced
}

/// `t`'s values (on the host) at every position of `shape` it broadcasts to.
pub(crate) fn stretched(t: &Tensor, shape: &[usize]) -> Vec<f32> {
    if t.shape() == shape {
        return t.host().to_vec();
    }
    source_offsets(t.shape(), shape)
        .into_iter()
        .map(|i| t.host()[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_from_the_right() {
        assert_eq!(broadcast_shape("t", &[2, 3], &[3]).unwrap(), [2, 3]);
        assert_eq!(
            broadcast_shape("t", &[4, 1, 3], &[2, 1]).unwrap(),
            [4, 2, 3]
        );
        assert_eq!(broadcast_shape("t", &[], &[2]).unwrap(), [2]);
        let err = broadcast_shape("add", &[2, 3], &[2]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "add: shapes [2, 3] and [2] do not fit: dimension 3 cannot broadcast with 2"
        );
    }

    #[test]
    fn offsets_repeat_broadcast_dimensions() {
        assert_eq!(source_offsets(&[3], &[2, 3]), [0, 1, 2, 0, 1, 2]);
        assert_eq!(source_offsets(&[2, 1], &[2, 3]), [0, 0, 0, 1, 1, 1]);
        assert_eq!(sum_to(&[1.0; 6], &[2, 3], &[2, 1]), [3.0, 3.0]);
    }
}
