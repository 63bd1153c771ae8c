//! The forward pass: each chunk's tiles transformed, multiplied by the transformed kernel at
//! every point and transformed back, with the bias and relu applied as the outputs leave the
//! transform, either stored whole or max-pooled tile by tile.

use std::ops::Range;

use rayon::prelude::*;

use super::scratch::{KeptScratch, Scratch, sized};
use super::tiles::{Layout, Piece, multiply_each_point, transform_input};
use super::transform::{Transform, gather_lanes, row_of};
use crate::kernels::geometry::{Geometry, PoolWindow};
use crate::kernels::lanes::{LANES, Lanes, add, load, store};
use crate::kernels::window_max::{NO_POSITION, store_pooled, take_max};

pub(super) fn pooled_with<T: Transform<M, S>, const M: usize, const S: usize>(
    input: &[f32],
    u: &[f32],
    epilogue: Epilogue<'_>,
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
) -> (Vec<f32>, Vec<u8>) {
    let layout = Layout::new(M, g);
    let (pooled_h, pooled_w) = (g.out_h / window.h, g.out_w / window.w);
    let image_out = pooled_h * pooled_w * filters;
    let mut pooled = vec![0.0; g.batch * image_out];
    let mut argmax = vec![NO_POSITION; g.batch * image_out];
    let mut rest = (&mut pooled[..], &mut argmax[..]);
    let work: Vec<_> = layout
        .chunks()
        .map(|rows| {
            let len = rows.len() / layout.tiles_h * image_out;
            let (p, p_tail) = std::mem::take(&mut rest.0).split_at_mut(len);
            let (a, a_tail) = std::mem::take(&mut rest.1).split_at_mut(len);
            rest = (p_tail, a_tail);
            (rows, p, a)
        })
        .collect();
    work.into_par_iter()
        .for_each_init(KeptScratch::take, |scratch, (rows, pooled, argmax)| {
            let chunk = (rows, pooled, argmax);
            pooled_rows::<T, M, S>(
                &layout,
                scratch,
                (input, u),
                epilogue,
                filters,
                g,
                window,
                chunk,
            );
        });
    (pooled, argmax)
}

/// [`pooled_with`] of one chunk of tile rows, into the chunk's pooled values and argmax.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
#[allow(
    clippy::too_many_arguments,
    reason = "the chunk's share of pooled_with's arguments"
)]
fn pooled_rows<'e, T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    scratch: &mut Scratch,
    (input, u): (&[f32], &[f32]),
    epilogue: Epilogue<'e>,
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
    (rows, pooled, argmax): (Range<usize>, &mut [f32], &mut [u8]),
) {
    let tiles = rows.len() * layout.tiles_w;
    let products = multiply_chunk::<T, M, S>(layout, scratch, input, u, g, &rows, filters);
    let mut block = [[Lanes::zero(); M]; M];
    let mut columns = [[Lanes::zero(); M]; S];
    let first_image = rows.start / layout.tiles_h;
    for (r, row) in rows.enumerate() {
        let (image, y) = layout.origin(row);
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            let x = tx * M;
            for f0 in (0..filters).step_by(LANES) {
                let n = LANES.min(filters - f0);
                transform_output_lanes::<T, M, S>(
                    products,
                    (tile, tiles, filters),
                    f0,
                    &mut columns,
                    |i, k, lanes| {
                        block[i][k] = epilogue.apply(lanes, f0, n);
                    },
                );
                let pooled_chunk = (&mut *pooled, &mut *argmax);
                let origin = (image - first_image, y, x);
                pool_tile(&block, pooled_chunk, origin, (f0, n), (filters, g, window));
            }
        }
    }
}

/// Pools channels `f0..f0 + n` of one tile's outputs, `block [row][column]` from output
/// (`y`, `x`) of the chunk's image `image`, into the chunk's `pooled` values and `argmax`:
/// the windows inside the tile that are whole windows of the output.
#[inline(always)]
pub(super) fn pool_tile<const M: usize>(
    block: &[[Lanes; M]; M],
    (pooled, argmax): (&mut [f32], &mut [u8]),
    (image, y, x): (usize, usize, usize),
    (f0, n): (usize, usize),
    (filters, g, window): (usize, &Geometry, PoolWindow),
) {
    let (pooled_h, pooled_w) = (g.out_h / window.h, g.out_w / window.w);
    for wy in 0..M / window.h {
        let py = y / window.h + wy;
        for wx in 0..M / window.w {
            let px = x / window.w + wx;
            if py >= pooled_h || px >= pooled_w {
                continue;
            }
            let mut best = (
                Lanes::splat(f32::NEG_INFINITY),
                Lanes::splat(f32::from(NO_POSITION)),
            );
            for jy in 0..window.h {
                for jx in 0..window.w {
                    let value = block[wy * window.h + jy][wx * window.w + jx];
                    let position = Lanes::splat((jy * window.w + jx) as f32);
                    best = take_max(value, false, best, position);
                }
            }
            let at = ((image * pooled_h + py) * pooled_w + px) * filters + f0;
            store_pooled((&mut pooled[at..at + n], &mut argmax[at..at + n]), best);
        }
    }
}

/// What the forward pass adds to each output after the transform.
#[derive(Debug, Clone, Copy)]
pub(super) struct Epilogue<'a> {
    pub(super) bias: Option<&'a [f32]>,
    pub(super) relu: bool,
}

pub(super) fn conv2d_with<T: Transform<M, S>, const M: usize, const S: usize>(
    input: &[f32],
    u: &[f32],
    epilogue: Epilogue<'_>,
    filters: usize,
    g: &Geometry,
) -> Vec<f32> {
    let layout = Layout::new(M, g);
    let mut out = vec![0.0; g.batch * g.out_pixels() * filters];
    layout
        .split(&mut out, g, filters)
        .into_par_iter()
        .for_each_init(KeptScratch::take, |scratch, (rows, out)| {
            conv2d_rows::<T, M, S>(
                &layout,
                scratch,
                (input, u),
                epilogue,
                filters,
                g,
                rows,
                out,
            );
        });
    out
}

/// [`conv2d_with`] of one chunk of tile rows, into the chunk's `out`.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
#[allow(
    clippy::too_many_arguments,
    reason = "the chunk's share of conv2d_with's arguments"
)]
fn conv2d_rows<'e, T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    scratch: &mut Scratch,
    (input, u): (&[f32], &[f32]),
    epilogue: Epilogue<'e>,
    filters: usize,
    g: &Geometry,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let tiles = rows.len() * layout.tiles_w;
    let products = multiply_chunk::<T, M, S>(layout, scratch, input, u, g, &rows, filters);
    let base = layout.offset(rows.start, g, filters);
    let mut columns = [[Lanes::zero(); M]; S];
    for (r, row) in rows.enumerate() {
        let (image, y) = layout.origin(row);
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            let rows_here = M.min(g.out_h - y);
            let cols_here = M.min(g.out_w - tx * M);
            let first = ((image * g.out_h + y) * g.out_w + tx * M) * filters - base;
            let place = |i: usize, k: usize| first + (i * g.out_w + k) * filters;
            transform_output::<T, M, S>(
                products,
                (tile, tiles, filters),
                (rows_here, cols_here),
                &mut columns,
                |i, k, f0, lanes| {
                    let n = LANES.min(filters - f0);
                    let at = place(i, k) + f0;
                    store(&mut out[at..at + n], epilogue.apply(lanes, f0, n));
                },
            );
        }
    }
}

/// The chunk `rows`' input transformed and multiplied by the transformed kernel `u` at every
/// point: `[points][tiles][filters]`, in the scratch's products buffer.
pub(super) fn multiply_chunk<'s, T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    scratch: &'s mut Scratch,
    input: &[f32],
    u: &[f32],
    g: &Geometry,
    rows: &Range<usize>,
    filters: usize,
) -> &'s [f32] {
    let tiles = rows.len() * layout.tiles_w;
    let transformed = sized(&mut scratch.transformed, S * S * tiles * g.channels);
    transform_input::<T, M, S>(layout, input, g, rows.clone(), transformed);
    let products = sized(&mut scratch.products, S * S * tiles * filters);
    multiply_each_point(
        products,
        (transformed, Piece::plain(tiles, g.channels)),
        (u, Piece::plain(g.channels, filters)),
        false,
    );
    products
}

impl Epilogue<'_> {
    #[inline(always)]
    pub(super) fn apply(&self, mut lanes: Lanes, f0: usize, n: usize) -> Lanes {
        if let Some(bias) = self.bias {
            lanes = add(lanes, load(&bias[f0..f0 + n]));
        }
        if self.relu {
            // `max` with zero second: NaN becomes 0, as `f32::max(NaN, 0.0)` gives.
            lanes = lanes.fast_max(Lanes::zero());
        }
        lanes
    }
}

/// `Y = Aᵀ M A` for one tile of `products [points][tiles][f]`; `emit(i, k, f0, lanes)` takes
/// channels `f0..` of output (i, k) for the `rows × cols` outputs inside the image.
#[inline(always)]
pub(super) fn transform_output<T: Transform<M, S>, const M: usize, const S: usize>(
    products: &[f32],
    (tile, tiles, f): (usize, usize, usize),
    (rows, cols): (usize, usize),
    columns: &mut [[Lanes; M]; S],
    mut emit: impl FnMut(usize, usize, usize, Lanes),
) {
    for f0 in (0..f).step_by(LANES) {
        let place = (tile, tiles, f);
        transform_output_lanes::<T, M, S>(products, place, f0, columns, |i, k, lanes| {
            if i < rows && k < cols {
                emit(i, k, f0, lanes);
            }
        });
    }
}

/// Channels `f0..f0 + 8` of [`transform_output`], for every output of the tile; `columns` is
/// scratch, overwritten (declared per call, its 24 vectors were zero-filled by a `memset`
/// call each time).
#[inline(always)]
pub(super) fn transform_output_lanes<T: Transform<M, S>, const M: usize, const S: usize>(
    products: &[f32],
    (tile, tiles, f): (usize, usize, usize),
    f0: usize,
    columns: &mut [[Lanes; M]; S],
    mut emit: impl FnMut(usize, usize, Lanes),
) {
    let n = LANES.min(f - f0);
    for (l, column) in columns.iter_mut().enumerate() {
        let m = gather_lanes(|j| load(&products[((j * S + l) * tiles + tile) * f + f0..][..n]));
        *column = T::output(m);
    }
    for i in 0..M {
        let row = T::output(row_of(columns, i));
        for (k, &lanes) in row.iter().enumerate() {
            emit(i, k, lanes);
        }
    }
}
