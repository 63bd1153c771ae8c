//! The backward pass, the forward's adjoint: each tile's output gradient (whole, or rebuilt from
//! a pooled one) transformed once, then multiplied into the kernel's and the input's gradients.

use std::ops::Range;

use rayon::prelude::*;

use super::BACKWARD_PARTS;
use super::scratch::{KeptScratch, Scratch, kept_sums, sized};
use super::tiles::{Image, Layout, Piece, multiply_each_point, transform_input};
use super::transform::{Transform, gather_lanes, row_of};
use crate::kernels::geometry::{Geometry, OutputGrad, PoolWindow, Wanted};
use crate::kernels::lanes::{LANES, Lanes, add_into, load, store};
use crate::kernels::window_max::{PooledGrad, pooled_grad};

/// Where the backward pass finds the gradient of each convolution output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutputGradient<'a> {
    /// The output was kept whole: its gradient, masked where a fused relu was zero.
    Whole(OutputGrad<'a>),
    /// The output was max-pooled by `PoolWindow`s that tile the blocks
    /// ([`super::pools_whole_tiles`]): each output's gradient is the pooled gradient where it was its
    /// window's argmax, else zero.
    Pooled(PooledGrad<'a>, PoolWindow),
}

impl OutputGradient<'_> {
    /// Channels `f0..f0 + n` of the gradients of the M×M outputs from (`y`, `x`) of `image`
    /// (zeros past the output's edge), into `dy [row][column]`.
    #[inline(always)]
    pub(super) fn tile<const M: usize>(
        &self,
        g: &Geometry,
        f: usize,
        (image, y, x): (usize, usize, usize),
        (f0, n): (usize, usize),
        dy: &mut [[Lanes; M]; M],
    ) {
        match *self {
            Self::Whole(grad) => {
                let values = Image::nth(grad.values, image, (g.out_h, g.out_w, f));
                let relu_output = grad
                    .relu_output
                    .map(|out| Image::nth(out, image, (g.out_h, g.out_w, f)));
                for (i, row) in dy.iter_mut().enumerate() {
                    for (l, dy) in row.iter_mut().enumerate() {
                        let at = ((y + i).cast_signed(), (x + l).cast_signed());
                        let d = values.lanes(at.0, at.1, f0, n);
                        *dy = match relu_output {
                            Some(out) => d & out.lanes(at.0, at.1, f0, n).simd_gt(Lanes::zero()),
                            None => d,
                        };
                    }
                }
            }
            Self::Pooled(grad, window) => {
                let (pooled_h, pooled_w) = (g.out_h / window.h, g.out_w / window.w);
                // Outputs past the last whole window get no gradient: only edge tiles have any.
                if (y + M) / window.h > pooled_h || (x + M) / window.w > pooled_w {
                    *dy = [[Lanes::zero(); M]; M];
                }
                for wy in 0..M / window.h {
                    let py = y / window.h + wy;
                    for wx in 0..M / window.w {
                        let px = x / window.w + wx;
                        if py >= pooled_h || px >= pooled_w {
                            continue;
                        }
                        let at = ((image * pooled_h + py) * pooled_w + px) * f + f0;
                        let (d, arg) = pooled_grad(grad, at..at + n);
                        for jy in 0..window.h {
                            for jx in 0..window.w {
                                let position = Lanes::splat((jy * window.w + jx) as f32);
                                dy[wy * window.h + jy][wx * window.w + jx] =
                                    d & arg.simd_eq(position);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One part's sums: the kernel's gradient in the transformed domain, `[points][c][f]`, and the
/// bias's.
#[derive(Debug)]
pub(super) struct PartialGrads {
    pub(super) kernel: Vec<f32>,
    pub(super) bias: Vec<f32>,
}

/// The input's gradient and every part's sums.
#[derive(Debug)]
pub(super) struct Parts {
    pub(super) input: Option<Vec<f32>>,
    pub(super) partial: Vec<PartialGrads>,
}

pub(super) fn backward_parts<T: Transform<M, S>, const M: usize, const S: usize>(
    input: &[f32],
    u: Option<&[f32]>,
    grad: OutputGradient<'_>,
    filters: usize,
    g: &Geometry,
    wanted: Wanted,
) -> Parts {
    let layout = Layout::new(M, g);
    let chunks: Vec<Range<usize>> = layout.chunks().collect();
    let parts = BACKWARD_PARTS.min(chunks.len());
    let c = g.channels;
    let image_len = g.height * g.width * c;
    let mine = |part: usize| part * chunks.len() / parts..(part + 1) * chunks.len() / parts;
    let mut d_input = u.map(|_| vec![0.0; g.batch * image_len]);
    let mut rest: &mut [f32] = d_input.as_deref_mut().unwrap_or_default();
    let work: Vec<(Range<usize>, &mut [f32])> = (0..parts)
        .map(|part| {
            let images = match &chunks[mine(part)] {
                [first, .., last] => first.start..last.end,
                [only] => only.clone(),
                [] => 0..0,
            };
            let len = if u.is_some() {
                images.len() / layout.tiles_h * image_len
            } else {
                0
            };
            let (slice, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            (mine(part), slice)
        })
        .collect();
    let partial = work
        .into_par_iter()
        .map_init(KeptScratch::take, |scratch, (mine, d_input)| {
            let mut partial = PartialGrads {
                kernel: if wanted.kernel {
                    kept_sums(S * S * c * filters)
                } else {
                    Vec::new()
                },
                bias: vec![0.0; if wanted.bias { filters } else { 0 }],
            };
            let first_image = chunks[mine.start].start / layout.tiles_h;
            for (n, rows) in chunks[mine].iter().enumerate() {
                let tiles = rows.len() * layout.tiles_w;
                let Scratch {
                    transformed,
                    products,
                } = &mut **scratch;
                let p = sized(products, S * S * tiles * filters);
                transform_output_grad::<T, M, S>(
                    &layout,
                    grad,
                    g,
                    filters,
                    rows,
                    p,
                    &mut partial.bias,
                );
                if wanted.kernel {
                    let v = sized(transformed, S * S * tiles * c);
                    transform_input::<T, M, S>(&layout, input, g, rows.clone(), v);
                    // The part's first chunk writes the sums (the buffer holds another call's);
                    // the rest add to them.
                    multiply_each_point(
                        &mut partial.kernel,
                        (v, Piece::transposed(tiles, c)),
                        (p, Piece::plain(tiles, filters)),
                        n > 0,
                    );
                }
                if let Some(u) = u {
                    let dv = sized(transformed, S * S * tiles * c);
                    multiply_each_point(
                        dv,
                        (p, Piece::plain(tiles, filters)),
                        (u, Piece::transposed(c, filters)),
                        false,
                    );
                    add_input_grad::<T, M, S>(&layout, dv, g, rows, d_input, first_image);
                }
            }
            partial
        })
        .collect();
    Parts {
        input: d_input,
        partial,
    }
}

/// `P = A dY Aᵀ` for every tile of the chunk `rows`, into `grads [points][tiles][f]` (outputs
/// past the image's edge count as zero), adding each output's gradient into `bias` when it is
/// wanted (non-empty).
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn transform_output_grad<'g, T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    grad: OutputGradient<'g>,
    g: &Geometry,
    f: usize,
    rows: &Range<usize>,
    grads: &mut [f32],
    bias: &mut [f32],
) {
    let tiles = rows.len() * layout.tiles_w;
    // Overwritten tile by tile (see `transform_input`).
    let mut dy = [[Lanes::zero(); M]; M];
    let mut columns = [[Lanes::zero(); S]; M];
    for (r, row) in rows.clone().enumerate() {
        let (image, y) = layout.origin(row);
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            for f0 in (0..f).step_by(LANES) {
                let n = LANES.min(f - f0);
                grad.tile::<M>(g, f, (image, y, tx * M), (f0, n), &mut dy);
                if !bias.is_empty() {
                    let sum = dy.iter().flatten().fold(Lanes::zero(), |s, &d| s + d);
                    add_into(&mut bias[f0..f0 + n], sum);
                }
                for (l, column) in columns.iter_mut().enumerate() {
                    *column = T::output_adjoint(gather_lanes(|i| dy[i][l]));
                }
                for xi in 0..S {
                    let row = T::output_adjoint(row_of(&columns, xi));
                    for (nu, lanes) in row.iter().enumerate() {
                        let at = ((xi * S + nu) * tiles + tile) * f + f0;
                        store(&mut grads[at..at + n], *lanes);
                    }
                }
            }
        }
    }
}

/// Adds `B dV Bᵀ` of every tile of the chunk `rows` (`dv [points][tiles][c]`) into the input
/// windows the tiles read, in `d_input`: the images from `first_image` on.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn add_input_grad<T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    dv: &[f32],
    g: &Geometry,
    rows: &Range<usize>,
    d_input: &mut [f32],
    first_image: usize,
) {
    let c = g.channels;
    let tiles = rows.len() * layout.tiles_w;
    let image_len = g.height * g.width * c;
    // Overwritten tile by tile (see `transform_input`).
    let mut columns = [[Lanes::zero(); S]; S];
    for (r, row) in rows.clone().enumerate() {
        let (image, y) = layout.origin(row);
        let d_image = &mut d_input[(image - first_image) * image_len..][..image_len];
        let y0 = y.cast_signed() - g.pad_top.cast_signed();
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            let x0 = (tx * M).cast_signed() - g.pad_left.cast_signed();
            for c0 in (0..c).step_by(LANES) {
                let n = LANES.min(c - c0);
                for (l, column) in columns.iter_mut().enumerate() {
                    let v =
                        gather_lanes(|j| load(&dv[((j * S + l) * tiles + tile) * c + c0..][..n]));
                    *column = T::input_adjoint(v);
                }
                for i in 0..S {
                    let Some(y) = y0
                        .checked_add(i.cast_signed())
                        .filter(|y| (0..g.height.cast_signed()).contains(y))
                    else {
                        continue;
                    };
                    let row = T::input_adjoint(row_of(&columns, i));
                    for (k, &lanes) in row.iter().enumerate() {
                        let x = x0 + k.cast_signed();
                        if x < 0 || x >= g.width.cast_signed() {
                            continue;
                        }
                        let at = (y.unsigned_abs() * g.width + x.unsigned_abs()) * c + c0;
                        add_into(&mut d_image[at..at + n], lanes);
                    }
                }
            }
        }
    }
}
