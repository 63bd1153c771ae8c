//! The sums over a convolution's input patches (its im2col rows) from which the batch
//! statistics of its output follow without computing that output: for output channel `c` with
//! kernel column `w`, `Σx = Σpatch · w` and `Σx² = wᵀ · (Σ patch ⊗ patch) · w`, and the kernel's
//! gradient through batch normalization likewise needs `Σ patch ⊗ x`, which is
//! `(Σ patch ⊗ patch) · w`. For a first layer (a few values per patch over a large output) the
//! patch sums cost a small part of one pass over the output.
//!
//! Each image's sums run in `f32` vectors, the images' sums are added in `f64` in order: the
//! same bits on any thread count and on every CPU.

use rayon::prelude::*;

use super::geometry::Geometry;
use super::lanes::{LANES, Lanes};

/// Over every output position of a batch: `Σpatch` and `Σ patch ⊗ patch`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PatchMoments {
    /// `Σpatch`, `[patch]`.
    pub(crate) sums: Vec<f64>,
    /// `Σ patch ⊗ patch`, `[patch][patch]`, symmetric.
    pub(crate) gram: Vec<f64>,
    /// The output positions summed over: batch × output pixels.
    pub(crate) count: usize,
}

/// Pairs of patch values whose products are summed together: eight independent chains.
const PAIRS: usize = 8;

/// The patch sums of `input` under `g`'s convolution, zeros standing for the padding.
pub(crate) fn patch_moments(input: &[f32], g: &Geometry) -> PatchMoments {
    let p = g.patch();
    let image_in = g.height * g.width * g.channels;
    let positions = g.out_pixels().next_multiple_of(LANES);
    let pairs: Vec<(usize, usize)> = (0..p).flat_map(|t| (t..p).map(move |s| (t, s))).collect();
    let per_image: Vec<Vec<f64>> = (0..g.batch)
        .into_par_iter()
        .map_init(
            // Positions past the output stay zero.
            || vec![0.0_f32; p * positions],
            |columns, b| {
                let image = &input[b * image_in..(b + 1) * image_in];
                gather_columns(image, g, positions, columns);
                image_moments(columns, p, &pairs)
            },
        )
        .collect();
    let mut total = vec![0.0_f64; p + p * p];
    for image in per_image {
        for (t, v) in total.iter_mut().zip(image) {
            *t += v;
        }
    }
    let gram = total.split_off(p);
    PatchMoments {
        sums: total,
        gram,
        count: g.batch * g.out_pixels(),
    }
}

/// One image's patches as columns: `columns[t · positions + position]` is patch value `t`
/// (kernel row, kernel column, channel) at output position `position`, zero in the padding.
fn gather_columns(image: &[f32], g: &Geometry, positions: usize, columns: &mut [f32]) {
    let line = g.width * g.channels;
    let mut t = 0;
    for ky in 0..g.kernel_h {
        for kx in 0..g.kernel_w {
            // The output columns whose tap `kx` reads inside the image.
            let first = g.pad_left.saturating_sub(kx).div_ceil(g.stride_w);
            let end = (g.width + g.pad_left)
                .checked_sub(kx + 1)
                .map_or(0, |last| (last / g.stride_w + 1).min(g.out_w));
            for channel in 0..g.channels {
                let row = &mut columns[t * positions..(t + 1) * positions];
                for (oy, out) in row.chunks_exact_mut(g.out_w).take(g.out_h).enumerate() {
                    let y = (oy * g.stride_h + ky)
                        .checked_sub(g.pad_top)
                        .filter(|&y| y < g.height);
                    let Some(y) = y.filter(|_| first < end) else {
                        out.fill(0.0);
                        continue;
                    };
                    out[..first].fill(0.0);
                    out[end..].fill(0.0);
                    let base = y * line + channel;
                    for (ox, value) in out.iter_mut().enumerate().take(end).skip(first) {
                        let x = ox * g.stride_w + kx - g.pad_left;
                        *value = image[base + x * g.channels];
                    }
                }
                t += 1;
            }
        }
    }
}

/// `Σpatch` then `Σ patch ⊗ patch` (`[p][p]`, from the upper triangle's `pairs`) of one
/// image's `columns` (whole vectors of positions). Each image's sums run in `f32` vectors of
/// fused multiply-adds, about as many roundings per sum as computing the output (a few
/// hundred positions) and squaring it; the images' sums are added in `f64`.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn image_moments(columns: &[f32], p: usize, pairs: &[(usize, usize)]) -> Vec<f64> {
    let positions = columns.len() / p.max(1);
    let column = |t: usize| {
        columns[t * positions..(t + 1) * positions]
            .as_chunks::<LANES>()
            .0
    };
    let total = |lanes: Lanes| lanes.to_array().iter().map(|&v| f64::from(v)).sum::<f64>();
    let mut out = vec![0.0_f64; p + p * p];
    let (sums, gram) = out.split_at_mut(p);
    for (t, sum) in sums.iter_mut().enumerate() {
        *sum = total(
            column(t)
                .iter()
                .fold(Lanes::zero(), |acc, &v| acc + Lanes::from(v)),
        );
    }
    for chunk in pairs.chunks(PAIRS) {
        // A short last chunk repeats its first pair; those sums are not kept.
        let pair = |j: usize| chunk.get(j).unwrap_or(&chunk[0]);
        let operands: [_; PAIRS] = std::array::from_fn(|j| (column(pair(j).0), column(pair(j).1)));
        let mut acc = [Lanes::zero(); PAIRS];
        for i in 0..positions / LANES {
            for (acc, (a, b)) in acc.iter_mut().zip(&operands) {
                *acc = Lanes::from(a[i]).mul_add(Lanes::from(b[i]), *acc);
            }
        }
        for (&(t, s), &acc) in chunk.iter().zip(&acc) {
            let v = total(acc);
            gram[t * p + s] = v;
            gram[s * p + t] = v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::im2col;

    #[test]
    fn patch_sums_are_those_of_the_im2col_rows() {
        // 3 images of 5×4×2 under a 3×3 kernel, stride 2 and a padding of 1: some taps read the
        // padding.
        let g = Geometry {
            batch: 3,
            height: 5,
            width: 4,
            channels: 2,
            kernel_h: 3,
            kernel_w: 3,
            stride_h: 2,
            stride_w: 2,
            pad_top: 1,
            pad_left: 1,
            out_h: 3,
            out_w: 2,
        };
        let input: Vec<f32> = (0..3 * 5 * 4 * 2)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let moments = patch_moments(&input, &g);
        let p = g.patch();
        let rows = im2col(&input, &g);
        assert_eq!(moments.count, rows.len() / p);
        for t in 0..p {
            let column = rows.iter().skip(t).step_by(p).map(|&v| f64::from(v));
            assert!((moments.sums[t] - column.sum::<f64>()).abs() < 1e-4);
            for s in 0..p {
                let products = rows
                    .chunks_exact(p)
                    .map(|row| f64::from(row[t]) * f64::from(row[s]));
                assert!((moments.gram[t * p + s] - products.sum::<f64>()).abs() < 1e-4);
            }
        }
    }
}
