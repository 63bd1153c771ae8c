//! How a batch's output divides into tiles and chunks, the input transform of a chunk's tiles,
//! and the per-point matrix products between transformed operands.

use std::ops::Range;

use super::transform::{Transform, gather_lanes, row_of};
use super::{BACKWARD_PARTS, TILES_PER_CHUNK};
use crate::kernels::gemm::{MatRef, matmul_on_this_thread};
use crate::kernels::geometry::Geometry;
use crate::kernels::lanes::{LANES, Lanes, load, store};

/// How a batch's output divides into tiles and chunks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) m: usize,
    pub(super) tiles_h: usize,
    pub(super) tiles_w: usize,
    /// Tile rows per chunk: whole images, so the input gradient's overlapping tiles never
    /// cross from one chunk into another.
    pub(super) rows_per_chunk: usize,
    /// Tile rows in the batch.
    pub(super) rows: usize,
}

impl Layout {
    pub(super) fn new(m: usize, g: &Geometry) -> Layout {
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
    pub(super) fn chunks(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.rows)
            .step_by(self.rows_per_chunk)
            .map(|start| start..(start + self.rows_per_chunk).min(self.rows))
    }

    /// `(image, first output row)` of tile row `row`.
    pub(super) fn origin(&self, row: usize) -> (usize, usize) {
        (row / self.tiles_h, (row % self.tiles_h) * self.m)
    }

    /// Offset in an output of `g` (`filters` channels) where tile row `row` starts.
    pub(super) fn offset(&self, row: usize, g: &Geometry, filters: usize) -> usize {
        if row == self.rows {
            return g.batch * g.out_pixels() * filters;
        }
        let (image, y) = self.origin(row);
        (image * g.out_h + y) * g.out_w * filters
    }

    /// `out` cut into the chunks' disjoint output slices, with the chunks' tile rows.
    pub(super) fn split<'o>(
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

/// An `height × width × c` image with `c` contiguous.
#[derive(Debug, Clone, Copy)]
pub(super) struct Image<'a> {
    pub(super) values: &'a [f32],
    pub(super) height: usize,
    pub(super) width: usize,
    pub(super) c: usize,
}

impl<'a> Image<'a> {
    /// Image `index` of a batch of `height × width × c` images.
    pub(super) fn nth(
        batch: &'a [f32],
        index: usize,
        (height, width, c): (usize, usize, usize),
    ) -> Self {
        let len = height * width * c;
        Image {
            values: &batch[index * len..][..len],
            height,
            width,
            c,
        }
    }

    /// Channels `c0..c0 + n` at (`y`, `x`), zeros outside the image.
    #[inline(always)]
    pub(super) fn lanes(&self, y: isize, x: isize, c0: usize, n: usize) -> Lanes {
        if y < 0 || x < 0 {
            return Lanes::zero();
        }
        let (y, x) = (y.unsigned_abs(), x.unsigned_abs());
        if y >= self.height || x >= self.width {
            return Lanes::zero();
        }
        load(&self.values[(y * self.width + x) * self.c + c0..][..n])
    }
}

/// `V = Bᵀ d B` for every tile of the chunk `rows`, into `transformed [points][tiles][c]`.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn transform_input<T: Transform<M, S>, const M: usize, const S: usize>(
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
    let mut columns = [[Lanes::zero(); S]; S];
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
pub(super) struct Piece {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) transposed: bool,
}

impl Piece {
    pub(super) fn plain(rows: usize, cols: usize) -> Piece {
        Piece {
            rows,
            cols,
            transposed: false,
        }
    }

    pub(super) fn transposed(rows: usize, cols: usize) -> Piece {
        Piece {
            rows,
            cols,
            transposed: true,
        }
    }

    pub(super) fn len(self) -> usize {
        self.rows * self.cols
    }

    pub(super) fn of(self, data: &[f32]) -> MatRef<'_> {
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
pub(super) fn multiply_each_point(
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
