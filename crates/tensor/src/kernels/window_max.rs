//! Max pooling with a one-byte argmax, eight channels at a time: the running maximum of a
//! window, storing it, and rebuilding a window's gradient from the pooled one. Shared by the
//! convolutions fused with the pooling after them (direct and Winograd).

use super::lanes::{LANES, Lanes, load, store};

/// The argmax of a window that took no value (all `-inf` without relu): routes no gradient.
pub(crate) const NO_POSITION: u8 = u8::MAX;

/// The running `(max, argmax)` of a window after `value` at `position`: the epilogue applied
/// first, as the separate layers apply it, and `>` keeping the first maximum as TensorFlow does.
#[inline(always)]
pub(crate) fn take_max(
    value: Lanes,
    relu: bool,
    (best, arg): (Lanes, Lanes),
    position: Lanes,
) -> (Lanes, Lanes) {
    if relu {
        // `max` with zero second turns NaN into 0, like `f32::max(NaN, 0.0)`: no NaN remains.
        let value = value.fast_max(Lanes::zero());
        let take = value.simd_gt(best);
        (best.fast_max(value), take.bitselect(position, arg))
    } else {
        // NaN propagates: the first NaN is taken and kept.
        let take = value.simd_gt(best) | (value.is_nan() & !best.is_nan());
        (take.bitselect(value, best), take.bitselect(position, arg))
    }
}

/// Writes one vector's pooled values and their argmax (window positions held as `f32`, as
/// [`take_max`] keeps them) for the first `pooled.len()` channels.
#[inline(always)]
pub(crate) fn store_pooled((pooled, argmax): (&mut [f32], &mut [u8]), (best, arg): (Lanes, Lanes)) {
    store(pooled, best);
    // Window positions are below `MAX_POSITIONS` (or `NO_POSITION`): the conversions are exact.
    for (slot, a) in argmax.iter_mut().zip(arg.small_whole_numbers()) {
        *slot = a as u8;
    }
}

/// The pooled layer's output gradient and what the forward pass kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PooledGrad<'a> {
    /// `dL/dpooled`, `[batch, pooled_h, pooled_w, filters]`.
    pub(crate) values: &'a [f32],
    /// The pooled output, when a relu preceded the pooling: the gradient passes where it is
    /// positive.
    pub(crate) relu_output: Option<&'a [f32]>,
    /// The forward pass's argmax.
    pub(crate) argmax: &'a [u8],
}

/// The gradient and argmax of pooled values `range` as vectors (zeros and [`NO_POSITION`] past
/// its end), the gradient masked where the window took no value or the relu was zero.
#[inline(always)]
pub(crate) fn pooled_grad(grad: PooledGrad<'_>, range: std::ops::Range<usize>) -> (Lanes, Lanes) {
    let mut arg = [f32::from(NO_POSITION); LANES];
    for (lane, &a) in arg.iter_mut().zip(&grad.argmax[range.clone()]) {
        *lane = f32::from(a);
    }
    let arg = Lanes::from(arg);
    let mut d = load(&grad.values[range.clone()]);
    d &= !arg.simd_eq(Lanes::splat(f32::from(NO_POSITION)));
    if let Some(out) = grad.relu_output {
        d &= load(&out[range]).simd_gt(Lanes::zero());
    }
    (d, arg)
}
