//! Reductions whose summation order is fixed by the data's size alone.

use rayon::prelude::*;

/// Rows summed by one task before partial sums are combined.
const ROW_BLOCK: usize = 256;

/// Column sums of `x[rows×cols]`: `out[j] = Σ_i x[i][j]`.
///
/// Rows are summed in blocks of [`ROW_BLOCK`] in parallel and the block sums added in block
/// order, so the result does not depend on the number of threads.
pub(crate) fn sum_rows(x: &[f32], cols: usize) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    let partials: Vec<Vec<f32>> = x
        .par_chunks(ROW_BLOCK * cols)
        .map(|block| {
            let mut acc = vec![0.0_f32; cols];
            for row in block.chunks_exact(cols) {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += v;
                }
            }
            acc
        })
        .collect();
    let mut out = vec![0.0_f32; cols];
    for partial in partials {
        for (o, p) in out.iter_mut().zip(partial) {
            *o += p;
        }
    }
    out
}

/// Sums over the middle axis of `x[outer×mid×inner]` into `out[outer×inner]`.
pub(crate) fn sum_middle(x: &[f32], outer: usize, mid: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0.0_f32; outer * inner];
    if inner == 0 {
        return out;
    }
    out.par_chunks_mut(inner).enumerate().for_each(|(o, acc)| {
        let block = &x[o * mid * inner..(o + 1) * mid * inner];
        for row in block.chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_sums_do_not_depend_on_the_thread_count() {
        let x: Vec<f32> = (0..10_000 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| sum_rows(&x, 3));
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
            .install(|| sum_rows(&x, 3));
        assert_eq!(one, two);
        let naive: f64 = (0..10_000).map(|i| f64::from(x[i * 3])).sum();
        assert!((f64::from(one[0]) - naive).abs() < 1e-3);
    }

    #[test]
    fn middle_sums_reduce_the_middle_axis() {
        let x: Vec<f32> = (0..24).map(|i| i as f32).collect(); // [2, 3, 4]
        assert_eq!(
            sum_middle(&x, 2, 3, 4),
            [12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0]
        );
    }
}
