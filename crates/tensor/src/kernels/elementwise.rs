//! Elementwise kernels, parallel over fixed chunks.

use rayon::prelude::*;

use super::CHUNK;

/// `out[i] = f(x[i])`. Collected straight into the output: no zero-fill first.
pub(crate) fn map(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    x.par_iter().with_min_len(CHUNK).map(|&x| f(x)).collect()
}

/// `out[i] = f(a[i], b[i])` for equal-length slices.
pub(crate) fn zip(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    a.par_iter()
        .zip(b)
        .with_min_len(CHUNK)
        .map(|(&a, &b)| f(a, b))
        .collect()
}

/// Adds `bias[c]` to every row of `x[rows×c]`, then applies `f`.
pub(crate) fn add_rows(x: &[f32], bias: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    let c = bias.len();
    let mut out = vec![0.0; x.len()];
    let rows_per_task = (CHUNK / c.max(1)).max(1);
    out.par_chunks_mut(rows_per_task * c)
        .zip(x.par_chunks(rows_per_task * c))
        .for_each(|(o, x)| {
            for (o_row, x_row) in o.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
                for ((o, &x), &b) in o_row.iter_mut().zip(x_row).zip(bias) {
                    *o = f(x + b);
                }
            }
        });
    out
}

/// `rows` copies of `row` back to back (zeros without a row): the starting value of an output
/// that a GEMM accumulates onto. One pass of copies, with no zero-fill before it.
pub(crate) fn repeat_rows(row: Option<&[f32]>, rows: usize, cols: usize) -> Vec<f32> {
    match row {
        Some(row) => row.repeat(rows),
        None => vec![0.0_f32; rows * cols],
    }
}

/// `max(x, 0)` in place.
pub(crate) fn relu_in_place(x: &mut [f32]) {
    x.par_chunks_mut(CHUNK).for_each(|chunk| {
        for v in chunk {
            *v = v.max(0.0);
        }
    });
}
