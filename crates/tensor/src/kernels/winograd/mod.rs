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

mod forward;
mod gradient;
mod scratch;
mod tiles;
mod transform;

pub(crate) use gradient::OutputGradient;

use forward::{Epilogue, conv2d_with, pooled_with};
use gradient::backward_parts;
use scratch::keep_sums;
use transform::{
    Coefficients, FILTER_F2, FILTER_F4, TransformF2, TransformF4, transform_kernel,
    untransform_kernel_grad,
};

use super::geometry::{Geometry, Grads, PoolWindow, Wanted};
use super::reduce::sum_in_order;

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

#[cfg(test)]
mod tests;
