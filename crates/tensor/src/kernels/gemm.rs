//! Single-precision matrix products on row-major slices, through the `gemm` crate (runtime
//! AVX2/AVX-512 dispatch, rayon parallelism).

use gemm::Parallelism;

/// A row-major matrix operand, possibly read transposed.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    /// The values, row-major as stored.
    pub data: &'a [f32],
    /// Rows as stored.
    pub rows: usize,
    /// Columns as stored.
    pub cols: usize,
    /// Read as the transpose of what is stored.
    pub transposed: bool,
}

impl MatRef<'_> {
    /// Rows and columns as read.
    fn logical(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (row stride, column stride) as read.
    fn strides(&self) -> (isize, isize) {
        let cols = self.cols.cast_signed();
        if self.transposed {
            (1, cols)
        } else {
            (cols, 1)
        }
    }
}

/// Products below this many multiply-adds run on one thread: forking costs more than it saves.
const PARALLEL_THRESHOLD: usize = 48 * 48 * 48;

/// `dst[m×n] = a[m×k] · b[k×n]`, or `dst += a · b` when `accumulate` is set.
///
/// ```
/// use lockstep_tensor::kernels::gemm::{MatRef, matmul};
///
/// let a = [1.0, 2.0, 3.0, 4.0]; // [[1, 2], [3, 4]]
/// let mut c = [0.0; 4];
/// let lhs = MatRef { data: &a, rows: 2, cols: 2, transposed: false };
/// let rhs = MatRef { data: &a, rows: 2, cols: 2, transposed: true };
/// matmul(&mut c, lhs, rhs, false); // a · aᵀ
/// assert_eq!(c, [5.0, 11.0, 11.0, 25.0]);
/// ```
///
/// # Panics
///
/// When the operands' inner dimensions differ or a slice is shorter than its dimensions say:
/// callers check shapes first, and these are the memory-safety conditions of the product.
pub fn matmul(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, accumulate: bool) {
    product(dst, a, b, accumulate, false);
}

/// As [`matmul`], on the calling thread only: for the many small products of a kernel that is
/// already parallel over its own pieces (where a nested split would only add forks), and so
/// the result cannot depend on the thread count.
///
/// # Panics
///
/// As [`matmul`].
pub(crate) fn matmul_on_this_thread(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
) {
    product(dst, a, b, accumulate, true);
}

fn product(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, accumulate: bool, one_thread: bool) {
    let (m, n) = check(a, b);
    assert!(dst.len() >= m * n, "matmul: destination too short");
    let k = a.logical().1;
    if m * n == 0 || k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let parallelism = if one_thread {
        Parallelism::None
    } else {
        threads_for(m, n, k)
    };
    // SAFETY: `dst` is a unique borrow of at least m·n elements (asserted above), so it aliases
    // neither operand and every element gemm writes is in bounds.
    #[allow(unsafe_code)]
    unsafe {
        product_into(dst.as_mut_ptr(), a, b, accumulate, parallelism);
    }
}

/// `a · b` as a new row-major buffer. The product writes every element before anything reads
/// it, so the buffer skips the zero-fill a `vec![0.0; m·n]` would cost (megabytes for a
/// convolution's gradient).
///
/// # Panics
///
/// As [`matmul`].
pub fn matmul_new(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f32> {
    let (m, n) = check(a, b);
    if m * n == 0 || a.logical().1 == 0 {
        return vec![0.0; m * n];
    }
    let mut out = Vec::with_capacity(m * n);
    // SAFETY: the buffer has room for m·n elements and aliases nothing. With `accumulate`
    // false, gemm never reads the destination (the product overwrites it: the tests fill it
    // with NaN first to prove it) and writes every one of its m·n elements, so all are
    // initialised before `set_len`.
    #[allow(unsafe_code)]
    unsafe {
        product_into(
            out.as_mut_ptr(),
            a,
            b,
            false,
            threads_for(m, n, a.logical().1),
        );
        out.set_len(m * n);
    }
    out
}

/// The product's `(m, n)`, after the checks that keep gemm's reads in bounds.
fn check(a: MatRef<'_>, b: MatRef<'_>) -> (usize, usize) {
    let (m, k) = a.logical();
    let (k2, n) = b.logical();
    assert_eq!(k, k2, "matmul: inner dimensions differ");
    assert!(
        a.data.len() >= a.rows * a.cols && b.data.len() >= b.rows * b.cols,
        "matmul: operand too short"
    );
    (m, n)
}

/// All of rayon's threads for a product large enough to repay the forks, else this one.
fn threads_for(m: usize, n: usize, k: usize) -> Parallelism {
    if m * n * k >= PARALLEL_THRESHOLD && rayon::current_num_threads() > 1 {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    }
}

/// `dst = a · b` (or `dst += a · b`) through gemm, `dst` row-major `m×n`.
///
/// # Safety
///
/// `dst` must be valid for writes of `m·n` elements (and reads, when `accumulate`), alias
/// neither operand, and the operands must have passed [`check`]; `m`, `n` and `k` must be
/// non-zero.
#[allow(unsafe_code)]
unsafe fn product_into(
    dst: *mut f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let (m, k) = a.logical();
    let n = b.logical().1;
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    // SAFETY: gemm reads a[i·a_rs + p·a_cs] for i < m, p < k and b[p·b_rs + j·b_cs] for
    // p < k, j < n, in bounds by `check`; it writes dst[i·n + j], in bounds by the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n.cast_signed(),
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..cols)
            .flat_map(|j| (0..rows).map(move |i| x[i * cols + j]))
            .collect()
    }

    #[test]
    fn every_transpose_combination_matches_the_naive_product() {
        let (m, k, n) = (37, 53, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let expected = naive(&a, &b, m, k, n);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let lhs = if ta {
                MatRef {
                    data: &at,
                    rows: k,
                    cols: m,
                    transposed: true,
                }
            } else {
                MatRef {
                    data: &a,
                    rows: m,
                    cols: k,
                    transposed: false,
                }
            };
            let rhs = if tb {
                MatRef {
                    data: &bt,
                    rows: n,
                    cols: k,
                    transposed: true,
                }
            } else {
                MatRef {
                    data: &b,
                    rows: k,
                    cols: n,
                    transposed: false,
                }
            };
            let mut c = vec![f32::NAN; m * n];
            matmul(&mut c, lhs, rhs, false);
            assert_eq!(c, expected, "transposed a: {ta}, b: {tb}");
        }
    }

    #[test]
    fn accumulate_adds_to_the_destination() {
        let a = [1.0, 2.0];
        let mut c = [10.0];
        matmul(
            &mut c,
            MatRef {
                data: &a,
                rows: 1,
                cols: 2,
                transposed: false,
            },
            MatRef {
                data: &a,
                rows: 2,
                cols: 1,
                transposed: false,
            },
            true,
        );
        assert_eq!(c, [15.0]);
    }

    #[test]
    fn a_new_product_equals_the_product_into_a_zeroed_buffer() {
        let (m, k, n) = (19, 7, 23);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 3) % 17) as f32 - 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 11) % 7) as f32 - 3.0).collect();
        let lhs = MatRef {
            data: &a,
            rows: m,
            cols: k,
            transposed: false,
        };
        let rhs = MatRef {
            data: &b,
            rows: k,
            cols: n,
            transposed: false,
        };
        assert_eq!(matmul_new(lhs, rhs), naive(&a, &b, m, k, n));
        let empty = MatRef {
            data: &[],
            rows: m,
            cols: 0,
            transposed: false,
        };
        let none = MatRef {
            data: &[],
            rows: 0,
            cols: n,
            transposed: false,
        };
        assert_eq!(matmul_new(empty, none), vec![0.0; m * n]);
    }
}
