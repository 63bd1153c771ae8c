//! Single-precision matrix products on row-major slices, through gemm's single-precision
//! kernels (`gemm-f32`: runtime AVX2/AVX-512 dispatch, rayon parallelism).

use std::ops::Range;

use gemm_common::Parallelism;

use crate::error::TensorError;

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
/// matmul(&mut c, lhs, rhs, false)?; // a · aᵀ
/// assert_eq!(c, [5.0, 11.0, 11.0, 25.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// When the operands' inner dimensions differ, a slice is shorter than its dimensions say
/// (the destination included), or a dimension product does not fit in `usize`.
pub fn matmul(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
) -> Result<(), TensorError> {
    let sizes = Sizes::check(a, b)?;
    product(dst, a, b, sizes, accumulate, None)
}

/// As [`matmul`], on the calling thread only: for the many small products of a kernel that is
/// already parallel over its own pieces (where a nested split would only add forks), and so
/// the result cannot depend on the thread count.
///
/// # Errors
///
/// As [`matmul`].
pub(crate) fn matmul_on_this_thread(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
) -> Result<(), TensorError> {
    let sizes = Sizes::check(a, b)?;
    product(dst, a, b, sizes, accumulate, Some(Parallelism::None))
}

fn product(
    dst: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    sizes: Sizes,
    accumulate: bool,
    parallelism: Option<Parallelism>,
) -> Result<(), TensorError> {
    if dst.len() < sizes.dst {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "the destination holds {} values, the {}×{} product needs {}",
                dst.len(),
                sizes.m,
                sizes.n,
                sizes.dst
            ),
        ));
    }
    if sizes.is_empty() {
        if !accumulate {
            dst[..sizes.dst].fill(0.0);
        }
        return Ok(());
    }
    let parallelism = parallelism.unwrap_or_else(|| sizes.threads());
    // SAFETY: `Sizes::check` passed for these operands and `dst` holds at least `sizes.dst`
    // = m·n values (checked above); `dst` is a unique borrow, so it aliases neither operand;
    // the product is not empty (m, n and k are all non-zero).
    #[allow(unsafe_code)]
    unsafe {
        product_into(dst.as_mut_ptr(), a, b, sizes, accumulate, parallelism);
    }
    Ok(())
}

/// `dst = a[:, cols] · b`, or `dst += a[:, cols] · b` when `accumulate` is set: the product
/// over a block of `a`'s stored columns (read transposed when `a.transposed`, the block then
/// being rows as read). A dense layer's product over one block of its kernel's rows reads its
/// input so, without copying the block out.
///
/// ```
/// use lockstep_tensor::kernels::gemm::{MatRef, matmul_block};
///
/// let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [[1, 2, 3], [4, 5, 6]]
/// let b = [1.0, 10.0]; // [[1], [10]]
/// let mut c = [0.0; 2];
/// let lhs = MatRef { data: &a, rows: 2, cols: 3, transposed: false };
/// let rhs = MatRef { data: &b, rows: 2, cols: 1, transposed: false };
/// matmul_block(&mut c, lhs, 1..3, rhs, false)?; // [[2, 3], [5, 6]] · b
/// assert_eq!(c, [32.0, 65.0]);
/// # Ok::<(), lockstep_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// As [`matmul`], and when `cols` is not within `a`'s stored columns.
pub fn matmul_block(
    dst: &mut [f32],
    a: MatRef<'_>,
    cols: Range<usize>,
    b: MatRef<'_>,
    accumulate: bool,
) -> Result<(), TensorError> {
    if cols.start > cols.end || cols.end > a.cols {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "columns {}..{} of a matrix of {} columns",
                cols.start, cols.end, a.cols
            ),
        ));
    }
    // `a` as stored must be covered by its slice, as `Sizes::check` requires of an operand.
    if a.rows
        .checked_mul(a.cols)
        .is_none_or(|len| len > a.data.len())
    {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "the left operand holds {} values, its dimensions {}×{} need more",
                a.data.len(),
                a.rows,
                a.cols
            ),
        ));
    }
    // The block's dimensions as read; its values start `cols.start` into the stored rows,
    // with the stored strides.
    let sizes = Sizes::check(
        MatRef {
            cols: cols.len(),
            ..a
        },
        b,
    )?;
    let shifted = MatRef {
        data: a.data.get(cols.start..).unwrap_or(&[]),
        ..a
    };
    product(dst, shifted, b, sizes, accumulate, None)
}

/// `a · b` as a new row-major buffer. The product writes every element before anything reads
/// it, so the buffer skips the zero-fill a `vec![0.0; m·n]` would cost (megabytes for a
/// convolution's gradient).
///
/// # Errors
///
/// As [`matmul`], and when the product does not fit in memory.
pub fn matmul_new(a: MatRef<'_>, b: MatRef<'_>) -> Result<Vec<f32>, TensorError> {
    let sizes = Sizes::check(a, b)?;
    let mut out = Vec::new();
    out.try_reserve_exact(sizes.dst).map_err(|e| {
        TensorError::invalid(
            "matmul",
            format!(
                "the {}×{} product does not fit in memory: {e}",
                sizes.m, sizes.n
            ),
        )
    })?;
    if sizes.is_empty() {
        out.resize(sizes.dst, 0.0);
        return Ok(out);
    }
    // SAFETY: `Sizes::check` passed for these operands and the product is not empty; the
    // buffer has room for `sizes.dst` = m·n values and aliases nothing. With `accumulate`
    // false, gemm never reads the destination (the product overwrites it: the tests fill it
    // with NaN first to prove it) and writes every one of its m·n values, so all are
    // initialised before `set_len`.
    #[allow(unsafe_code)]
    unsafe {
        product_into(out.as_mut_ptr(), a, b, sizes, false, sizes.threads());
        out.set_len(sizes.dst);
    }
    Ok(out)
}

/// A batch of matrices, one after another in `data` (row-major, each `rows × cols` as stored),
/// read through `starts`: the offset of the matrix each product of the batch takes (a matrix
/// may serve several products, as broadcasting repeats it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) starts: &'a [usize],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) transposed: bool,
}

impl<'a> Batch<'a> {
    fn at(&self, start: usize) -> Result<MatRef<'a>, TensorError> {
        let len = self.rows * self.cols;
        let data = self.data.get(start..start + len).ok_or_else(|| {
            TensorError::invalid(
                "matmul",
                format!(
                    "a batch's matrix at {start} ends past its {} values",
                    self.data.len()
                ),
            )
        })?;
        Ok(MatRef {
            data,
            rows: self.rows,
            cols: self.cols,
            transposed: self.transposed,
        })
    }
}

/// `dst[i] = a[i] · b[i]` for every product `i` of a batch (`a.starts.len()` of them, as many
/// as `b.starts`), `dst` holding them one after another. The products run in parallel, each on
/// one thread: a product's bits do not depend on the batch it came in or on the thread count.
///
/// # Errors
///
/// When the batches' lengths differ, a matrix lies outside its data, the inner dimensions
/// differ, or `dst` is too short.
pub(crate) fn batched_matmul(
    dst: &mut [f32],
    a: Batch<'_>,
    b: Batch<'_>,
) -> Result<(), TensorError> {
    use rayon::prelude::*;
    if a.starts.len() != b.starts.len() {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "{} left and {} right matrices",
                a.starts.len(),
                b.starts.len()
            ),
        ));
    }
    let m = if a.transposed { a.cols } else { a.rows };
    let n = if b.transposed { b.rows } else { b.cols };
    let each = m.checked_mul(n).ok_or_else(|| {
        TensorError::invalid("matmul", format!("the {m}×{n} product's size overflows"))
    })?;
    let needed = each.checked_mul(a.starts.len());
    if needed.is_none_or(|needed| dst.len() < needed) {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "the destination holds {} values, {} products of {m}×{n} need more",
                dst.len(),
                a.starts.len()
            ),
        ));
    }
    if each == 0 {
        return Ok(());
    }
    dst.par_chunks_mut(each)
        .zip(a.starts.par_iter().zip(b.starts))
        .try_for_each(|(dst, (&sa, &sb))| matmul_on_this_thread(dst, a.at(sa)?, b.at(sb)?, false))
}

/// A product's dimensions, once the operands are known to cover them.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    m: usize,
    n: usize,
    k: usize,
    /// `m·n`, the destination's length.
    dst: usize,
}

impl Sizes {
    /// The checks that keep gemm's reads in bounds: the inner dimensions agree, every
    /// dimension product fits in `usize`, and each slice holds at least `rows·cols` values.
    fn check(a: MatRef<'_>, b: MatRef<'_>) -> Result<Self, TensorError> {
        let (m, k) = a.logical();
        let (k2, n) = b.logical();
        let shapes = |why: String| {
            TensorError::mismatch("matmul", &[a.rows, a.cols], &[b.rows, b.cols], why)
        };
        if k != k2 {
            return Err(shapes(format!("inner dimensions {k} and {k2} differ")));
        }
        for (name, operand) in [("left", a), ("right", b)] {
            match operand.rows.checked_mul(operand.cols) {
                Some(len) if len <= operand.data.len() => {}
                Some(len) => {
                    return Err(shapes(format!(
                        "the {name} operand holds {} values, its dimensions need {len}",
                        operand.data.len()
                    )));
                }
                None => return Err(shapes(format!("the {name} operand's size overflows"))),
            }
        }
        let dst = m
            .checked_mul(n)
            .ok_or_else(|| shapes(format!("the {m}×{n} product's size overflows")))?;
        Ok(Self { m, n, k, dst })
    }

    fn is_empty(self) -> bool {
        self.dst == 0 || self.k == 0
    }

    /// All of rayon's threads for a product large enough to repay the forks, else this one.
    fn threads(self) -> Parallelism {
        let work = self.m.saturating_mul(self.n).saturating_mul(self.k);
        if work >= PARALLEL_THRESHOLD && rayon::current_num_threads() > 1 {
            Parallelism::Rayon(rayon::current_num_threads())
        } else {
            Parallelism::None
        }
    }
}

/// `dst = a · b` (or `dst += a · b`) through gemm, `dst` row-major `m×n`.
///
/// # Safety
///
/// `sizes` must come from [`Sizes::check`] on these operands and describe a product that is
/// not empty; `dst` must be valid for writes of `sizes.dst` values (and reads, when
/// `accumulate`) and alias neither operand.
#[allow(unsafe_code)]
unsafe fn product_into(
    dst: *mut f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    sizes: Sizes,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let Sizes { m, n, k, .. } = sizes;
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    // gemm's microkernels prefer a column-major destination, so a row-major one with more
    // than one column is computed as its transpose, `dstᵀ = bᵀ · aᵀ`: the operands swap and
    // every pair of strides turns round (what the `gemm` crate's front end does before
    // calling these same kernels). All strides here are positive.
    let (rows, cols, (dst_cs, dst_rs), lhs, (lhs_cs, lhs_rs), rhs, (rhs_cs, rhs_rs)) = if n > 1 {
        (n, m, (n.cast_signed(), 1), b, (b_rs, b_cs), a, (a_rs, a_cs))
    } else {
        (m, n, (1, n.cast_signed()), a, (a_cs, a_rs), b, (b_cs, b_rs))
    };
    let product = gemm_f32::gemm::f32::get_gemm_fn();
    // SAFETY: m, n and k are non-zero, so each operand's rows and cols are too, and their
    // checked product is at most the slice's length: every dimension, and so every stride,
    // is below `isize::MAX` and the `cast_signed`s in `strides` keep their values. gemm reads
    // a[i·a_rs + p·a_cs] for i < m, p < k, whose largest offset is rows·cols − 1 of `a` as
    // stored (likewise b[p·b_rs + j·b_cs] for p < k, j < n), in bounds by `Sizes::check`
    // (for a block of columns from `matmul_block`, `a` starts at the block's first column c
    // and k or m is the block's width w ≤ cols − c: the largest offset is then
    // (rows − 1)·cols + w − 1 < rows·cols − c, the shifted slice's length); it
    // writes (and, accumulating, reads) dst[i·n + j] < m·n = `sizes.dst`, in bounds by the
    // caller.
    unsafe {
        product(
            rows,
            cols,
            k,
            dst,
            dst_cs,
            dst_rs,
            accumulate,
            lhs.data.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.data.as_ptr(),
            rhs_cs,
            rhs_rs,
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
            matmul(&mut c, lhs, rhs, false).unwrap();
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
        )
        .unwrap();
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
        assert_eq!(matmul_new(lhs, rhs).unwrap(), naive(&a, &b, m, k, n));
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
        assert_eq!(matmul_new(empty, none).unwrap(), vec![0.0; m * n]);
    }
}
