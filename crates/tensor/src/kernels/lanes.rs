//! Eight `f32` channels as one SIMD value (`wide::f32x8`: one AVX register where the build
//! targets AVX, two SSE registers otherwise), with loads and stores of partial vectors for a
//! channel count that is not a multiple of eight. Arrays of these stay in registers where
//! arrays of `[f32; 8]` were copied through memory.

use wide::f32x8;

/// Channels in one [`Lanes`].
pub(crate) const LANES: usize = 8;

/// [`LANES`] channels of one position.
pub(crate) type Lanes = f32x8;

#[inline]
pub(crate) fn add(a: Lanes, b: Lanes) -> Lanes {
    a + b
}

#[inline]
pub(crate) fn sub(a: Lanes, b: Lanes) -> Lanes {
    a - b
}

/// `a + c·b`.
#[inline]
pub(crate) fn add_scaled(a: Lanes, c: f32, b: Lanes) -> Lanes {
    b.mul_add(f32x8::splat(c), a)
}

/// `c·a`.
#[inline]
pub(crate) fn scale(c: f32, a: Lanes) -> Lanes {
    a * f32x8::splat(c)
}

/// Up to [`LANES`] values, zeros after them. A full vector has its own path: a copy of a
/// slice whose length the compiler does not know becomes a `memcpy` call.
#[inline]
pub(crate) fn load(src: &[f32]) -> Lanes {
    if let Ok(full) = <&[f32; LANES]>::try_from(src) {
        return f32x8::from(*full);
    }
    let mut lanes = [0.0; LANES];
    for (lane, &v) in lanes.iter_mut().zip(src) {
        *lane = v;
    }
    f32x8::from(lanes)
}

/// The first `dst.len()` (at most [`LANES`]) values, a full vector by its own path as in
/// [`load`]. The partial path is a function of its own that is never inlined: inlined, the
/// compiler merged both paths into one piecewise copy of `min(len, 8)` values (four stores and
/// three shuffles where a full vector needs one store).
#[inline]
pub(crate) fn store(dst: &mut [f32], lanes: Lanes) {
    match <&mut [f32; LANES]>::try_from(&mut *dst) {
        Ok(full) => *full = lanes.to_array(),
        Err(_) => store_partial(dst, lanes),
    }
}

#[cold]
#[inline(never)]
fn store_partial(dst: &mut [f32], lanes: Lanes) {
    for (d, v) in dst.iter_mut().zip(lanes.to_array()) {
        *d = v;
    }
}

/// `dst += lanes` for the first `dst.len()` (at most [`LANES`]) values.
#[inline]
pub(crate) fn add_into(dst: &mut [f32], lanes: Lanes) {
    let sum = add(load(dst), lanes);
    store(dst, sum);
}
