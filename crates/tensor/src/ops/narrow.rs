//! A run of indices along one axis, as `torch.narrow` (or a basic slice `x[:, a:b]`).

use super::gpu::{On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// The `len` indices of `x` from `start` along `axis`, every other axis whole. The gradient is
/// the output's gradient put back in its place, zeros elsewhere. Runs on the CPU (on a GPU it
/// is an error naming the operation).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let middle = ops::narrow(&x, 1, 1, 2)?;
/// assert_eq!(middle.shape(), [2, 2]);
/// assert_eq!(middle.to_vec()?, [2.0, 3.0, 5.0, 6.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// An axis past the rank, a run past the axis's end, or a tensor on a GPU.
pub fn narrow(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor, TensorError> {
    const OP: &str = "narrow";
    let Some(&extent) = x.shape().get(axis) else {
        return Err(TensorError::invalid(
            OP,
            format!("axis {axis} of a rank-{} tensor", x.rank()),
        ));
    };
    if start.checked_add(len).is_none_or(|end| end > extent) {
        return Err(TensorError::invalid(
            OP,
            format!("indices {start}..{start}+{len} of an axis of {extent}"),
        ));
    }
    if let On::Cuda(_) = on(OP, &[x])? {
        return Err(TensorError::device(OP, x.device(), "runs on the CPU only"));
    }
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let values = x.host();
    let mut data = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let from = (o * extent + start) * inner;
        data.extend_from_slice(&values[from..from + len * inner]);
    }
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    let input_shape = x.shape().to_vec();
    Ok(Tensor::from_op(data, shape, &[x], move |g, _| {
        let mut d = vec![0.0_f32; outer * extent * inner];
        for (o, part) in g.host().chunks_exact((len * inner).max(1)).enumerate() {
            let from = (o * extent + start) * inner;
            d[from..from + part.len()].copy_from_slice(part);
        }
        Ok(vec![Some(Tensor::raw(d, input_shape.clone()))])
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;

    #[test]
    fn the_gradient_of_a_narrowed_run_lands_in_its_place() {
        let x = Tensor::parameter((0..12).map(|v| v as f32).collect(), &[2, 3, 2]).unwrap();
        let part = narrow(&x, 1, 2, 1).unwrap();
        assert_eq!(part.to_vec().unwrap(), [4.0, 5.0, 10.0, 11.0]);
        let loss = ops::sum(&ops::mul(&part, &part).unwrap(), &[0, 1, 2], false).unwrap();
        let grads = loss.backward().unwrap();
        let expected = [0., 0., 0., 0., 8., 10., 0., 0., 0., 0., 20., 22.];
        assert_eq!(grads.get(&x).unwrap().to_vec().unwrap(), expected);
    }

    #[test]
    fn a_run_past_the_axis_is_an_error_not_a_panic() {
        let x = Tensor::from_vec(vec![0.0; 6], &[2, 3]).unwrap();
        assert!(narrow(&x, 1, 2, 2).is_err());
        assert!(narrow(&x, 1, usize::MAX, 2).is_err());
        assert!(narrow(&x, 2, 0, 1).is_err());
        assert_eq!(narrow(&x, 1, 3, 0).unwrap().shape(), [2, 0]);
    }
}
