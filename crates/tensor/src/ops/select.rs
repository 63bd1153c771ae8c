//! Choosing between two tensors by a mask: Keras' `ops.where`, TensorFlow's `tf.where` of three
//! arguments.

use super::broadcast::{broadcast_shape, stretched, sum_to};
use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// `if_true` where `condition` is non-zero, else `if_false`, the three broadcast together
/// (`NumPy`'s rules). A boolean mask is a tensor of ones and zeros; the condition gets no
/// gradient, each branch gets the gradient where it was chosen.
///
/// An attention mask is either this (a boolean mask choosing between the scores and a large
/// negative value) or an additive one ([`super::add`]).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let mask = Tensor::from_vec(vec![1.0, 0.0], &[2])?;
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let y = ops::select(&mask, &x, &Tensor::scalar(-1e9))?;
/// assert_eq!(y.host_data()?, [1.0, -1e9, 3.0, -1e9]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When the shapes do not broadcast; on a GPU, when they differ (broadcasting runs on the CPU
/// only, as for the arithmetic).
pub fn select(
    condition: &Tensor,
    if_true: &Tensor,
    if_false: &Tensor,
) -> Result<Tensor, TensorError> {
    const OP: &str = "select";
    let branches = broadcast_shape(OP, if_true.shape(), if_false.shape())?;
    let shape = broadcast_shape(OP, condition.shape(), &branches)?;
    if let On::Cuda(buffers) = on(OP, &[condition, if_true, if_false])? {
        return gpu::select(condition, (if_true, if_false), &buffers);
    }
    let chosen: Vec<bool> = stretched(condition, &shape)
        .into_iter()
        .map(|c| c != 0.0)
        .collect();
    let (a, b) = (stretched(if_true, &shape), stretched(if_false, &shape));
    let out: Vec<f32> = chosen
        .iter()
        .zip(a.iter().zip(&b))
        .map(|(&c, (&a, &b))| if c { a } else { b })
        .collect();
    let (sa, sb, full) = (
        if_true.shape().to_vec(),
        if_false.shape().to_vec(),
        shape.clone(),
    );
    Ok(Tensor::from_op(
        out,
        shape,
        &[if_true, if_false],
        move |g, _| {
            let (mut da, mut db) = (g.host().to_vec(), g.host().to_vec());
            for ((&c, da), db) in chosen.iter().zip(&mut da).zip(&mut db) {
                if c {
                    *db = 0.0;
                } else {
                    *da = 0.0;
                }
            }
            Ok(vec![
                Some(Tensor::raw(sum_to(&da, &full, &sa), sa.clone())),
                Some(Tensor::raw(sum_to(&db, &full, &sb), sb.clone())),
            ])
        },
    ))
}
