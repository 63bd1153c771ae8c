//! Matrix products: of two matrices, and of batches of matrices over any leading axes, which
//! broadcast (`[..., m, k] × [..., k, n] → [..., m, n]`, as `NumPy`'s and Keras' `matmul`).

use super::broadcast::{broadcast_shape, source_offsets};
use super::gpu::{On, on};
use crate::error::TensorError;
use crate::kernels::gemm::{Batch, batched_matmul};
use crate::tensor::{Tensor, count_values};

/// `a [..., m, k] · b [..., k, n] → [..., m, n]`: one product per position of the leading
/// axes, which broadcast (a `[k, n]` weight against a `[batch, time, m, k]` input, a mask's
/// batch of one against many).
///
/// Two matrices take the dense layers' product. A batch's products run in parallel, each on
/// one thread, so each product's bits are the same whatever the batch around it.
///
/// ```
/// use lockstep_tensor::{Tensor, ops};
///
/// let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 1, 2])?; // two 1×2 rows
/// let b = Tensor::from_vec(vec![1.0, 1.0], &[2, 1])?; // one 2×1 column, shared
/// let y = ops::matmul(&a, &b)?;
/// assert_eq!(y.shape(), [2, 1, 1]);
/// assert_eq!(y.host_data()?, [3.0, 7.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When an operand has fewer than two axes, the inner dimensions differ, or the leading axes
/// do not broadcast; a batch (more than two axes) on a GPU.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    const OP: &str = "matmul";
    if a.rank() == 2 && b.rank() == 2 {
        return super::fused::product(OP, a, b, None, false);
    }
    let (&[m, k], &[k2, n]) = (last_two(a), last_two(b)) else {
        return Err(TensorError::mismatch(
            OP,
            a.shape(),
            b.shape(),
            "both operands need at least two axes, [..., m, k] and [..., k, n]",
        ));
    };
    if k != k2 {
        return Err(TensorError::mismatch(
            OP,
            a.shape(),
            b.shape(),
            format!("inner dimensions {k} and {k2} differ"),
        ));
    }
    let (lead_a, lead_b) = (&a.shape()[..a.rank() - 2], &b.shape()[..b.rank() - 2]);
    let lead = broadcast_shape(OP, lead_a, lead_b)?;
    let shape: Vec<usize> = lead.iter().copied().chain([m, n]).collect();
    count_values(OP, &shape)?;
    if let On::Cuda(_) = on(OP, &[a, b])? {
        return Err(TensorError::device(
            OP,
            a.device(),
            "a batch of products runs on the CPU only; two matrices run here",
        ));
    }
    let products = count_values(OP, &lead)?;
    let (left, right) = (
        Operand::new(a, lead_a, &lead, (m, k)),
        Operand::new(b, lead_b, &lead, (k, n)),
    );
    let mut out = vec![0.0_f32; products * m * n];
    batched_matmul(&mut out, left.batch(false), right.batch(false))?;
    Ok(Tensor::from_op(out, shape, &[a, b], move |g, _| {
        let starts: Vec<usize> = (0..products).map(|i| i * m * n).collect();
        let grad = Batch {
            data: g.host(),
            starts: &starts,
            rows: m,
            cols: n,
            transposed: false,
        };
        // dA = G · Bᵀ and dB = Aᵀ · G, each summed over the products that shared a matrix.
        Ok(vec![
            left.gradient(products, grad, right.batch(true))?,
            right.gradient(products, left.batch(true), grad)?,
        ])
    }))
}

/// One operand of a batch of products: its matrices, and which one each product reads.
struct Operand {
    tensor: Tensor,
    wanted: bool,
    /// For each product, the index of its matrix among the operand's own.
    which: Vec<usize>,
    /// For each product, the offset of its matrix.
    starts: Vec<usize>,
    rows: usize,
    cols: usize,
}

impl Operand {
    fn new(t: &Tensor, own: &[usize], lead: &[usize], (rows, cols): (usize, usize)) -> Self {
        let which = source_offsets(own, lead);
        let starts = which.iter().map(|&i| i * rows * cols).collect();
        Self {
            tensor: t.detach(),
            wanted: t.requires_grad(),
            which,
            starts,
            rows,
            cols,
        }
    }

    fn batch(&self, transposed: bool) -> Batch<'_> {
        Batch {
            data: self.tensor.host(),
            starts: &self.starts,
            rows: self.rows,
            cols: self.cols,
            transposed,
        }
    }

    /// This operand's gradient, `lhs · rhs` for every product summed into the matrix the
    /// product read; `None` when it wants none.
    fn gradient(
        &self,
        products: usize,
        lhs: Batch<'_>,
        rhs: Batch<'_>,
    ) -> Result<Option<Tensor>, TensorError> {
        if !self.wanted {
            return Ok(None);
        }
        let size = self.rows * self.cols;
        let mut full = vec![0.0_f32; products * size];
        batched_matmul(&mut full, lhs, rhs)?;
        let count = self.tensor.len() / size.max(1);
        Ok(Some(Tensor::raw(
            gather_sums(full, &self.which, count, size),
            self.tensor.shape().to_vec(),
        )))
    }
}

/// The last two dimensions of `t` (an empty slice when it has fewer).
fn last_two(t: &Tensor) -> &[usize] {
    t.shape()
        .get(t.rank().saturating_sub(2)..)
        .filter(|s| s.len() == 2)
        .unwrap_or(&[])
}

/// `count` matrices of `size` values, matrix `j` the sum, in product order, of the matrices of
/// `full` whose product read it (`which[i] == j`).
fn gather_sums(full: Vec<f32>, which: &[usize], count: usize, size: usize) -> Vec<f32> {
    if which.len() == count && which.iter().enumerate().all(|(i, &j)| i == j) {
        return full;
    }
    let mut out = vec![0.0_f32; count * size];
    if size == 0 {
        return out;
    }
    for (&j, part) in which.iter().zip(full.chunks_exact(size)) {
        for (o, &v) in out[j * size..(j + 1) * size].iter_mut().zip(part) {
            *o += v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_product_reads_the_matrices_broadcasting_assigns_it() {
        // a: [2, 1, 2, 3] (two groups, one matrix each); b: [3, 3, 2] (three matrices).
        let a_values: Vec<f32> = (0..12).map(|v| v as f32 * 0.5 - 2.0).collect();
        let b_values: Vec<f32> = (0..18).map(|v| (v as f32 * 0.25) - 1.0).collect();
        let a = Tensor::from_vec(a_values.clone(), &[2, 1, 2, 3]).unwrap();
        let b = Tensor::from_vec(b_values.clone(), &[3, 3, 2]).unwrap();
        let y = matmul(&a, &b).unwrap();
        assert_eq!(y.shape(), [2, 3, 2, 2]);
        let y = y.host_data().unwrap();
        for (group, matrix) in (0..2).flat_map(|g| (0..3).map(move |j| (g, j))) {
            for (row, col) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let want: f32 = (0..3)
                    .map(|i| a_values[group * 6 + row * 3 + i] * b_values[matrix * 6 + i * 2 + col])
                    .sum();
                let got = y[((group * 3 + matrix) * 2 + row) * 2 + col];
                assert!(
                    (got - want).abs() < 1e-5,
                    "({group}, {matrix}) [{row}, {col}]: {got} vs {want}"
                );
            }
        }
    }
}
