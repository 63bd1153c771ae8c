//! Reordering a row-major array's axes: the copy behind `permute` and `transpose`.

use rayon::prelude::*;

use super::CHUNK;

/// The row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1_usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// `x` of `shape` with its axes reordered: output axis `i` is input axis `axes[i]`. `axes` is
/// a permutation of `0..shape.len()` (the operation checks it).
///
/// When the last axis stays last, whole rows are copied; otherwise value by value. Parallel
/// over fixed pieces of the output, each written by one task: the bits do not depend on the
/// thread count (a copy has no rounding anyway).
pub(crate) fn permute(x: &[f32], shape: &[usize], axes: &[usize]) -> Vec<f32> {
    let rank = shape.len();
    let total = x.len();
    if total == 0 || axes.iter().enumerate().all(|(i, &a)| i == a) {
        return x.to_vec();
    }
    let in_strides = strides(shape);
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let read_strides: Vec<usize> = axes.iter().map(|&a| in_strides[a]).collect();
    // A run: values contiguous in both the input and the output.
    let keeps_last = axes[rank - 1] == rank - 1;
    let (run, outer_rank) = if keeps_last {
        (shape[rank - 1], rank - 1)
    } else {
        (1, rank)
    };
    let runs_per_task = (CHUNK / run).max(1);
    let mut out = vec![0.0_f32; total];
    out.par_chunks_mut(runs_per_task * run)
        .enumerate()
        .for_each(|(task, piece)| {
            let dims = &out_shape[..outer_rank];
            let steps = &read_strides[..outer_rank];
            // The first run's position in the output's outer axes, and its input offset.
            let mut index = vec![0_usize; outer_rank];
            let mut rest = task * runs_per_task;
            for d in (0..outer_rank).rev() {
                index[d] = rest % dims[d];
                rest /= dims[d];
            }
            let mut offset: usize = index.iter().zip(steps).map(|(i, s)| i * s).sum();
            for dst in piece.chunks_exact_mut(run) {
                dst.copy_from_slice(&x[offset..offset + run]);
                for d in (0..outer_rank).rev() {
                    index[d] += 1;
                    offset += steps[d];
                    if index[d] < dims[d] {
                        break;
                    }
                    offset -= steps[d] * index[d];
                    index[d] = 0;
                }
            }
        });
    out
}

/// The permutation that undoes `axes`.
pub(crate) fn inverse(axes: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; axes.len()];
    for (i, &a) in axes.iter().enumerate() {
        inverse[a] = i;
    }
    inverse
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation by definition: every output index's value read at its input index.
    fn naive(x: &[f32], shape: &[usize], axes: &[usize]) -> Vec<f32> {
        let in_strides = strides(shape);
        let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
        let out_strides = strides(&out_shape);
        (0..x.len())
            .map(|flat| {
                let offset: usize = (0..axes.len())
                    .map(|i| (flat / out_strides[i]) % out_shape[i] * in_strides[axes[i]])
                    .sum();
                x[offset]
            })
            .collect()
    }

    #[test]
    fn every_permutation_of_three_axes_matches_the_definition() {
        let shape = [3, 4, 5];
        let x: Vec<f32> = (0..60).map(|v| v as f32).collect();
        for axes in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            assert_eq!(
                permute(&x, &shape, &axes),
                naive(&x, &shape, &axes),
                "{axes:?}"
            );
        }
    }

    #[test]
    fn pieces_larger_than_one_task_are_stitched_in_order() {
        // More than one CHUNK of values, with runs that do not divide it.
        let shape = [7, 3, 1031, 3];
        let x: Vec<f32> = (0..7 * 3 * 1031 * 3).map(|v| v as f32).collect();
        for axes in [[2, 0, 1, 3], [3, 2, 1, 0]] {
            assert_eq!(
                permute(&x, &shape, &axes),
                naive(&x, &shape, &axes),
                "{axes:?}"
            );
        }
    }

    #[test]
    fn the_inverse_permutation_restores_the_input() {
        let shape = [2, 3, 4, 5];
        let axes = [3, 1, 0, 2];
        let x: Vec<f32> = (0..120).map(|v| v as f32).collect();
        let moved = permute(&x, &shape, &axes);
        let moved_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
        assert_eq!(permute(&moved, &moved_shape, &inverse(&axes)), x);
    }
}
