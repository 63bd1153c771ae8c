//! Shape changes that share data.

use crate::error::TensorError;
use crate::tensor::{Tensor, count_values};

/// The same values under another shape of the same size; shares the data.
///
/// # Errors
///
/// When the sizes differ.
pub fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor, TensorError> {
    if count_values("reshape", shape)? != x.len() {
        return Err(TensorError::mismatch(
            "reshape",
            x.shape(),
            shape,
            "the sizes differ",
        ));
    }
    let original = x.shape().to_vec();
    Ok(Tensor::view_op(x, shape.to_vec(), move |g, _| {
        Ok(vec![Some(g.reshaped(original.clone()))])
    }))
}

/// `[batch, …] → [batch, product of the rest]`, as Keras' `Flatten`.
///
/// # Errors
///
/// When `x` has rank 0.
pub fn flatten(x: &Tensor) -> Result<Tensor, TensorError> {
    let (&batch, rest) = x
        .shape()
        .split_first()
        .ok_or_else(|| TensorError::invalid("flatten", "needs a batch axis"))?;
    reshape(x, &[batch, count_values("flatten", rest)?])
}
