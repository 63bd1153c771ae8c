//! Reductions whose summation order is fixed by the data's size alone.

use rayon::prelude::*;

use super::CHUNK;

/// Rows summed by one task before partial sums are combined.
const ROW_BLOCK: usize = 256;

// The GPU's column sums take the same blocks, so a bias gradient has the same bits on both.
const _: () = assert!(ROW_BLOCK == lockstep_cuda::ops::COLUMN_SUM_BLOCK_ROWS);

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

/// Sums over the middle axis of `x[outer×mid×inner]` into `out[outer×inner]`. A task takes as
/// many outer slices as make up about [`CHUNK`] inputs: one task per slice would cost more
/// than the sums when `mid × inner` is small (a last-axis sum).
pub(crate) fn sum_middle(x: &[f32], outer: usize, mid: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0.0_f32; outer * inner];
    if inner == 0 || mid == 0 {
        return out;
    }
    let slices_per_task = (CHUNK / (mid * inner).max(1)).max(1);
    out.par_chunks_mut(slices_per_task * inner)
        .zip(x.par_chunks(slices_per_task * mid * inner))
        .for_each(|(accs, blocks)| {
            for (acc, block) in accs.chunks_exact_mut(inner).zip(blocks.chunks(mid * inner)) {
                for row in block.chunks_exact(inner) {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v;
                    }
                }
            }
        });
    out
}

/// `Σ values` elementwise, each element summed over `values` in the order given (a fixed order
/// keeps sums bit-identical from run to run and on any number of threads), in parallel over
/// pieces of the output; zeros of `len` when there are none.
pub(crate) fn sum_in_order(values: &[&[f32]], len: usize) -> Vec<f32> {
    let mut total = vec![0.0; len];
    total
        .par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(piece, total)| {
            let range = piece * CHUNK..piece * CHUNK + total.len();
            for (i, value) in values.iter().enumerate() {
                let value = &value[range.clone()];
                if i == 0 {
                    total.copy_from_slice(value);
                } else {
                    for (t, v) in total.iter_mut().zip(value) {
                        *t += v;
                    }
                }
            }
        });
    total
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
        assert_eq!(sum_middle(&[], 2, 0, 3), [0.0; 6]);
    }

    #[test]
    fn last_axis_sums_cover_every_slice_across_task_boundaries() {
        let (outer, mid) = (20_000, 3);
        let x: Vec<f32> = (0..outer * mid).map(|i| (i % 17) as f32).collect();
        let sums = sum_middle(&x, outer, mid, 1);
        let naive: Vec<f32> = x.chunks(mid).map(|s| s.iter().sum()).collect();
        assert_eq!(sums, naive);
    }
}
