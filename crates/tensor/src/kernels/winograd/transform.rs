//! The transforms of F(m×m, 3×3): the one-dimensional input and output transforms with their
//! adjoints, written out on channel vectors, and the filter transform `G g Gᵀ` with its adjoint
//! on whole kernels.

use rayon::prelude::*;

use super::Tiling;
use crate::kernels::lanes::{Lanes, add, add_scaled, scale, sub};

/// `values(j)` for `j < N`, built by a plain loop that the compiler unrolls.
#[inline(always)]
pub(super) fn gather_lanes<const N: usize>(mut values: impl FnMut(usize) -> Lanes) -> [Lanes; N] {
    let mut out = [Lanes::zero(); N];
    for (j, lanes) in out.iter_mut().enumerate() {
        *lanes = values(j);
    }
    out
}

/// Row `i` of a tile held as columns: the second pass of a two-dimensional transform.
#[inline(always)]
pub(super) fn row_of<const R: usize, const C: usize>(
    columns: &[[Lanes; R]; C],
    i: usize,
) -> [Lanes; C] {
    gather_lanes(|l| columns[l][i])
}

/// The one-dimensional transforms of F(m×m, 3×3) with input tiles of side `s = m + 2`, written
/// out with their common terms shared: the two-dimensional transforms apply them along columns,
/// then along rows, on channel vectors held in registers.
pub(super) trait Transform<const M: usize, const S: usize> {
    /// `Bᵀ d`.
    fn input(d: [Lanes; S]) -> [Lanes; S];
    /// `B v`: the adjoint of [`Transform::input`], for the input's gradient.
    fn input_adjoint(v: [Lanes; S]) -> [Lanes; S];
    /// `Aᵀ m`.
    fn output(m: [Lanes; S]) -> [Lanes; M];
    /// `A y`: the adjoint of [`Transform::output`], for the kernel's gradient.
    fn output_adjoint(y: [Lanes; M]) -> [Lanes; S];
}

/// F(2×2, 3×3), interpolation points 0, 1, −1.
pub(super) struct TransformF2;

impl Transform<2, 4> for TransformF2 {
    #[inline(always)]
    fn input([d0, d1, d2, d3]: [Lanes; 4]) -> [Lanes; 4] {
        [sub(d0, d2), add(d1, d2), sub(d2, d1), sub(d1, d3)]
    }

    #[inline(always)]
    fn input_adjoint([v0, v1, v2, v3]: [Lanes; 4]) -> [Lanes; 4] {
        [
            v0,
            add(sub(v1, v2), v3),
            sub(add(v1, v2), v0),
            sub(Lanes::zero(), v3),
        ]
    }

    #[inline(always)]
    fn output([m0, m1, m2, m3]: [Lanes; 4]) -> [Lanes; 2] {
        [add(add(m0, m1), m2), sub(sub(m1, m2), m3)]
    }

    #[inline(always)]
    fn output_adjoint([y0, y1]: [Lanes; 2]) -> [Lanes; 4] {
        [y0, add(y0, y1), sub(y0, y1), sub(Lanes::zero(), y1)]
    }
}

/// F(4×4, 3×3), interpolation points 0, ±1, ±2.
pub(super) struct TransformF4;

impl Transform<4, 6> for TransformF4 {
    #[inline(always)]
    fn input([d0, d1, d2, d3, d4, d5]: [Lanes; 6]) -> [Lanes; 6] {
        let (sum12, sum34) = (add(d1, d2), add(d3, d4));
        let (diff12, diff43) = (sub(d1, d2), sub(d4, d3));
        let (diff42, diff31) = (sub(d4, d2), sub(d3, d1));
        [
            add_scaled(add_scaled(d4, 4.0, d0), -5.0, d2),
            add_scaled(sum34, -4.0, sum12),
            add_scaled(diff43, 4.0, diff12),
            add_scaled(diff42, 2.0, diff31),
            add_scaled(diff42, -2.0, diff31),
            add_scaled(add_scaled(d5, 4.0, d1), -5.0, d3),
        ]
    }

    #[inline(always)]
    fn input_adjoint([v0, v1, v2, v3, v4, v5]: [Lanes; 6]) -> [Lanes; 6] {
        let (sum12, diff12) = (add(v1, v2), sub(v1, v2));
        let (sum34, diff34) = (add(v3, v4), sub(v3, v4));
        [
            scale(4.0, v0),
            add_scaled(add_scaled(scale(4.0, v5), -4.0, diff12), -2.0, diff34),
            sub(add_scaled(scale(-5.0, v0), -4.0, sum12), sum34),
            add_scaled(add_scaled(diff12, 2.0, diff34), -5.0, v5),
            add(add(v0, sum12), sum34),
            v5,
        ]
    }

    #[inline(always)]
    fn output([m0, m1, m2, m3, m4, m5]: [Lanes; 6]) -> [Lanes; 4] {
        let (sum12, diff12) = (add(m1, m2), sub(m1, m2));
        let (sum34, diff34) = (add(m3, m4), sub(m3, m4));
        [
            add(add(m0, sum12), sum34),
            add_scaled(diff12, 2.0, diff34),
            add_scaled(sum12, 4.0, sum34),
            add(add_scaled(diff12, 8.0, diff34), m5),
        ]
    }

    #[inline(always)]
    fn output_adjoint([y0, y1, y2, y3]: [Lanes; 4]) -> [Lanes; 6] {
        let (even, odd) = (add(y0, y2), add(y1, y3));
        let even4 = add_scaled(y0, 4.0, y2);
        let odd8 = add_scaled(scale(2.0, y1), 8.0, y3);
        [
            y0,
            add(even, odd),
            sub(even, odd),
            add(even4, odd8),
            sub(even4, odd8),
            y3,
        ]
    }
}

/// A small row-major matrix of transform coefficients.
#[derive(Debug)]
pub(super) struct Coefficients {
    pub(super) values: &'static [f32],
    pub(super) cols: usize,
}

impl Coefficients {
    fn row(&self, i: usize) -> impl Iterator<Item = f32> + '_ {
        self.values[i * self.cols..(i + 1) * self.cols]
            .iter()
            .copied()
    }

    fn column(&self, j: usize) -> impl Iterator<Item = f32> + '_ {
        self.values[j..].iter().step_by(self.cols).copied()
    }
}

/// `G` of F(2×2, 3×3): filter to transformed filter.
#[rustfmt::skip]
pub(super) const FILTER_F2: Coefficients = Coefficients {
    values: &[
        1.0,  0.0, 0.0,
        0.5,  0.5, 0.5,
        0.5, -0.5, 0.5,
        0.0,  0.0, 1.0,
    ],
    cols: 3,
};

/// `G` of F(4×4, 3×3).
#[rustfmt::skip]
pub(super) const FILTER_F4: Coefficients = Coefficients {
    values: &[
        1.0 / 4.0,   0.0,         0.0,
        -1.0 / 6.0,  -1.0 / 6.0,  -1.0 / 6.0,
        -1.0 / 6.0,  1.0 / 6.0,   -1.0 / 6.0,
        1.0 / 24.0,  1.0 / 12.0,  1.0 / 6.0,
        1.0 / 24.0,  -1.0 / 12.0, 1.0 / 6.0,
        0.0,         0.0,         1.0,
    ],
    cols: 3,
};

/// `out = Σ_j coefficient_j · src[j·stride..][..out.len()]`, skipping zero coefficients: the
/// filter transforms, which run once per call on whole `[c × f]` slabs.
pub(super) fn mix(
    out: &mut [f32],
    coefficients: impl Iterator<Item = f32>,
    src: &[f32],
    stride: usize,
) {
    let len = out.len();
    let mut written = false;
    for (j, c) in coefficients.enumerate() {
        if c == 0.0 {
            continue;
        }
        let src = &src[j * stride..j * stride + len];
        if written {
            for (o, &v) in out.iter_mut().zip(src) {
                *o += c * v;
            }
        } else {
            for (o, &v) in out.iter_mut().zip(src) {
                *o = c * v;
            }
            written = true;
        }
    }
    if !written {
        out.fill(0.0);
    }
}

/// `U = G g Gᵀ` for a `[3, 3, c, f]` kernel: `[points][c][f]`.
pub(super) fn transform_kernel(t: Tiling, kernel: &[f32], c: usize, f: usize) -> Vec<f32> {
    let (side, slab, filter) = (t.side(), c * f, t.filter());
    let mut half = vec![0.0; side * 3 * slab];
    half.par_chunks_mut(slab).enumerate().for_each(|(at, out)| {
        let (xi, kx) = (at / 3, at % 3);
        mix(out, filter.row(xi), &kernel[kx * slab..], 3 * slab);
    });
    let mut u = vec![0.0; t.points() * slab];
    u.par_chunks_mut(slab).enumerate().for_each(|(at, out)| {
        let (xi, nu) = (at / side, at % side);
        mix(out, filter.row(nu), &half[xi * 3 * slab..], slab);
    });
    u
}

/// `dg = Gᵀ dU G`: `[points][slab]` back to `[3][3][slab]`.
pub(super) fn untransform_kernel_grad(t: Tiling, du: &[f32], slab: usize) -> Vec<f32> {
    let (side, filter) = (t.side(), t.filter());
    let mut half = vec![0.0; 3 * side * slab];
    half.par_chunks_mut(slab).enumerate().for_each(|(at, out)| {
        let (ky, nu) = (at / side, at % side);
        mix(out, filter.column(ky), &du[nu * slab..], side * slab);
    });
    let mut grad = vec![0.0; 9 * slab];
    grad.par_chunks_mut(slab).enumerate().for_each(|(at, out)| {
        let (ky, kx) = (at / 3, at % 3);
        mix(out, filter.column(kx), &half[ky * side * slab..], slab);
    });
    grad
}
