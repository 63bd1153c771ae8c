//! Huge dimensions: a shape whose size overflows `usize` is an error, never a panic, a wrapped
//! size or an out-of-bounds read. Dimensions are drawn so that every shape either overflows or
//! stays small (nothing here allocates more than a few megabytes).

use lockstep_tensor::kernels::gemm::{MatRef, matmul, matmul_new};
use lockstep_tensor::ops::{self, Padding};
use lockstep_tensor::{Tensor, element_count};
use proptest::prelude::*;

/// Sizes that overflow when two of them (or one and a small one) are multiplied.
const HUGE: [usize; 4] = [1 << 32, (1 << 33) + 1, usize::MAX / 3, usize::MAX];

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0_usize..4, 1 => proptest::sample::select(&HUGE[..])]
}

/// Small enough to allocate in a test.
fn small(count: Option<usize>) -> bool {
    count.is_some_and(|n| n <= 1 << 16)
}

proptest! {
    #[test]
    fn zeros_and_full_fail_exactly_when_the_size_overflows(shape in proptest::collection::vec(dim(), 0..5)) {
        let count = element_count(&shape);
        prop_assume!(count.is_none() || small(count));
        let zeros = Tensor::zeros(&shape);
        prop_assert_eq!(zeros.is_ok(), count.is_some());
        if let Ok(t) = zeros {
            prop_assert_eq!(Some(t.len()), count);
        }
        prop_assert_eq!(Tensor::full(&shape, 1.0).is_ok(), count.is_some());
    }

    #[test]
    fn gemm_never_reads_past_operands_whose_dimensions_lie(
        (a_rows, a_cols, b_cols) in (dim(), dim(), dim()),
        (a_len, b_len, dst_len) in (0_usize..16, 0_usize..16, 0_usize..16),
        (a_t, b_t, accumulate) in (any::<bool>(), any::<bool>(), any::<bool>()),
    ) {
        let (a, b) = (vec![1.0_f32; a_len], vec![1.0_f32; b_len]);
        let mut dst = vec![0.0_f32; dst_len];
        // Stored shapes such that the inner dimensions agree as read.
        let (m, k) = (a_rows, a_cols);
        let lhs = MatRef { data: &a, rows: if a_t { k } else { m }, cols: if a_t { m } else { k }, transposed: a_t };
        let rhs = MatRef { data: &b, rows: if b_t { b_cols } else { k }, cols: if b_t { k } else { b_cols }, transposed: b_t };
        let fits = |r: usize, c: usize, len: usize| r.checked_mul(c).is_some_and(|n| n <= len);
        let operands_fit = fits(m, k, a_len) && fits(k, b_cols, b_len);
        let result = matmul(&mut dst, lhs, rhs, accumulate);
        prop_assert_eq!(result.is_ok(), operands_fit && fits(m, b_cols, dst_len), "{:?}", result);
        if let Ok(()) = result {
            // Every value the product wrote is the inner dimension (sums of ones), or what
            // accumulation added to zeros.
            prop_assert!(dst[..m * b_cols].iter().all(|&v| v == k as f32));
        }
        let product = m.checked_mul(b_cols);
        if product.is_none() || small(product) {
            let fresh = matmul_new(lhs, rhs);
            prop_assert_eq!(fresh.is_ok(), operands_fit && product.is_some(), "{:?}", fresh.err());
        }
    }

    #[test]
    fn ops_whose_output_size_overflows_are_errors(m in dim(), n in dim(), batch in dim(), side in dim()) {
        // Empty operands whose product is not empty: [m, 0] · [0, n] → [m, n].
        let a = Tensor::zeros(&[m, 0]);
        let b = Tensor::zeros(&[0, n]);
        if let (Ok(a), Ok(b)) = (a, b) {
            let out = element_count(&[m, n]);
            if out.is_none() || small(out) {
                prop_assert_eq!(ops::matmul(&a, &b).is_ok(), out.is_some());
            }
        }
        // An input with no channels whose output has some: [batch, side, side, 0] → F filters.
        let (x, k) = (Tensor::zeros(&[batch, side, side, 0]), Tensor::zeros(&[1, 1, 0, 3]));
        if let (Ok(x), Ok(k)) = (x, k) {
            let out = element_count(&[batch, side, side, 3]);
            if (out.is_none() || small(out)) && side > 0 {
                prop_assert_eq!(ops::conv2d(&x, &k, (1, 1), Padding::Valid).is_ok(), out.is_some());
            }
        }
        // A window as tall as a dimension can be, over an empty input with `same` padding:
        // the padding (window − 1) and the im2col rows (2·2 positions × window) must fit.
        if let (Ok(x), Ok(k)) = (Tensor::zeros(&[0, 2, 2, 0]), Tensor::zeros(&[side, 1, 0, 1])) {
            let result = ops::conv2d(&x, &k, (1, 1), Padding::Same);
            let fits = side > 0 && side.checked_add(1).is_some() && element_count(&[2, 2, side]).is_some();
            prop_assert_eq!(result.is_ok(), fits, "{:?}", result.err());
        }
        // Broadcasting [m, 1, 0] with [1, n, 0] is empty; [m, 1] with [1, n] is not.
        if let (Ok(x), Ok(y)) = (Tensor::zeros(&[m, 1, 0]), Tensor::zeros(&[1, n, 0])) {
            let empty = ops::add(&x, &y);
            prop_assert_eq!(empty.is_ok(), element_count(&[m, n, 0]).is_some());
        }
        if let (Ok(x), Ok(r)) = (Tensor::zeros(&[0, m, n]), Tensor::zeros(&[0])) {
            prop_assert_eq!(ops::flatten(&x).is_ok(), element_count(&[m, n]).is_some());
            prop_assert!(ops::reshape(&r, &[m, n, 0]).is_ok() == element_count(&[m, n, 0]).is_some());
        }
    }
}
