//! 3×3 convolutions with stride 1 by Winograd's minimal filtering F(m×m, 3×3) (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
//!
//! Each m×m block of outputs comes from an (m+2)×(m+2) tile of input as
//! `Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`: (m+2)² multiplications per channel pair instead of 9m², so
//! 2.25× fewer with m = 2 and 4× fewer with m = 4. Over channels the element-wise product
//! becomes (m+2)² matrix products, one per point of the transformed tile,
//! `[tiles × c_in] · [c_in × c_out]`; the transforms around them are sums of channel vectors.
//!
//! The backward pass is the forward's adjoint: each tile's output gradient is transformed once,
//! `P = A dY Aᵀ`, and gives the kernel's gradient (`dU = Σ Vᵀ · P` per point, then
//! `dg = Gᵀ dU G`) and the input's (`dV = P · Uᵀ` per point, then `B dV Bᵀ` added into the
//! overlapping input windows).
//!
//! Work is split into fixed chunks of whole images, each transformed, multiplied on one thread
//! and transformed back while it is in the cache; the gradients' sums run over a fixed number
//! of parts in a fixed order. Results do not depend on the thread count.

use std::cell::Cell;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use rayon::prelude::*;

use wide::f32x8;

use super::conv::{Geometry, Grads, OutputGrad, Wanted};
use super::conv_pool::{NO_POSITION, PoolWindow, PooledGrad, pooled_grad, store_pooled, take_max};
use super::gemm::{MatRef, matmul_on_this_thread};
use super::lanes::{LANES, Lanes, add, add_into, add_scaled, load, scale, store, sub};
use super::reduce::sum_in_order;

/// `values(j)` for `j < N`, built by a plain loop that the compiler unrolls.
#[inline]
fn gather_lanes<const N: usize>(mut values: impl FnMut(usize) -> Lanes) -> [Lanes; N] {
    let mut out = [f32x8::ZERO; N];
    for (j, lanes) in out.iter_mut().enumerate() {
        *lanes = values(j);
    }
    out
}

/// Row `i` of a tile held as columns: the second pass of a two-dimensional transform.
#[inline]
fn row_of<const R: usize, const C: usize>(columns: &[[Lanes; R]; C], i: usize) -> [Lanes; C] {
    gather_lanes(|l| columns[l][i])
}

/// The one-dimensional transforms of F(m×m, 3×3) with input tiles of side `s = m + 2`, written
/// out with their common terms shared: the two-dimensional transforms apply them along columns,
/// then along rows, on channel vectors held in registers.
trait Transform<const M: usize, const S: usize> {
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
struct TransformF2;

impl Transform<2, 4> for TransformF2 {
    #[inline]
    fn input([d0, d1, d2, d3]: [Lanes; 4]) -> [Lanes; 4] {
        [sub(d0, d2), add(d1, d2), sub(d2, d1), sub(d1, d3)]
    }

    #[inline]
    fn input_adjoint([v0, v1, v2, v3]: [Lanes; 4]) -> [Lanes; 4] {
        [
            v0,
            add(sub(v1, v2), v3),
            sub(add(v1, v2), v0),
            sub(f32x8::ZERO, v3),
        ]
    }

    #[inline]
    fn output([m0, m1, m2, m3]: [Lanes; 4]) -> [Lanes; 2] {
        [add(add(m0, m1), m2), sub(sub(m1, m2), m3)]
    }

    #[inline]
    fn output_adjoint([y0, y1]: [Lanes; 2]) -> [Lanes; 4] {
        [y0, add(y0, y1), sub(y0, y1), sub(f32x8::ZERO, y1)]
    }
}

/// F(4×4, 3×3), interpolation points 0, ±1, ±2.
struct TransformF4;

impl Transform<4, 6> for TransformF4 {
    #[inline]
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

    #[inline]
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

    #[inline]
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

    #[inline]
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
struct Coefficients {
    values: &'static [f32],
    cols: usize,
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
const FILTER_F2: Coefficients = Coefficients {
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
const FILTER_F4: Coefficients = Coefficients {
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

/// Which F(m×m, 3×3) a convolution uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tiling {
    /// F(2×2, 3×3): the most accurate.
    F2,
    /// F(4×4, 3×3): the fewest multiplications, with rounding errors still far below what
    /// training notices (cuDNN and oneDNN use it too).
    F4,
}

/// Channels below which the products are too thin to repay the transforms (a first layer on
/// grey or RGB images stays with im2col).
const MIN_CHANNELS: usize = 8;

/// Tiles a chunk aims for (in whole images, at least one): the chunk's transformed input and
/// products (about 0.7 MB with 32 and 64 channels) stay in a core's L2 cache, and each product
/// still has rows enough to run near the GEMM's peak.
const TILES_PER_CHUNK: usize = 48;

/// Parts the backward pass splits the batch into, each summing its share of the kernel's and
/// the bias's gradients: a fixed number, so the sums' order (and so their rounding) is the
/// same on any number of threads.
const BACKWARD_PARTS: usize = 8;

impl Tiling {
    /// Outputs along each side of a tile.
    fn m(self) -> usize {
        match self {
            Tiling::F2 => 2,
            Tiling::F4 => 4,
        }
    }

    /// Side of an input tile, and of the transformed tile.
    fn side(self) -> usize {
        self.m() + 2
    }

    /// Points of a transformed tile: the number of matrix products.
    fn points(self) -> usize {
        self.side() * self.side()
    }

    /// `G`: filter to transformed filter.
    fn filter(self) -> &'static Coefficients {
        match self {
            Tiling::F2 => &FILTER_F2,
            Tiling::F4 => &FILTER_F4,
        }
    }

    /// Multiplications per channel pair for one image of `g`'s output.
    fn multiplications(self, g: &Geometry) -> usize {
        g.out_h.div_ceil(self.m()) * g.out_w.div_ceil(self.m()) * self.points()
    }
}

/// The tiling for a convolution of `g` into `filters` channels, or `None` where im2col is the
/// better lowering: another kernel size or a stride, few channels, or an output too small for
/// tiles to save work. Ties go to the more accurate F(2×2, 3×3).
pub(crate) fn tiling(g: &Geometry, filters: usize) -> Option<Tiling> {
    if (g.kernel_h, g.kernel_w, g.stride_h, g.stride_w) != (3, 3, 1, 1)
        || g.channels < MIN_CHANNELS
        || filters < MIN_CHANNELS
    {
        return None;
    }
    let direct = g.out_pixels() * 9;
    [Tiling::F2, Tiling::F4]
        .into_iter()
        .filter(|t| t.multiplications(g) * 4 < direct * 3)
        .min_by_key(|t| t.multiplications(g))
}

/// How a batch's output divides into tiles and chunks.
#[derive(Debug, Clone, Copy)]
struct Layout {
    m: usize,
    tiles_h: usize,
    tiles_w: usize,
    /// Tile rows per chunk: whole images, so the input gradient's overlapping tiles never
    /// cross from one chunk into another.
    rows_per_chunk: usize,
    /// Tile rows in the batch.
    rows: usize,
}

impl Layout {
    fn new(m: usize, g: &Geometry) -> Layout {
        let tiles_w = g.out_w.div_ceil(m);
        let tiles_h = g.out_h.div_ceil(m);
        let most = (TILES_PER_CHUNK / (tiles_h * tiles_w)).max(1);
        // Chunks that split evenly into the backward pass's parts keep the parts (and the
        // threads, forward) equally loaded: 64 images in 13 chunks of 5 left one of two
        // threads a chunk behind. So the most images per chunk, down to half the most, that
        // give a multiple of the parts; the most otherwise. Thread counts play no part.
        let images = (most.div_ceil(2)..=most)
            .rev()
            .find(|n| g.batch.div_ceil(*n) % BACKWARD_PARTS == 0)
            .unwrap_or(most);
        Layout {
            m,
            tiles_h,
            tiles_w,
            rows_per_chunk: images * tiles_h,
            rows: g.batch * tiles_h,
        }
    }

    /// The chunks, as ranges of tile rows.
    fn chunks(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.rows)
            .step_by(self.rows_per_chunk)
            .map(|start| start..(start + self.rows_per_chunk).min(self.rows))
    }

    /// `(image, first output row)` of tile row `row`.
    fn origin(&self, row: usize) -> (usize, usize) {
        (row / self.tiles_h, (row % self.tiles_h) * self.m)
    }

    /// Offset in an output of `g` (`filters` channels) where tile row `row` starts.
    fn offset(&self, row: usize, g: &Geometry, filters: usize) -> usize {
        if row == self.rows {
            return g.batch * g.out_pixels() * filters;
        }
        let (image, y) = self.origin(row);
        (image * g.out_h + y) * g.out_w * filters
    }

    /// `out` cut into the chunks' disjoint output slices, with the chunks' tile rows.
    fn split<'o>(
        &self,
        out: &'o mut [f32],
        g: &Geometry,
        filters: usize,
    ) -> Vec<(Range<usize>, &'o mut [f32])> {
        let mut rest = out;
        self.chunks()
            .map(|rows| {
                let len = self.offset(rows.end, g, filters) - self.offset(rows.start, g, filters);
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                (rows, piece)
            })
            .collect()
    }
}

/// `out = Σ_j coefficient_j · src[j·stride..][..out.len()]`, skipping zero coefficients: the
/// filter transforms, which run once per call on whole `[c × f]` slabs.
fn mix(out: &mut [f32], coefficients: impl Iterator<Item = f32>, src: &[f32], stride: usize) {
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
fn transform_kernel(t: Tiling, kernel: &[f32], c: usize, f: usize) -> Vec<f32> {
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
fn untransform_kernel_grad(t: Tiling, du: &[f32], slab: usize) -> Vec<f32> {
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

/// An `height × width × c` image with `c` contiguous.
#[derive(Debug, Clone, Copy)]
struct Image<'a> {
    values: &'a [f32],
    height: usize,
    width: usize,
    c: usize,
}

impl<'a> Image<'a> {
    /// Image `index` of a batch of `height × width × c` images.
    fn nth(batch: &'a [f32], index: usize, (height, width, c): (usize, usize, usize)) -> Self {
        let len = height * width * c;
        Image {
            values: &batch[index * len..][..len],
            height,
            width,
            c,
        }
    }

    /// Channels `c0..c0 + n` at (`y`, `x`), zeros outside the image.
    #[inline]
    fn lanes(&self, y: isize, x: isize, c0: usize, n: usize) -> Lanes {
        if y < 0 || x < 0 {
            return f32x8::ZERO;
        }
        let (y, x) = (y.unsigned_abs(), x.unsigned_abs());
        if y >= self.height || x >= self.width {
            return f32x8::ZERO;
        }
        load(&self.values[(y * self.width + x) * self.c + c0..][..n])
    }
}

/// `V = Bᵀ d B` for every tile of the chunk `rows`, into `transformed [points][tiles][c]`.
fn transform_input<T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    input: &[f32],
    g: &Geometry,
    rows: Range<usize>,
    transformed: &mut [f32],
) {
    let c = g.channels;
    let tiles = rows.len() * layout.tiles_w;
    // One tile's columns, overwritten tile by tile: declared per tile, the 36 vectors were
    // zero-filled each time by a `memset` call.
    let mut columns = [[f32x8::ZERO; S]; S];
    for (r, row) in rows.enumerate() {
        let (image, y) = layout.origin(row);
        let image = Image::nth(input, image, (g.height, g.width, c));
        let y0 = y.cast_signed() - g.pad_top.cast_signed();
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            let x0 = (tx * M).cast_signed() - g.pad_left.cast_signed();
            for c0 in (0..c).step_by(LANES) {
                let n = LANES.min(c - c0);
                for (l, column) in columns.iter_mut().enumerate() {
                    let d = gather_lanes(|j| {
                        image.lanes(y0 + j.cast_signed(), x0 + l.cast_signed(), c0, n)
                    });
                    *column = T::input(d);
                }
                for i in 0..S {
                    let row = T::input(row_of(&columns, i));
                    for (k, lanes) in row.iter().enumerate() {
                        let at = ((i * S + k) * tiles + tile) * c + c0;
                        store(&mut transformed[at..at + n], *lanes);
                    }
                }
            }
        }
    }
}

/// One point's piece of a product operand: rows and columns as stored, and whether the
/// product reads it transposed.
#[derive(Debug, Clone, Copy)]
struct Piece {
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl Piece {
    fn plain(rows: usize, cols: usize) -> Piece {
        Piece {
            rows,
            cols,
            transposed: false,
        }
    }

    fn transposed(rows: usize, cols: usize) -> Piece {
        Piece {
            rows,
            cols,
            transposed: true,
        }
    }

    fn len(self) -> usize {
        self.rows * self.cols
    }

    fn of(self, data: &[f32]) -> MatRef<'_> {
        MatRef {
            data,
            rows: self.rows,
            cols: self.cols,
            transposed: self.transposed,
        }
    }
}

/// `dst[p] = a[p] · b[p]` (or `dst[p] += …` when `accumulate`) for every point `p`, each
/// operand cut into consecutive pieces of its shape: the per-point products of the forward
/// pass (`V · U`), the kernel's gradient (`Vᵀ · P`) and the input's (`P · Uᵀ`).
fn multiply_each_point(
    dst: &mut [f32],
    (a, a_piece): (&[f32], Piece),
    (b, b_piece): (&[f32], Piece),
    accumulate: bool,
) {
    let rows = if a_piece.transposed {
        a_piece.cols
    } else {
        a_piece.rows
    };
    let cols = if b_piece.transposed {
        b_piece.rows
    } else {
        b_piece.cols
    };
    for ((dst, a), b) in dst
        .chunks_exact_mut(rows * cols)
        .zip(a.chunks_exact(a_piece.len()))
        .zip(b.chunks_exact(b_piece.len()))
    {
        if let Err(e) = matmul_on_this_thread(dst, a_piece.of(a), b_piece.of(b), accumulate) {
            // Every slice here is cut to its piece's exact length, and the pieces' sizes are
            // products of a geometry whose sizes `ops` checked to fit in `usize`.
            unreachable!("a Winograd per-point product of its own pieces: {e}");
        }
    }
}

/// Buffers a thread reuses from chunk to chunk.
#[derive(Debug, Default)]
struct Scratch {
    /// Transformed input, `[points][tiles][c]`.
    transformed: Vec<f32>,
    /// Products, or the transformed output gradient, `[points][tiles][f]`.
    products: Vec<f32>,
}

thread_local! {
    /// Each thread's scratch between tasks, so that its buffers are sized (and zero-filled)
    /// once per thread rather than once per task.
    static KEPT: Cell<Scratch> = Cell::new(Scratch::default());
}

/// A task's scratch: the thread's kept buffers, put back when the task ends. A task that runs
/// inside another on the same thread (rayon may steal work while one waits) finds the store
/// empty and starts afresh; one of the two sets of buffers is kept.
#[derive(Debug)]
struct KeptScratch(Scratch);

impl KeptScratch {
    fn take() -> Self {
        KeptScratch(KEPT.take())
    }
}

impl Drop for KeptScratch {
    fn drop(&mut self) {
        KEPT.set(std::mem::take(&mut self.0));
    }
}

impl std::ops::Deref for KeptScratch {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        &self.0
    }
}

impl std::ops::DerefMut for KeptScratch {
    fn deref_mut(&mut self) -> &mut Scratch {
        &mut self.0
    }
}

/// The first `len` values of `buffer`, grown (with zeros) if it is shorter: every caller
/// overwrites what it uses, so what a buffer held before does not matter.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// `relu?(conv2d(input, kernel) + bias)` into `[batch, out_h, out_w, filters]`, for a 3×3
/// kernel `[3, 3, c, filters]` at stride 1.
pub(crate) fn conv2d(
    t: Tiling,
    input: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    filters: usize,
    g: &Geometry,
) -> Vec<f32> {
    let u = transform_kernel(t, kernel, g.channels, filters);
    let epilogue = Epilogue { bias, relu };
    match t {
        Tiling::F2 => conv2d_with::<TransformF2, 2, 4>(input, &u, epilogue, filters, g),
        Tiling::F4 => conv2d_with::<TransformF4, 4, 6>(input, &u, epilogue, filters, g),
    }
}

/// Whether pooling windows `window` (stride equal to the window, valid padding) tile `t`'s
/// output blocks exactly, so each window's outputs come from one tile.
pub(crate) fn pools_whole_tiles(t: Tiling, window: PoolWindow) -> bool {
    t.m().is_multiple_of(window.h) && t.m().is_multiple_of(window.w)
}

/// `max_pool(relu?(conv2d(input, kernel) + bias))` over `window`s that tile `t`'s blocks
/// ([`pools_whole_tiles`]): `(pooled [batch, out_h / window.h, out_w / window.w, filters],
/// argmax)` as [`super::conv_pool`] lays them out. The convolution's output never leaves the
/// cache: each tile's outputs are pooled as they come out of the transform.
pub(crate) fn conv2d_max_pool(
    t: Tiling,
    input: &[f32],
    kernel: &[f32],
    (bias, relu): (Option<&[f32]>, bool),
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
) -> (Vec<f32>, Vec<u8>) {
    let u = transform_kernel(t, kernel, g.channels, filters);
    let epilogue = Epilogue { bias, relu };
    match t {
        Tiling::F2 => pooled_with::<TransformF2, 2, 4>(input, &u, epilogue, filters, g, window),
        Tiling::F4 => pooled_with::<TransformF4, 4, 6>(input, &u, epilogue, filters, g, window),
    }
}

fn pooled_with<T: Transform<M, S>, const M: usize, const S: usize>(
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
            let tiles = rows.len() * layout.tiles_w;
            let products = multiply_chunk::<T, M, S>(&layout, scratch, input, u, g, &rows, filters);
            let mut block = [[f32x8::ZERO; M]; M];
            let mut columns = [[f32x8::ZERO; M]; S];
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
        });
    (pooled, argmax)
}

/// Pools channels `f0..f0 + n` of one tile's outputs, `block [row][column]` from output
/// (`y`, `x`) of the chunk's image `image`, into the chunk's `pooled` values and `argmax`:
/// the windows inside the tile that are whole windows of the output.
fn pool_tile<const M: usize>(
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
                f32x8::splat(f32::NEG_INFINITY),
                f32x8::splat(f32::from(NO_POSITION)),
            );
            for jy in 0..window.h {
                for jx in 0..window.w {
                    let value = block[wy * window.h + jy][wx * window.w + jx];
                    let position = f32x8::splat((jy * window.w + jx) as f32);
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
struct Epilogue<'a> {
    bias: Option<&'a [f32]>,
    relu: bool,
}

fn conv2d_with<T: Transform<M, S>, const M: usize, const S: usize>(
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
            let tiles = rows.len() * layout.tiles_w;
            let products = multiply_chunk::<T, M, S>(&layout, scratch, input, u, g, &rows, filters);
            let base = layout.offset(rows.start, g, filters);
            let mut columns = [[f32x8::ZERO; M]; S];
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
        });
    out
}

/// The chunk `rows`' input transformed and multiplied by the transformed kernel `u` at every
/// point: `[points][tiles][filters]`, in the scratch's products buffer.
fn multiply_chunk<'s, T: Transform<M, S>, const M: usize, const S: usize>(
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
    #[inline]
    fn apply(&self, mut lanes: Lanes, f0: usize, n: usize) -> Lanes {
        if let Some(bias) = self.bias {
            lanes = add(lanes, load(&bias[f0..f0 + n]));
        }
        if self.relu {
            // `max` with zero second: NaN becomes 0, as `f32::max(NaN, 0.0)` gives.
            lanes = lanes.fast_max(f32x8::ZERO);
        }
        lanes
    }
}

/// `Y = Aᵀ M A` for one tile of `products [points][tiles][f]`; `emit(i, k, f0, lanes)` takes
/// channels `f0..` of output (i, k) for the `rows × cols` outputs inside the image.
fn transform_output<T: Transform<M, S>, const M: usize, const S: usize>(
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
#[inline]
fn transform_output_lanes<T: Transform<M, S>, const M: usize, const S: usize>(
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

/// The gradients of `relu?(conv2d(input, kernel) + bias)` of `g` (3×3, stride 1), as the
/// adjoint of the forward pass in one sweep over the batch: each tile's output gradient is
/// transformed once, `P = A dY Aᵀ`, and feeds both the kernel's gradient (`dU += Vᵀ · P` per
/// point, then `Gᵀ dU G`) and the input's (`dV = P · Uᵀ` per point, then `B dV Bᵀ` added
/// into the overlapping input windows).
pub(crate) fn backward(
    t: Tiling,
    input: &[f32],
    kernel: &[f32],
    grad: OutputGradient<'_>,
    filters: usize,
    g: &Geometry,
    wanted: Wanted,
) -> Grads {
    let u = wanted
        .input
        .then(|| transform_kernel(t, kernel, g.channels, filters));
    let parts = match t {
        Tiling::F2 => {
            backward_parts::<TransformF2, 2, 4>(input, u.as_deref(), grad, filters, g, wanted)
        }
        Tiling::F4 => {
            backward_parts::<TransformF4, 4, 6>(input, u.as_deref(), grad, filters, g, wanted)
        }
    };
    let slab = g.channels * filters;
    // The transform back is linear: the parts are summed first, then transformed once.
    let kernel = wanted.kernel.then(|| {
        let sums: Vec<&[f32]> = parts.partial.iter().map(|p| &p.kernel[..]).collect();
        untransform_kernel_grad(t, &sum_in_order(&sums, t.points() * slab), slab)
    });
    let bias = wanted.bias.then(|| {
        let sums: Vec<&[f32]> = parts.partial.iter().map(|p| &p.bias[..]).collect();
        sum_in_order(&sums, filters)
    });
    keep_sums(parts.partial.into_iter().map(|p| p.kernel));
    Grads {
        input: parts.input,
        kernel,
        bias,
    }
}

/// Where the backward pass finds the gradient of each convolution output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutputGradient<'a> {
    /// The output was kept whole: its gradient, masked where a fused relu was zero.
    Whole(OutputGrad<'a>),
    /// The output was max-pooled by `PoolWindow`s that tile the blocks
    /// ([`pools_whole_tiles`]): each output's gradient is the pooled gradient where it was its
    /// window's argmax, else zero.
    Pooled(PooledGrad<'a>, PoolWindow),
}

impl OutputGradient<'_> {
    /// Channels `f0..f0 + n` of the gradients of the M×M outputs from (`y`, `x`) of `image`
    /// (zeros past the output's edge), into `dy [row][column]`.
    #[inline]
    fn tile<const M: usize>(
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
                            Some(out) => d & out.lanes(at.0, at.1, f0, n).simd_gt(f32x8::ZERO),
                            None => d,
                        };
                    }
                }
            }
            Self::Pooled(grad, window) => {
                let (pooled_h, pooled_w) = (g.out_h / window.h, g.out_w / window.w);
                // Outputs past the last whole window get no gradient: only edge tiles have any.
                if (y + M) / window.h > pooled_h || (x + M) / window.w > pooled_w {
                    *dy = [[f32x8::ZERO; M]; M];
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
                                let position = f32x8::splat((jy * window.w + jx) as f32);
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

/// The backward passes' per-part kernel-gradient sums, kept from call to call: a part's first
/// chunk writes its sums, so a kept buffer needs no zero-fill, where fresh ones (2.4 MB a step
/// for the tutorial CNN's conv2) were zero-filled and faulted in every step.
static KEPT_SUMS: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of `len` values whose contents are left over from an earlier call.
fn kept_sums(len: usize) -> Vec<f32> {
    let kept = KEPT_SUMS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    let mut sums = kept.unwrap_or_default();
    sums.resize(len, 0.0);
    sums
}

/// Keeps `buffers` for later calls, up to two passes' worth.
fn keep_sums(buffers: impl Iterator<Item = Vec<f32>>) {
    let mut kept = KEPT_SUMS.lock().unwrap_or_else(PoisonError::into_inner);
    for buffer in buffers {
        if kept.len() < 2 * BACKWARD_PARTS && !buffer.is_empty() {
            kept.push(buffer);
        }
    }
}

/// One part's sums: the kernel's gradient in the transformed domain, `[points][c][f]`, and the
/// bias's.
#[derive(Debug)]
struct PartialGrads {
    kernel: Vec<f32>,
    bias: Vec<f32>,
}

/// The input's gradient and every part's sums.
#[derive(Debug)]
struct Parts {
    input: Option<Vec<f32>>,
    partial: Vec<PartialGrads>,
}

fn backward_parts<T: Transform<M, S>, const M: usize, const S: usize>(
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
fn transform_output_grad<T: Transform<M, S>, const M: usize, const S: usize>(
    layout: &Layout,
    grad: OutputGradient<'_>,
    g: &Geometry,
    f: usize,
    rows: &Range<usize>,
    grads: &mut [f32],
    bias: &mut [f32],
) {
    let tiles = rows.len() * layout.tiles_w;
    // Overwritten tile by tile (see `transform_input`).
    let mut dy = [[f32x8::ZERO; M]; M];
    let mut columns = [[f32x8::ZERO; S]; M];
    for (r, row) in rows.clone().enumerate() {
        let (image, y) = layout.origin(row);
        for tx in 0..layout.tiles_w {
            let tile = r * layout.tiles_w + tx;
            for f0 in (0..f).step_by(LANES) {
                let n = LANES.min(f - f0);
                grad.tile::<M>(g, f, (image, y, tx * M), (f0, n), &mut dy);
                if !bias.is_empty() {
                    let sum = dy.iter().flatten().fold(f32x8::ZERO, |s, &d| s + d);
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
fn add_input_grad<T: Transform<M, S>, const M: usize, const S: usize>(
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
    let mut columns = [[f32x8::ZERO; S]; S];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::{Lowering, conv2d_backward, im2col_conv2d};

    fn geometry(batch: usize, (height, width): (usize, usize), c: usize, pad: usize) -> Geometry {
        Geometry {
            batch,
            height,
            width,
            channels: c,
            kernel_h: 3,
            kernel_w: 3,
            stride_h: 1,
            stride_w: 1,
            pad_top: pad,
            pad_left: pad,
            out_h: height + 2 * pad - 2,
            out_w: width + 2 * pad - 2,
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0) - 1.0)
            .collect()
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        let scale = want.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 2e-5 * scale, "{what}[{i}]: {g} vs {w}");
        }
    }

    /// `(batch, (height, width), channels, filters, padding)`.
    type Case = (usize, (usize, usize), usize, usize, usize);

    /// Sizes with partial tiles, chunks of several images and of one, and both paddings.
    const CASES: [Case; 5] = [
        (3, (13, 13), 8, 16, 0),
        (2, (7, 10), 9, 8, 1),
        (5, (4, 4), 16, 8, 0),
        (1, (30, 30), 8, 8, 1),
        (20, (5, 6), 8, 12, 0),
    ];

    #[test]
    fn both_tilings_compute_the_convolution_im2col_computes() {
        for (batch, size, c, f, pad) in CASES {
            let g = geometry(batch, size, c, pad);
            let input = values(batch * size.0 * size.1 * c, 1);
            let kernel = values(9 * c * f, 2);
            let bias = values(f, 3);
            let (mut want, _) = im2col_conv2d(&input, &kernel, Some(&bias), f, &g).unwrap();
            for v in &mut want {
                *v = v.max(0.0);
            }
            for t in [Tiling::F2, Tiling::F4] {
                let got = conv2d(t, &input, &kernel, Some(&bias), true, f, &g);
                assert_close(&got, &want, &format!("F({}) forward {g:?}", t.m()));
            }
        }
    }

    const ALL: Wanted = Wanted {
        input: true,
        kernel: true,
        bias: true,
    };

    #[test]
    fn both_tilings_compute_the_gradients_im2col_computes() {
        for (batch, size, c, f, pad) in CASES {
            let g = geometry(batch, size, c, pad);
            let input = values(batch * size.0 * size.1 * c, 4);
            let kernel = values(9 * c * f, 5);
            let d_out = values(batch * g.out_pixels() * f, 6);
            let (out, cols) = im2col_conv2d(&input, &kernel, None, f, &g).unwrap();
            let relu_output: Vec<f32> = out.iter().map(|v| v.max(0.0)).collect();
            let im2col = Lowering::Im2col(cols);
            for relu in [false, true] {
                let grad = OutputGrad {
                    values: &d_out,
                    relu_output: relu.then_some(&relu_output[..]),
                };
                let want = conv2d_backward(&im2col, &input, &kernel, grad, f, &g, ALL).unwrap();
                for t in [Tiling::F2, Tiling::F4] {
                    let got = backward(t, &input, &kernel, OutputGradient::Whole(grad), f, &g, ALL);
                    let what = format!("F({}) relu {relu} {g:?}", t.m());
                    assert_close(&got.input.unwrap(), want.input.as_ref().unwrap(), &what);
                    assert_close(&got.kernel.unwrap(), want.kernel.as_ref().unwrap(), &what);
                    assert_close(&got.bias.unwrap(), want.bias.as_ref().unwrap(), &what);
                }
            }
        }
    }

    #[test]
    fn only_the_wanted_gradients_are_computed() {
        let g = geometry(2, (6, 6), 8, 0);
        let (input, kernel) = (values(2 * 36 * 8, 1), values(9 * 8 * 8, 2));
        let d_out = values(2 * 16 * 8, 3);
        let grad = OutputGrad {
            values: &d_out,
            relu_output: None,
        };
        let kernel_only = Wanted {
            input: false,
            kernel: true,
            bias: false,
        };
        let grads = backward(
            Tiling::F2,
            &input,
            &kernel,
            OutputGradient::Whole(grad),
            8,
            &g,
            kernel_only,
        );
        assert!(grads.input.is_none() && grads.bias.is_none());
        let all = backward(
            Tiling::F2,
            &input,
            &kernel,
            OutputGradient::Whole(grad),
            8,
            &g,
            ALL,
        );
        assert_eq!(grads.kernel, all.kernel);
    }

    #[test]
    fn results_are_bit_identical_on_one_and_two_threads() {
        let g = geometry(16, (13, 13), 32, 0);
        let input = values(16 * 13 * 13 * 32, 7);
        let kernel = values(9 * 32 * 64, 8);
        let d_out = values(16 * g.out_pixels() * 64, 9);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let out = conv2d(Tiling::F4, &input, &kernel, None, true, 64, &g);
                let grad = OutputGrad {
                    values: &d_out,
                    relu_output: Some(&out),
                };
                let grads = backward(
                    Tiling::F4,
                    &input,
                    &kernel,
                    OutputGradient::Whole(grad),
                    64,
                    &g,
                    ALL,
                );
                (out.clone(), grads.input, grads.kernel, grads.bias)
            })
        };
        assert_eq!(run(1), run(2));
    }

    /// `Bᵀ` and `Aᵀ` as Lavin and Gray publish them, row-major.
    #[rustfmt::skip]
    const INPUT_F2: [f32; 16] = [
        1.0,  0.0, -1.0,  0.0,
        0.0,  1.0,  1.0,  0.0,
        0.0, -1.0,  1.0,  0.0,
        0.0,  1.0,  0.0, -1.0,
    ];
    #[rustfmt::skip]
    const OUTPUT_F2: [f32; 8] = [
        1.0, 1.0,  1.0,  0.0,
        0.0, 1.0, -1.0, -1.0,
    ];
    #[rustfmt::skip]
    const INPUT_F4: [f32; 36] = [
        4.0,  0.0, -5.0,  0.0, 1.0, 0.0,
        0.0, -4.0, -4.0,  1.0, 1.0, 0.0,
        0.0,  4.0, -4.0, -1.0, 1.0, 0.0,
        0.0, -2.0, -1.0,  2.0, 1.0, 0.0,
        0.0,  2.0, -1.0, -2.0, 1.0, 0.0,
        0.0,  4.0,  0.0, -5.0, 0.0, 1.0,
    ];
    #[rustfmt::skip]
    const OUTPUT_F4: [f32; 24] = [
        1.0, 1.0,  1.0, 1.0,  1.0, 0.0,
        0.0, 1.0, -1.0, 2.0, -2.0, 0.0,
        0.0, 1.0,  1.0, 4.0,  4.0, 0.0,
        0.0, 1.0, -1.0, 8.0, -8.0, 1.0,
    ];

    /// Each lane `e` of position `j` holds `j + 10·e`: distinct, exact in `f32`.
    fn probe<const N: usize>() -> [Lanes; N] {
        std::array::from_fn(|j| f32x8::from(std::array::from_fn(|e| (j + 10 * e) as f32)))
    }

    fn arrays(lanes: &[Lanes]) -> Vec<[f32; LANES]> {
        lanes.iter().map(|l| l.to_array()).collect()
    }

    /// `matrix [rows × N] · x` per lane.
    fn times<const N: usize>(matrix: &[f32], rows: usize, x: &[Lanes; N]) -> Vec<[f32; LANES]> {
        let x = arrays(x);
        (0..rows)
            .map(|i| std::array::from_fn(|e| (0..N).map(|j| matrix[i * N + j] * x[j][e]).sum()))
            .collect()
    }

    /// `matrixᵀ · y` per lane, for an `N × cols` matrix.
    fn times_transposed<const N: usize>(
        matrix: &[f32],
        cols: usize,
        y: &[Lanes; N],
    ) -> Vec<[f32; LANES]> {
        let y = arrays(y);
        (0..cols)
            .map(|j| std::array::from_fn(|e| (0..N).map(|i| matrix[i * cols + j] * y[i][e]).sum()))
            .collect()
    }

    fn check_transforms<T: Transform<M, S>, const M: usize, const S: usize>(
        input: &[f32],
        output: &[f32],
    ) {
        let (d, y) = (probe::<S>(), probe::<M>());
        assert_eq!(arrays(&T::input(d)), times(input, S, &d));
        assert_eq!(arrays(&T::input_adjoint(d)), times_transposed(input, S, &d));
        assert_eq!(arrays(&T::output(d)), times(output, M, &d));
        assert_eq!(
            arrays(&T::output_adjoint(y)),
            times_transposed(output, S, &y)
        );
    }

    #[test]
    fn the_written_out_transforms_are_the_published_matrices() {
        check_transforms::<TransformF2, 2, 4>(&INPUT_F2, &OUTPUT_F2);
        check_transforms::<TransformF4, 4, 6>(&INPUT_F4, &OUTPUT_F4);
    }

    #[test]
    fn the_tiling_follows_the_work_it_saves() {
        let g = geometry(1, (13, 13), 32, 0);
        assert_eq!(tiling(&g, 64).map(Tiling::m), Some(4), "11×11 outputs");
        assert_eq!(
            tiling(&geometry(1, (4, 4), 32, 0), 64).map(Tiling::m),
            Some(2)
        );
        assert!(
            tiling(&geometry(1, (3, 3), 32, 0), 64).is_none(),
            "one output"
        );
        assert!(
            tiling(&geometry(1, (28, 28), 1, 0), 32).is_none(),
            "one channel"
        );
        assert!(tiling(&g, 4).is_none(), "four filters");
        let strided = Geometry {
            stride_h: 2,
            stride_w: 2,
            out_h: 6,
            out_w: 6,
            ..g
        };
        assert!(tiling(&strided, 64).is_none(), "a stride");
    }
}
