//! Matrix product.

use crate::error::TensorError;
use crate::kernels::gemm::{MatRef, matmul as kernel};
use crate::tensor::Tensor;

/// `a [m, k] · b [k, n] → [m, n]`.
///
/// # Errors
///
/// When an operand is not 2-D or the inner dimensions differ.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    let (&[m, k], &[k2, n]) = (a.shape(), b.shape()) else {
        return Err(TensorError::mismatch(
            "matmul",
            a.shape(),
            b.shape(),
            "both operands must be 2-D",
        ));
    };
    if k != k2 {
        return Err(TensorError::mismatch(
            "matmul",
            a.shape(),
            b.shape(),
            format!("inner dimensions {k} and {k2} differ"),
        ));
    }
    let mut out = vec![0.0_f32; m * n];
    kernel(&mut out, plain(a, m, k), plain(b, k, n), false);
    let (ca, cb) = (a.clone(), b.clone());
    Ok(Tensor::from_op(out, vec![m, n], &[a, b], move |g, _| {
        let da = ca.requires_grad().then(|| {
            let mut d = vec![0.0_f32; m * k];
            kernel(
                &mut d,
                plain(g, m, n),
                MatRef {
                    data: cb.data(),
                    rows: k,
                    cols: n,
                    transposed: true,
                },
                false,
            );
            Tensor::raw(d, vec![m, k])
        });
        let db = cb.requires_grad().then(|| {
            let mut d = vec![0.0_f32; k * n];
            kernel(
                &mut d,
                MatRef {
                    data: ca.data(),
                    rows: m,
                    cols: k,
                    transposed: true,
                },
                plain(g, m, n),
                false,
            );
            Tensor::raw(d, vec![k, n])
        });
        Ok(vec![da, db])
    }))
}

fn plain(t: &Tensor, rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data: t.data(),
        rows,
        cols,
        transposed: false,
    }
}
