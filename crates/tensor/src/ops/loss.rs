//! The fused softmax cross-entropy, and argmax.

use super::gpu::{self, On, on};
use crate::error::TensorError;
use crate::kernels::softmax as kernel;
use crate::tensor::Tensor;

fn rows_and_classes(op: &'static str, x: &Tensor) -> Result<(usize, usize), TensorError> {
    match x.shape() {
        &[rows, classes] => Ok((rows, classes)),
        other => Err(TensorError::invalid(
            op,
            format!("expects [batch, classes], not shape {other:?}"),
        )),
    }
}

/// Per-example cross-entropy between softmax(`logits [batch, classes]`) and integer `labels`,
/// fused and stable for any logits (TensorFlow's
/// `sparse_softmax_cross_entropy_with_logits`). Returns `[batch]`.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let logits = Tensor::from_vec(vec![1000.0, 0.0, 0.0, 1000.0], &[2, 2])?;
/// let loss = ops::sparse_softmax_cross_entropy_with_logits(&logits, &[0, 0])?;
/// assert_eq!(loss.host_data()?, [0.0, 1000.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When `logits` is not 2-D, the label count differs from the batch, or a label is not a
/// class index.
pub fn sparse_softmax_cross_entropy_with_logits(
    logits: &Tensor,
    labels: &[usize],
) -> Result<Tensor, TensorError> {
    const OP: &str = "sparse_softmax_cross_entropy_with_logits";
    let (rows, classes) = rows_and_classes(OP, logits)?;
    if labels.len() != rows {
        return Err(TensorError::invalid(
            OP,
            format!("{} labels for a batch of {rows}", labels.len()),
        ));
    }
    if let Some((i, &label)) = labels.iter().enumerate().find(|&(_, &l)| l >= classes) {
        return Err(TensorError::invalid(
            OP,
            format!("label {label} at index {i} is not below the {classes} classes"),
        ));
    }
    if let On::Cuda(buffers) = on(OP, &[logits])? {
        return gpu::sparse_softmax_cross_entropy(logits, &buffers, labels, classes);
    }
    let (losses, grad) = kernel::sparse_softmax_cross_entropy(logits.host(), labels, classes);
    Ok(Tensor::from_op(
        losses,
        vec![rows],
        &[logits],
        move |g, _| {
            let mut d = grad.clone();
            for (row, &scale) in d.chunks_exact_mut(classes).zip(g.host()) {
                for v in row {
                    *v *= scale;
                }
            }
            Ok(vec![Some(Tensor::raw(d, vec![rows, classes]))])
        },
    ))
}

/// The index of the largest value in each row of `[batch, classes]` (the first on ties).
///
/// # Errors
///
/// When `x` is not 2-D; the GPU's error, when `x` is on one.
pub fn argmax(x: &Tensor) -> Result<Vec<usize>, TensorError> {
    let (_, classes) = rows_and_classes("argmax", x)?;
    if classes == 0 {
        return Err(TensorError::invalid("argmax", "there are no classes"));
    }
    // The indices are wanted on the host (metrics, predictions): a GPU's values are read back.
    let values = match x.host_data() {
        Ok(values) => std::borrow::Cow::Borrowed(values),
        Err(_) => std::borrow::Cow::Owned(x.to_vec()?),
    };
    Ok(values
        .chunks_exact(classes)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
        })
        .collect())
}
