//! A convolution fused with the max pooling after it ([`PooledConv`]), so that its full-size
//! output and that output's gradient are never stored: the forward pass writes the pooled values
//! and a one-byte argmax per value; the backward pass rebuilds each window's gradient from those
//! (the pooled gradient at the argmax, masked where a relu made the pooled value zero). Two
//! lowerings, each only where pooling windows do not overlap:
//!
//! - Direct (this module), for few kernel values per output, as in a first layer (3×3 over grey
//!   or colour pixels); it gives no input gradient.
//! - Winograd ([`super::winograd::conv2d_max_pool`]), where its 4×4 or 2×2 output blocks hold
//!   whole windows: each tile's outputs are pooled as they leave the transform, and the
//!   backward pass builds each tile's output gradient from the pooled one.
//!
//! Otherwise the caller runs the convolution and the pooling apart.
//!
//! The direct method. A first layer does little arithmetic (nine multiply-adds per output
//! value over one channel) on a large output (26×26×32 values per MNIST image), so apart its
//! time goes to memory: the im2col rows, the whole activation, reading it again to pool it, a
//! four-byte argmax per pooled value, and in the backward pass a whole-size gradient, its relu
//! mask and the kernel-gradient product over both. Fused, the convolution outputs of one pooling window live
//! only in registers: the forward pass writes the pooled values and a one-byte argmax; the
//! backward pass rebuilds each window's gradient from those, in registers, and adds its outer
//! product with the window's inputs to the kernel's gradient.
//!
//! Each window's inputs are first gathered into a small patch (its im2col rows, in L1): a
//! kernel row at a time where the window lies inside the image, value by value with zeros for
//! the padding elsewhere. The inner loops then take a group of four window positions and sixteen
//! filters at a time: each input value is broadcast once for two vectors of filters, each kernel
//! vector loaded once for four positions, and the eight sums stay in registers.
//!
//! The values are those of convolution → bias → relu → max pooling, in that order, up to
//! rounding (the products are summed tap by tap instead of by GEMM's blocks); ties and NaN go as
//! in [`super::pool::max_pool`]. Only the kernel's and the bias's gradients are computed (a
//! first layer's input never wants one).
//!
//! Work splits into fixed pieces (images forward, [`BACKWARD_PARTS`] ranges of images
//! backward, summed in order): results do not depend on the thread count.

use rayon::prelude::*;

use super::geometry::{Geometry, Grads, PoolWindow, Wanted};
use super::lanes::{LANES, Lanes, store};
use super::reduce::sum_in_order;
use super::window_max::{NO_POSITION, PooledGrad, pooled_grad, store_pooled, take_max};
use super::winograd::{self, Tiling};

/// Kernel values per output (`kernel_h · kernel_w · channels`) up to which the direct method
/// is used: 3×3 over one or three channels, 5×5 over one. Beyond it GEMM's reuse of each loaded
/// value wins and the activation is no longer large next to the arithmetic.
const MAX_PATCH: usize = 32;

/// Pooling window sizes up to which the argmax fits a byte with room for "none".
const MAX_POSITIONS: usize = 16;

/// Window positions computed together (the inner loops name the four).
const GROUP: usize = 4;

/// Filters computed together: two vectors, so that with [`GROUP`] positions the sums fill
/// eight of the sixteen AVX registers and the loaded values most of the rest.
const BLOCK: usize = 2 * LANES;

/// Fixed parts of the batch for the backward pass, each summing its own kernel gradient.
const BACKWARD_PARTS: usize = 8;

/// How a convolution and the max pooling after it are computed together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PooledLowering {
    /// Directly, window by window (few kernel values per output; no input gradient).
    Direct,
    /// By Winograd's algorithm, each tile's outputs pooled as they leave the transform.
    Winograd(Tiling),
}

/// A convolution of `g` into `filters` channels, max-pooled by non-overlapping `window`s, and
/// how it is computed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PooledConv {
    pub(crate) g: Geometry,
    pub(crate) filters: usize,
    pub(crate) window: PoolWindow,
    pub(crate) lowering: PooledLowering,
}

impl PooledConv {
    /// The fused computation for this layer, or `None` where the two operations are better
    /// apart. `input_grad`: whether the input wants a gradient.
    pub(crate) fn new(
        g: &Geometry,
        filters: usize,
        window: PoolWindow,
        input_grad: bool,
    ) -> Option<Self> {
        let fits = (1..=MAX_POSITIONS).contains(&window.positions())
            && g.out_h >= window.h
            && g.out_w >= window.w;
        if !fits {
            return None;
        }
        let lowering = if !input_grad && g.patch() <= MAX_PATCH {
            PooledLowering::Direct
        } else {
            let t = winograd::tiling(g, filters)?;
            winograd::pools_whole_tiles(t, window).then_some(PooledLowering::Winograd(t))?
        };
        Some(Self {
            g: *g,
            filters,
            window,
            lowering,
        })
    }

    /// `(pooled [batch, out_h / window.h, out_w / window.w, filters], argmax)`, where
    /// `argmax[i]` is the window position (row-major) pooled value `i` came from.
    pub(crate) fn forward(
        &self,
        input: &[f32],
        kernel: &[f32],
        bias: Option<&[f32]>,
        relu: bool,
    ) -> (Vec<f32>, Vec<u8>) {
        let (g, f, window) = (&self.g, self.filters, self.window);
        match self.lowering {
            PooledLowering::Direct => direct_forward(input, kernel, bias, relu, f, g, window),
            PooledLowering::Winograd(t) => {
                winograd::conv2d_max_pool(t, input, kernel, (bias, relu), f, g, window)
            }
        }
    }

    /// The wanted gradients, from the pooled output's gradient.
    pub(crate) fn backward(
        &self,
        input: &[f32],
        kernel: &[f32],
        grad: PooledGrad<'_>,
        wanted: Wanted,
    ) -> Grads {
        let (g, f, window) = (&self.g, self.filters, self.window);
        match self.lowering {
            PooledLowering::Direct => {
                let (kernel, bias) = direct_backward(input, grad, f, g, window);
                Grads {
                    input: None,
                    kernel: wanted.kernel.then_some(kernel),
                    bias: wanted.bias.then_some(bias),
                }
            }
            PooledLowering::Winograd(t) => {
                let grad = winograd::OutputGradient::Pooled(grad, window);
                winograd::backward(t, input, kernel, grad, f, g, wanted)
            }
        }
    }
}

/// The sizes of one fused layer.
#[derive(Debug, Clone, Copy)]
struct Layout {
    g: Geometry,
    window: PoolWindow,
    filters: usize,
    pooled_h: usize,
    pooled_w: usize,
}

impl Layout {
    fn new(g: &Geometry, window: PoolWindow, filters: usize) -> Self {
        Self {
            g: *g,
            window,
            filters,
            pooled_h: g.out_h / window.h,
            pooled_w: g.out_w / window.w,
        }
    }

    fn pooled_pixels(&self) -> usize {
        self.pooled_h * self.pooled_w
    }

    /// Window positions rounded up to whole groups; the extra rows of a patch are zero.
    fn rows(&self) -> usize {
        self.window.positions().div_ceil(GROUP) * GROUP
    }

    /// Input values under one kernel row: contiguous in NHWC.
    fn run(&self) -> usize {
        self.g.kernel_w * self.g.channels
    }

    fn image_in(&self) -> usize {
        self.g.height * self.g.width * self.g.channels
    }

    fn image_out(&self) -> usize {
        self.pooled_pixels() * self.filters
    }

    /// `values [rows][filters]` as `[blocks][rows][BLOCK]`, filters padded with zeros.
    fn blocked(&self, values: &[f32]) -> Vec<f32> {
        let rows = values.len() / self.filters;
        let blocks = self.filters.div_ceil(BLOCK);
        let mut out = vec![0.0; blocks * rows * BLOCK];
        for (block, out) in out.chunks_exact_mut(rows * BLOCK).enumerate() {
            let f0 = block * BLOCK;
            let width = (self.filters - f0).min(BLOCK);
            for (to, from) in out
                .chunks_exact_mut(BLOCK)
                .zip(values.chunks_exact(self.filters))
            {
                to[..width].copy_from_slice(&from[f0..f0 + width]);
            }
        }
        out
    }

    /// The inverse of [`Self::blocked`].
    fn unblocked(&self, blocked: &[f32]) -> Vec<f32> {
        let blocks = self.filters.div_ceil(BLOCK);
        let rows = blocked.len() / (blocks * BLOCK);
        let mut out = vec![0.0; rows * self.filters];
        for (block, from) in blocked.chunks_exact(rows * BLOCK).enumerate() {
            let f0 = block * BLOCK;
            let width = (self.filters - f0).min(BLOCK);
            for (to, from) in out
                .chunks_exact_mut(self.filters)
                .zip(from.chunks_exact(BLOCK))
            {
                to[f0..f0 + width].copy_from_slice(&from[..width]);
            }
        }
        out
    }

    /// The image offset of the first input that pooling window (`py`, `px`) reads, when every
    /// input it reads is inside the image.
    fn first_input_inside(&self, py: usize, px: usize) -> Option<usize> {
        let (g, window) = (&self.g, self.window);
        // The first input row (column) window index `p` reads along one axis, if all it reads
        // along that axis is inside the input.
        let span = |p: usize, size: usize, stride: usize, pad: usize, kernel: usize, input| {
            let first = (p * size * stride).checked_sub(pad)?;
            let end = ((p + 1) * size - 1) * stride + kernel - pad;
            (end <= input).then_some(first)
        };
        let y = span(py, window.h, g.stride_h, g.pad_top, g.kernel_h, g.height)?;
        let x = span(px, window.w, g.stride_w, g.pad_left, g.kernel_w, g.width)?;
        Some((y * g.width + x) * g.channels)
    }

    /// The im2col rows of the convolution outputs in pooling window (`py`, `px`) of `image`,
    /// one per window position (row-major), into `patch [rows][g.patch()]`; rows past the
    /// window's positions are left as they are (zero).
    fn gather_window(&self, image: &[f32], (py, px): (usize, usize), patch: &mut [f32]) {
        let (g, c) = (&self.g, self.g.channels);
        let rows = patch.chunks_exact_mut(g.patch());
        for (position, row) in rows.take(self.window.positions()).enumerate() {
            let oy = py * self.window.h + position / self.window.w;
            let ox = px * self.window.w + position % self.window.w;
            for ky in 0..g.kernel_h {
                for kx in 0..g.kernel_w {
                    let at = (ky * g.kernel_w + kx) * c;
                    match g.source(oy, ox, ky, kx) {
                        Some((y, x)) => {
                            let from = (y * g.width + x) * c;
                            row[at..at + c].copy_from_slice(&image[from..from + c]);
                        }
                        None => row[at..at + c].fill(0.0),
                    }
                }
            }
        }
    }
}

/// One pooling window's im2col rows, `[rows][patch]`: position `i`'s inputs at
/// `i · patch..(i + 1) · patch`, zeros for the padding and for the positions past the window
/// (those rows are never written).
#[derive(Debug)]
struct WindowPatch {
    values: Vec<f32>,
    /// Offsets in the image of each window position's first input from the window's.
    position_offsets: Vec<usize>,
}

impl WindowPatch {
    fn new(l: &Layout) -> Self {
        let (g, w) = (&l.g, l.window.w);
        let position_offsets = (0..l.window.positions())
            .map(|p| ((p / w) * g.stride_h * g.width + (p % w) * g.stride_w) * g.channels)
            .collect();
        Self {
            values: vec![0.0; l.rows() * g.patch()],
            position_offsets,
        }
    }

    /// Fills the patch for window (`py`, `px`) of `image`.
    #[inline(always)]
    fn fill(&mut self, l: &Layout, image: &[f32], (py, px): (usize, usize)) {
        let Some(first) = l.first_input_inside(py, px) else {
            l.gather_window(image, (py, px), &mut self.values);
            return;
        };
        // Each kernel row's inputs are a contiguous run of the image.
        let (run, line) = (l.run(), l.g.width * l.g.channels);
        let rows = self.values.chunks_exact_mut(l.g.patch());
        for (row, offset) in rows.zip(&self.position_offsets) {
            let base = first + offset;
            for (ky, dst) in row.chunks_exact_mut(run).enumerate() {
                let from = base + ky * line;
                copy_run(dst, &image[from..from + run]);
            }
        }
    }

    /// The first `taps` values of the rows of positions `group · GROUP..`, one per position of
    /// the group: given the length of a block's kernel rows, indexing both by tap needs no
    /// checks.
    #[inline(always)]
    fn group(&self, group: usize, taps: usize) -> [&[f32]; GROUP] {
        let row = |i: usize| {
            let from = (group * GROUP + i) * taps;
            &self.values[from..from + taps]
        };
        [row(0), row(1), row(2), row(3)]
    }
}

/// `dst.copy_from_slice(src)` for the few values under one kernel row, with the common lengths
/// (3×3 or 5×5 kernels over one or three channels) as fixed-size copies: a copy of a length
/// the compiler does not know is a `memcpy` call, dearer than these few moves.
#[inline(always)]
fn copy_run(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) -> bool {
        match (<&mut [f32; N]>::try_from(dst), <&[f32; N]>::try_from(src)) {
            (Ok(dst), Ok(src)) => {
                *dst = *src;
                true
            }
            _ => false,
        }
    }
    let copied = fixed::<3>(dst, src)
        || fixed::<1>(dst, src)
        || fixed::<5>(dst, src)
        || fixed::<9>(dst, src)
        || fixed::<15>(dst, src);
    if !copied {
        dst.copy_from_slice(src);
    }
}

/// One full vector of a block row.
#[inline(always)]
fn lanes_at(row: &[f32], f0: usize) -> Lanes {
    let full: &[f32; LANES] = row[f0..f0 + LANES]
        .try_into()
        .unwrap_or_else(|_| unreachable!("block rows hold whole vectors"));
    Lanes::from(*full)
}

/// A block row's two vectors.
#[inline(always)]
fn block_lanes(row: &[f32]) -> [Lanes; 2] {
    [lanes_at(row, 0), lanes_at(row, LANES)]
}

/// The filter ranges of block `block`'s two vectors that exist (`None` past the last filter).
fn vector_ranges(block: usize, filters: usize) -> [Option<std::ops::Range<usize>>; 2] {
    let range = |v: usize| {
        let from = block * BLOCK + v * LANES;
        (from < filters).then(|| from..(from + LANES).min(filters))
    };
    [range(0), range(1)]
}

/// `max_pool(relu?(conv2d(input, kernel) + bias))` over non-overlapping `window`s:
/// `(pooled [batch, out_h / window.h, out_w / window.w, filters], argmax)`, where `argmax[i]`
/// is the window position (row-major) pooled value `i` came from.
fn direct_forward(
    input: &[f32],
    kernel: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
) -> (Vec<f32>, Vec<u8>) {
    let l = Layout::new(g, window, filters);
    let kernel = l.blocked(kernel);
    let bias = bias.map_or_else(|| l.blocked(&vec![0.0; filters]), |b| l.blocked(b));
    let mut pooled = vec![0.0_f32; g.batch * l.image_out()];
    let mut argmax = vec![NO_POSITION; g.batch * l.image_out()];
    if l.image_out() == 0 {
        return (pooled, argmax);
    }
    pooled
        .par_chunks_mut(l.image_out())
        .zip(argmax.par_chunks_mut(l.image_out()))
        .enumerate()
        .for_each(|(b, (pooled, argmax))| {
            let image = &input[b * l.image_in()..(b + 1) * l.image_in()];
            forward_image(&l, image, (&kernel, &bias), relu, (pooled, argmax));
        });
    (pooled, argmax)
}

/// One image's pooled values and argmax.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn forward_image(
    l: &Layout,
    image: &[f32],
    (kernel, bias): (&[f32], &[f32]),
    relu: bool,
    (pooled, argmax): (&mut [f32], &mut [u8]),
) {
    let filters = l.filters;
    let mut patch = WindowPatch::new(l);
    for pixel in 0..l.pooled_pixels() {
        patch.fill(l, image, (pixel / l.pooled_w, pixel % l.pooled_w));
        let at = pixel * filters;
        pool_window(
            l,
            &patch,
            (kernel, bias),
            relu,
            (&mut pooled[at..at + filters], &mut argmax[at..at + filters]),
        );
    }
}

/// One pooling window's pooled values and argmax, a block of filters at a time.
#[inline(always)]
fn pool_window(
    l: &Layout,
    patch: &WindowPatch,
    (kernel, bias): (&[f32], &[f32]),
    relu: bool,
    (pooled, argmax): (&mut [f32], &mut [u8]),
) {
    let taps = l.g.patch();
    let blocks = kernel
        .chunks_exact(taps * BLOCK)
        .zip(bias.chunks_exact(BLOCK));
    for (block, (kernel, bias)) in blocks.enumerate() {
        let kernel = kernel.as_chunks::<BLOCK>().0;
        let bias = block_lanes(bias);
        let mut best = [Lanes::splat(f32::NEG_INFINITY); 2];
        let mut arg = [Lanes::splat(f32::from(NO_POSITION)); 2];
        for group in 0..l.rows() / GROUP {
            let acc = group_outputs(patch, kernel, bias, group);
            let positions = l.window.positions().saturating_sub(group * GROUP);
            for (i, acc) in acc.iter().take(positions).enumerate() {
                let position = Lanes::splat((group * GROUP + i) as f32);
                for ((&value, best), arg) in acc.iter().zip(&mut best).zip(&mut arg) {
                    (*best, *arg) = take_max(value, relu, (*best, *arg), position);
                }
            }
        }
        for ((range, best), arg) in vector_ranges(block, l.filters)
            .into_iter()
            .zip(best)
            .zip(arg)
        {
            let Some(range) = range else { break };
            store_pooled(
                (&mut pooled[range.clone()], &mut argmax[range]),
                (best, arg),
            );
        }
    }
}

/// The convolution outputs of window positions `group · GROUP..` for one block of filters:
/// `bias` plus the kernel's taps times the patch's values, tap by tap.
#[inline(always)]
fn group_outputs(
    patch: &WindowPatch,
    kernel: &[[f32; BLOCK]],
    bias: [Lanes; 2],
    group: usize,
) -> [[Lanes; 2]; GROUP] {
    let [x0, x1, x2, x3] = patch.group(group, kernel.len());
    let mut acc = [bias; GROUP];
    for (t, k) in kernel.iter().enumerate() {
        let k = block_lanes(k);
        for (acc, x) in acc.iter_mut().zip([x0[t], x1[t], x2[t], x3[t]]) {
            let x = Lanes::splat(x);
            *acc = [k[0].mul_add(x, acc[0]), k[1].mul_add(x, acc[1])];
        }
    }
    acc
}

/// What the normalised forward pass ([`direct_forward_normalized`]) returns: the pooled
/// values, their argmax, and the normalised value `x̂` each pooled value came from.
pub(crate) struct NormalizedPooled {
    pub(crate) pooled: Vec<f32>,
    pub(crate) argmax: Vec<u8>,
    pub(crate) selected: Vec<f32>,
}

/// Batch normalization's training pass folded into the direct method:
/// `max_pool(relu?(x̂ · gamma + beta))` where `x̂ = conv2d(input, kernel) + bias` is the
/// normalised convolution (the caller folds the batch statistics into `kernel` and `bias`),
/// with the `x̂` each pooled value came from (zero where a window took none), for the
/// backward pass's `Σdy · x̂`. As [`direct_forward`] otherwise.
#[allow(
    clippy::too_many_arguments,
    reason = "the convolution's three operands, the affine map's two and the pooling's two, as the layers take them"
)]
pub(crate) fn direct_forward_normalized(
    input: &[f32],
    (kernel, bias): (&[f32], &[f32]),
    (gamma, beta): (&[f32], &[f32]),
    relu: bool,
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
) -> NormalizedPooled {
    let l = Layout::new(g, window, filters);
    let (kernel, bias) = (l.blocked(kernel), l.blocked(bias));
    let (gamma, beta) = (l.blocked(gamma), l.blocked(beta));
    let len = g.batch * l.image_out();
    let mut out = NormalizedPooled {
        pooled: vec![0.0; len],
        argmax: vec![NO_POSITION; len],
        selected: vec![0.0; len],
    };
    if l.image_out() == 0 {
        return out;
    }
    out.pooled
        .par_chunks_mut(l.image_out())
        .zip(out.argmax.par_chunks_mut(l.image_out()))
        .zip(out.selected.par_chunks_mut(l.image_out()))
        .enumerate()
        .for_each(|(b, ((pooled, argmax), selected))| {
            let image = &input[b * l.image_in()..(b + 1) * l.image_in()];
            let affine = [&kernel[..], &bias, &gamma, &beta];
            forward_image_normalized(&l, image, affine, relu, (pooled, argmax, selected));
        });
    out
}

/// One image of [`direct_forward_normalized`].
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn forward_image_normalized(
    l: &Layout,
    image: &[f32],
    affine: [&[f32]; 4],
    relu: bool,
    (pooled, argmax, selected): (&mut [f32], &mut [u8], &mut [f32]),
) {
    let filters = l.filters;
    let mut patch = WindowPatch::new(l);
    for pixel in 0..l.pooled_pixels() {
        patch.fill(l, image, (pixel / l.pooled_w, pixel % l.pooled_w));
        let range = pixel * filters..(pixel + 1) * filters;
        pool_window_normalized(
            l,
            &patch,
            affine,
            relu,
            (
                &mut pooled[range.clone()],
                &mut argmax[range.clone()],
                &mut selected[range],
            ),
        );
    }
}

/// One pooling window of [`direct_forward_normalized`], a block of filters at a time.
#[inline(always)]
fn pool_window_normalized(
    l: &Layout,
    patch: &WindowPatch,
    [kernel, bias, gamma, beta]: [&[f32]; 4],
    relu: bool,
    (pooled, argmax, selected): (&mut [f32], &mut [u8], &mut [f32]),
) {
    let taps = l.g.patch();
    let blocks = kernel
        .chunks_exact(taps * BLOCK)
        .zip(bias.chunks_exact(BLOCK))
        .zip(gamma.chunks_exact(BLOCK).zip(beta.chunks_exact(BLOCK)));
    for (block, ((kernel, bias), (gamma, beta))) in blocks.enumerate() {
        let kernel = kernel.as_chunks::<BLOCK>().0;
        let (bias, gamma, beta) = (block_lanes(bias), block_lanes(gamma), block_lanes(beta));
        let mut best = [Lanes::splat(f32::NEG_INFINITY); 2];
        let mut arg = [Lanes::splat(f32::from(NO_POSITION)); 2];
        let mut chosen = [Lanes::zero(); 2];
        for group in 0..l.rows() / GROUP {
            let normalized = group_outputs(patch, kernel, bias, group);
            let positions = l.window.positions().saturating_sub(group * GROUP);
            for (i, normalized) in normalized.iter().take(positions).enumerate() {
                let position = Lanes::splat((group * GROUP + i) as f32);
                for v in 0..2 {
                    let value = normalized[v].mul_add(gamma[v], beta[v]);
                    let (max, at) = take_max(value, relu, (best[v], arg[v]), position);
                    // Each position is taken at most once, so a new argmax marks a take.
                    chosen[v] = at.simd_eq(position).bitselect(normalized[v], chosen[v]);
                    (best[v], arg[v]) = (max, at);
                }
            }
        }
        for (v, range) in vector_ranges(block, l.filters).into_iter().enumerate() {
            let Some(range) = range else { break };
            store(&mut selected[range.clone()], chosen[v]);
            store_pooled(
                (&mut pooled[range.clone()], &mut argmax[range]),
                (best[v], arg[v]),
            );
        }
    }
}

/// The gradients of [`direct_forward`] with respect to the kernel
/// (`[kernel_h, kernel_w, channels, filters]`) and the bias (`[filters]`).
pub(crate) fn direct_backward(
    input: &[f32],
    grad: PooledGrad<'_>,
    filters: usize,
    g: &Geometry,
    window: PoolWindow,
) -> (Vec<f32>, Vec<f32>) {
    let l = Layout::new(g, window, filters);
    let blocks = filters.div_ceil(BLOCK);
    let parts = BACKWARD_PARTS.min(g.batch).max(1);
    let sums: Vec<(Vec<f32>, Vec<f32>)> = (0..parts)
        .into_par_iter()
        .map(|part| {
            let mut kernel = vec![0.0_f32; blocks * g.patch() * BLOCK];
            let mut bias = vec![0.0_f32; blocks * BLOCK];
            let images = part * g.batch / parts..(part + 1) * g.batch / parts;
            backward_images(&l, input, grad, images, (&mut kernel, &mut bias));
            (kernel, bias)
        })
        .collect();
    let kernels: Vec<&[f32]> = sums.iter().map(|(kernel, _)| &kernel[..]).collect();
    let biases: Vec<&[f32]> = sums.iter().map(|(_, bias)| &bias[..]).collect();
    let kernel = sum_in_order(&kernels, blocks * g.patch() * BLOCK);
    let bias = sum_in_order(&biases, blocks * BLOCK);
    (l.unblocked(&kernel), l.unblocked(&bias))
}

/// Adds the contributions of `images` to the blocked kernel and bias gradients.
#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn backward_images<'g>(
    l: &Layout,
    input: &[f32],
    grad: PooledGrad<'g>,
    images: std::ops::Range<usize>,
    (kernel, bias): (&mut [f32], &mut [f32]),
) {
    let mut patch = WindowPatch::new(l);
    for b in images {
        let image = &input[b * l.image_in()..(b + 1) * l.image_in()];
        for pixel in 0..l.pooled_pixels() {
            patch.fill(l, image, (pixel / l.pooled_w, pixel % l.pooled_w));
            let at = b * l.image_out() + pixel * l.filters;
            window_grad(l, &patch, grad, at, (&mut *kernel, &mut *bias));
        }
    }
}

/// Adds one pooling window's contribution (pooled values `at..at + filters`) to the blocked
/// kernel and bias gradients.
#[inline(always)]
fn window_grad(
    l: &Layout,
    patch: &WindowPatch,
    grad: PooledGrad<'_>,
    at: usize,
    (kernel, bias): (&mut [f32], &mut [f32]),
) {
    let taps = l.g.patch();
    let blocks = kernel
        .chunks_exact_mut(taps * BLOCK)
        .zip(bias.chunks_exact_mut(BLOCK));
    for (block, (kernel, bias)) in blocks.enumerate() {
        let kernel = kernel.as_chunks_mut::<BLOCK>().0;
        let mut d = [Lanes::zero(); 2];
        let mut arg = [Lanes::splat(f32::from(NO_POSITION)); 2];
        for (v, range) in vector_ranges(block, l.filters).into_iter().enumerate() {
            let Some(range) = range else { break };
            (d[v], arg[v]) = pooled_grad(grad, at + range.start..at + range.end);
        }
        let sum = block_lanes(bias);
        store(&mut bias[..LANES], sum[0] + d[0]);
        store(&mut bias[LANES..], sum[1] + d[1]);
        for group in 0..l.rows() / GROUP {
            let mut dy = [[Lanes::zero(); 2]; GROUP];
            for (i, dy) in dy.iter_mut().enumerate() {
                let position = Lanes::splat((group * GROUP + i) as f32);
                *dy = [
                    d[0] & arg[0].simd_eq(position),
                    d[1] & arg[1].simd_eq(position),
                ];
            }
            let [x0, x1, x2, x3] = patch.group(group, kernel.len());
            for (t, k) in kernel.iter_mut().enumerate() {
                let mut sum = block_lanes(k);
                for (dy, x) in dy.iter().zip([x0[t], x1[t], x2[t], x3[t]]) {
                    let x = Lanes::splat(x);
                    sum = [dy[0].mul_add(x, sum[0]), dy[1].mul_add(x, sum[1])];
                }
                store(&mut k[..LANES], sum[0]);
                store(&mut k[LANES..], sum[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conv::{im2col_conv2d, im2col_conv2d_input_grad, im2col_conv2d_kernel_grad};
    use super::super::elementwise::{relu_in_place, zip};
    use super::super::pool::{max_pool, max_pool_grad};
    use super::super::reduce::sum_rows;
    use super::*;

    fn geometry(
        (batch, height, width, channels): (usize, usize, usize, usize),
        (kernel_h, kernel_w): (usize, usize),
        (stride, pad): (usize, usize),
    ) -> Geometry {
        let out = |size: usize, k: usize| (size + 2 * pad - k) / stride + 1;
        Geometry {
            batch,
            height,
            width,
            channels,
            kernel_h,
            kernel_w,
            stride_h: stride,
            stride_w: stride,
            pad_top: pad,
            pad_left: pad,
            out_h: out(height, kernel_h),
            out_w: out(width, kernel_w),
        }
    }

    fn pool_geometry(g: &Geometry, filters: usize, window: PoolWindow) -> Geometry {
        Geometry {
            batch: g.batch,
            height: g.out_h,
            width: g.out_w,
            channels: filters,
            kernel_h: window.h,
            kernel_w: window.w,
            stride_h: window.h,
            stride_w: window.w,
            pad_top: 0,
            pad_left: 0,
            out_h: g.out_h / window.h,
            out_w: g.out_w / window.w,
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
            .collect()
    }

    /// The same layer by the separate kernels: forward values, and kernel and bias gradients.
    fn separately(
        input: &[f32],
        kernel: &[f32],
        bias: &[f32],
        relu: bool,
        (filters, g, window): (usize, &Geometry, PoolWindow),
        d_pooled: &[f32],
    ) -> (Vec<f32>, Grads) {
        let (mut out, cols) = im2col_conv2d(input, kernel, Some(bias), filters, g).unwrap();
        if relu {
            relu_in_place(&mut out);
        }
        let pg = pool_geometry(g, filters, window);
        let (pooled, argmax) = max_pool(&out, &pg);
        let d_out = max_pool_grad(d_pooled, &argmax, &pg);
        let d_out = if relu {
            zip(&d_out, &out, |d, y| if y > 0.0 { d } else { 0.0 })
        } else {
            d_out
        };
        let grads = Grads {
            input: Some(im2col_conv2d_input_grad(kernel, &d_out, filters, g).unwrap()),
            kernel: Some(im2col_conv2d_kernel_grad(&cols, &d_out, filters, g).unwrap()),
            bias: Some(sum_rows(&d_out, filters)),
        };
        (pooled, grads)
    }

    fn assert_close(what: &str, fused: &[f32], separate: &[f32]) {
        assert_eq!(fused.len(), separate.len(), "{what}: lengths");
        let scale = separate.iter().fold(1.0_f32, |m, v| m.max(v.abs()));
        for (i, (f, s)) in fused.iter().zip(separate).enumerate() {
            assert!(
                (f - s).abs() <= 1e-5 * scale,
                "{what}[{i}]: fused {f} vs separate {s}"
            );
        }
    }

    const ALL: Wanted = Wanted {
        input: true,
        kernel: true,
        bias: true,
    };

    #[test]
    fn fused_layers_equal_convolution_relu_and_pooling_done_apart() {
        let direct = PooledLowering::Direct;
        let cases = [
            // The tutorial CNN's first layer, on a small batch.
            ((3, 28, 28, 1), (3, 3), (1, 0), 32, (2, 2), direct),
            // Colour input, a filter count that is not whole vectors, odd sizes.
            ((2, 9, 11, 3), (3, 3), (1, 0), 13, (2, 2), direct),
            // Same padding, stride 2, a 3×3 window (three groups of positions, one partial).
            ((2, 10, 10, 2), (3, 3), (2, 1), 8, (3, 3), direct),
            // Same padding with 2×2 windows: border windows gathered with zeros.
            ((2, 8, 9, 2), (3, 3), (1, 1), 8, (2, 2), direct),
            // A 5×5 kernel, a one-position window, fewer filters than a vector.
            ((9, 7, 8, 1), (5, 5), (1, 2), 3, (1, 1), direct),
            // Wide windows that leave outputs unpooled on the right.
            ((1, 6, 14, 1), (2, 2), (1, 0), 16, (1, 4), direct),
            // The tutorial CNN's second layer: F(4×4) tiles, the last tile row and column
            // partly outside the 11×11 output and its last row and column left unpooled.
            (
                (3, 13, 13, 8),
                (3, 3),
                (1, 0),
                12,
                (2, 2),
                PooledLowering::Winograd(Tiling::F4),
            ),
            // F(2×2) tiles, each one pooling window; same padding.
            (
                (2, 6, 5, 9),
                (3, 3),
                (1, 1),
                10,
                (2, 2),
                PooledLowering::Winograd(Tiling::F2),
            ),
            // Windows of one row, two per F(4×4) tile row... and whole 4×4 windows.
            (
                (2, 14, 14, 8),
                (3, 3),
                (1, 0),
                8,
                (1, 2),
                PooledLowering::Winograd(Tiling::F4),
            ),
            (
                (2, 14, 14, 8),
                (3, 3),
                (1, 0),
                8,
                (4, 4),
                PooledLowering::Winograd(Tiling::F4),
            ),
        ];
        for (shape, kernel_size, stride_pad, filters, (h, w), lowering) in cases {
            let g = geometry(shape, kernel_size, stride_pad);
            let window = PoolWindow { h, w };
            let wants_input = lowering != direct;
            let layer = PooledConv::new(&g, filters, window, wants_input)
                .unwrap_or_else(|| panic!("no fused lowering for {g:?}"));
            assert_eq!(layer.lowering, lowering, "{g:?}");
            let input = values(g.batch * g.height * g.width * g.channels, 1);
            let kernel = values(g.patch() * filters, 2);
            let bias = values(filters, 3);
            let l = Layout::new(&g, window, filters);
            let d_pooled = values(g.batch * l.image_out(), 4);
            for relu in [false, true] {
                let what = format!("relu {relu} {g:?} {window:?}");
                let (pooled, argmax) = layer.forward(&input, &kernel, Some(&bias), relu);
                let grad = PooledGrad {
                    values: &d_pooled,
                    relu_output: relu.then_some(&pooled[..]),
                    argmax: &argmax,
                };
                let wanted = Wanted {
                    input: wants_input,
                    ..ALL
                };
                let grads = layer.backward(&input, &kernel, grad, wanted);
                let (want, want_grads) = separately(
                    &input,
                    &kernel,
                    &bias,
                    relu,
                    (filters, &g, window),
                    &d_pooled,
                );
                assert_close(&format!("{what} pooled"), &pooled, &want);
                for (name, got, want) in [
                    ("kernel", grads.kernel, want_grads.kernel),
                    ("bias", grads.bias, want_grads.bias),
                    (
                        "input",
                        grads.input,
                        want_grads.input.filter(|_| wants_input),
                    ),
                ] {
                    assert_eq!(got.is_some(), want.is_some(), "{what} {name} gradient");
                    if let (Some(got), Some(want)) = (got, want) {
                        assert_close(&format!("{what} {name} gradient"), &got, &want);
                    }
                }
            }
        }
    }

    #[test]
    fn layers_that_suit_neither_method_are_not_fused() {
        let window = PoolWindow { h: 2, w: 2 };
        // Many kernel values per output, but not Winograd's 3×3 stride 1.
        let g = geometry((1, 9, 9, 8), (3, 3), (2, 0));
        assert!(PooledConv::new(&g, 8, window, false).is_none());
        // Winograd, but F(4×4) tiles cannot hold 3×3 windows.
        let g = geometry((1, 14, 14, 8), (3, 3), (1, 0));
        assert!(PooledConv::new(&g, 8, PoolWindow { h: 3, w: 3 }, false).is_none());
        // Few kernel values, but the input wants a gradient the direct method does not give.
        let g = geometry((1, 28, 28, 1), (3, 3), (1, 0));
        assert!(PooledConv::new(&g, 8, window, true).is_none());
        // A window larger than the output.
        assert!(PooledConv::new(&g, 8, PoolWindow { h: 27, w: 1 }, false).is_none());
    }

    #[test]
    fn a_window_of_negative_infinities_routes_no_gradient() {
        let g = geometry((1, 2, 2, 1), (1, 1), (1, 0));
        let window = PoolWindow { h: 2, w: 2 };
        let input = [1.0, 2.0, 3.0, 4.0];
        let bias = [f32::NEG_INFINITY];
        let layer = PooledConv::new(&g, 1, window, false).unwrap_or_else(|| panic!("fused"));
        let (pooled, argmax) = layer.forward(&input, &[1.0], Some(&bias), false);
        assert_eq!(
            (pooled, argmax.clone()),
            (vec![f32::NEG_INFINITY], vec![NO_POSITION])
        );
        let grad = PooledGrad {
            values: &[1.0],
            relu_output: None,
            argmax: &argmax,
        };
        let grads = layer.backward(&input, &[1.0], grad, ALL);
        assert_eq!(grads.kernel, Some(vec![0.0]));
        assert_eq!(grads.bias, Some(vec![0.0]));
    }

    #[test]
    fn results_are_bit_identical_on_one_and_two_threads() {
        let window = PoolWindow { h: 2, w: 2 };
        for (shape, filters) in [((11, 28, 28, 1), 32), ((11, 13, 13, 16), 24)] {
            let g = geometry(shape, (3, 3), (1, 0));
            let layer = PooledConv::new(&g, filters, window, g.channels > 1)
                .unwrap_or_else(|| panic!("fused"));
            let input = values(g.batch * g.height * g.width * g.channels, 5);
            let kernel = values(g.patch() * filters, 6);
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap_or_else(|e| panic!("thread pool: {e}"));
                pool.install(|| {
                    let (pooled, argmax) = layer.forward(&input, &kernel, None, true);
                    let grad = PooledGrad {
                        values: &pooled,
                        relu_output: Some(&pooled),
                        argmax: &argmax,
                    };
                    let grads = layer.backward(&input, &kernel, grad, ALL);
                    (pooled, argmax, grads.input, grads.kernel, grads.bias)
                })
            };
            assert_eq!(run(1), run(2), "{g:?}");
        }
    }
}
