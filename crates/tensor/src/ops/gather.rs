//! Rows of a table picked by index, as an embedding lookup (`tf.gather` on axis 0).

use super::gpu::{On, on};
use crate::error::TensorError;
use crate::tensor::Tensor;

/// The rows `ids` of `table` (`[rows, width]`), as `[ids.len(), width]`. The gradient adds
/// each output row's gradient into the row it came from, in the order of `ids` (a row picked
/// twice gets both). Runs on the CPU (on a GPU it is an error naming the operation).
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let table = Tensor::from_vec(vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2])?;
/// let picked = ops::gather_rows(&table, &[2, 0, 2])?;
/// assert_eq!(picked.to_vec()?, [20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// A table that is not 2-D, an index past its rows, or a table on a GPU.
pub fn gather_rows(table: &Tensor, ids: &[usize]) -> Result<Tensor, TensorError> {
    const OP: &str = "gather_rows";
    let &[rows, width] = table.shape() else {
        return Err(TensorError::invalid(
            OP,
            format!(
                "a table of shape {:?}: it must be [rows, width]",
                table.shape()
            ),
        ));
    };
    if let Some(bad) = ids.iter().find(|&&id| id >= rows) {
        return Err(TensorError::invalid(
            OP,
            format!("index {bad} of a table of {rows} rows"),
        ));
    }
    if let On::Cuda(_) = on(OP, &[table])? {
        return Err(TensorError::device(
            OP,
            table.device(),
            "runs on the CPU only",
        ));
    }
    let values = table.host();
    let mut data = Vec::with_capacity(ids.len() * width);
    for &id in ids {
        data.extend_from_slice(&values[id * width..(id + 1) * width]);
    }
    let ids = ids.to_vec();
    Ok(Tensor::from_op(
        data,
        vec![ids.len(), width],
        &[table],
        move |g, _| {
            let mut d = vec![0.0_f32; rows * width];
            for (row, &id) in g.host().chunks_exact(width.max(1)).zip(&ids) {
                for (slot, value) in d[id * width..(id + 1) * width].iter_mut().zip(row) {
                    *slot += value;
                }
            }
            Ok(vec![Some(Tensor::raw(d, vec![rows, width]))])
        },
    ))
}
