//! Eight `f32` channels as one value, with loads and stores of partial vectors for a channel
//! count that is not a multiple of eight.
//!
//! The type holds a 256-bit vector and does each operation as a loop over its lanes as
//! `[f32; 8]`, which the compiler turns into one instruction on the vector width of the
//! function it is inlined into:
//! one AVX register in a kernel compiled for AVX2 + FMA (see [`super`]), two SSE registers
//! elsewhere. Its results do not depend on that choice: [`Lanes::mul_add`] is `f32::mul_add`,
//! fused and rounded once on every machine (an FMA instruction where the function has it, a
//! software `fmaf` elsewhere), and every other operation is exact per lane. So the kernels
//! give the same bits whichever code the CPU runs.

use std::ops::{Add, BitAnd, BitAndAssign, BitOr, Mul, Not, Sub};

/// Channels in one [`Lanes`].
pub(crate) const LANES: usize = 8;

/// [`LANES`] channels of one position; also a lane mask (all bits set or clear per lane) as
/// the comparisons return it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes(Vector);

/// How the lanes are held: on x86-64 as the compiler's 256-bit vector type, so that arrays of
/// them stay vectors in registers (an `[f32; 8]` array is split into scalars and gathered back,
/// with spills, in the kernels that keep several of them); the operations still go lane by
/// lane through `[f32; 8]`, which the compiler folds back into vector instructions.
#[cfg(target_arch = "x86_64")]
type Vector = std::arch::x86_64::__m256;
#[cfg(not(target_arch = "x86_64"))]
type Vector = [f32; LANES];

/// The bits of a set mask lane.
const SET: u32 = u32::MAX;

#[allow(
    clippy::needless_range_loop,
    reason = "indexed loops over the fixed-size lanes: the form measured to become one vector instruction"
)]
impl Lanes {
    /// Every lane zero.
    #[inline(always)]
    pub(crate) fn zero() -> Self {
        Self::splat(0.0)
    }

    /// Every lane `v`.
    #[inline(always)]
    pub(crate) fn splat(v: f32) -> Self {
        Self::from([v; LANES])
    }

    /// The lanes in order.
    #[inline(always)]
    pub(crate) fn to_array(self) -> [f32; LANES] {
        bytemuck::cast(self.0)
    }

    #[inline(always)]
    fn zip(self, other: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        let (a, b) = (self.to_array(), other.to_array());
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = f(a[i], b[i]);
        }
        Self::from(out)
    }

    #[inline(always)]
    fn bits(self, other: Self, f: impl Fn(u32, u32) -> u32) -> Self {
        self.zip(other, |a, b| f32::from_bits(f(a.to_bits(), b.to_bits())))
    }

    #[inline(always)]
    fn mask(self, other: Self, f: impl Fn(f32, f32) -> bool) -> Self {
        self.zip(other, |a, b| f32::from_bits(if f(a, b) { SET } else { 0 }))
    }

    /// `self · m + a`, rounded once.
    #[inline(always)]
    pub(crate) fn mul_add(self, m: Self, a: Self) -> Self {
        let (x, m, a) = (self.to_array(), m.to_array(), a.to_array());
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = x[i].mul_add(m[i], a[i]);
        }
        Self::from(out)
    }

    /// `self` where it is greater than `other`, else `other` (NaN in either gives `other`),
    /// as x86's `maxps`.
    #[inline(always)]
    pub(crate) fn fast_max(self, other: Self) -> Self {
        self.zip(other, |a, b| if a > b { a } else { b })
    }

    /// The mask of lanes where `self > other`.
    #[inline(always)]
    pub(crate) fn simd_gt(self, other: Self) -> Self {
        self.mask(other, |a, b| a > b)
    }

    /// The mask of lanes where `self == other`.
    #[inline(always)]
    pub(crate) fn simd_eq(self, other: Self) -> Self {
        self.mask(other, |a, b| a == b)
    }

    /// The mask of NaN lanes.
    #[inline(always)]
    pub(crate) fn is_nan(self) -> Self {
        self.mask(self, |a, _| a.is_nan())
    }

    /// For a mask `self`: `if_set`'s bits where it is set, `if_clear`'s elsewhere.
    #[inline(always)]
    pub(crate) fn bitselect(self, if_set: Self, if_clear: Self) -> Self {
        (if_set & self) | (if_clear & !self)
    }

    /// Each lane as an integer, for lanes that hold whole numbers in `0..2²³` (window
    /// positions). Adding 2²³ puts such a number in the low bits of the mantissa, exactly; the
    /// float-to-integer cast (`as`) would saturate lane by lane, a compare and a conditional
    /// move each, where this is one vector add and one subtract.
    #[inline(always)]
    pub(crate) fn small_whole_numbers(self) -> [u32; LANES] {
        const TWO_23: f32 = 8_388_608.0;
        let x = self.to_array();
        let mut out = [0; LANES];
        for i in 0..LANES {
            out[i] = (x[i] + TWO_23).to_bits() - TWO_23.to_bits();
        }
        out
    }
}

impl From<[f32; LANES]> for Lanes {
    #[inline(always)]
    fn from(values: [f32; LANES]) -> Self {
        Self(bytemuck::cast(values))
    }
}

impl Add for Lanes {
    type Output = Self;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.zip(other, |a, b| a + b)
    }
}

impl Sub for Lanes {
    type Output = Self;
    #[inline(always)]
    fn sub(self, other: Self) -> Self {
        self.zip(other, |a, b| a - b)
    }
}

impl Mul for Lanes {
    type Output = Self;
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self.zip(other, |a, b| a * b)
    }
}

impl BitAnd for Lanes {
    type Output = Self;
    #[inline(always)]
    fn bitand(self, other: Self) -> Self {
        self.bits(other, |a, b| a & b)
    }
}

impl BitAndAssign for Lanes {
    #[inline(always)]
    fn bitand_assign(&mut self, other: Self) {
        *self = *self & other;
    }
}

impl BitOr for Lanes {
    type Output = Self;
    #[inline(always)]
    fn bitor(self, other: Self) -> Self {
        self.bits(other, |a, b| a | b)
    }
}

impl Not for Lanes {
    type Output = Self;
    #[inline(always)]
    fn not(self) -> Self {
        self.bits(self, |a, _| !a)
    }
}

#[inline(always)]
pub(crate) fn add(a: Lanes, b: Lanes) -> Lanes {
    a + b
}

#[inline(always)]
pub(crate) fn sub(a: Lanes, b: Lanes) -> Lanes {
    a - b
}

/// `a + c·b`.
#[inline(always)]
pub(crate) fn add_scaled(a: Lanes, c: f32, b: Lanes) -> Lanes {
    b.mul_add(Lanes::splat(c), a)
}

/// `c·a`.
#[inline(always)]
pub(crate) fn scale(c: f32, a: Lanes) -> Lanes {
    a * Lanes::splat(c)
}

/// Up to [`LANES`] values, zeros after them. A full vector has its own path: a copy of a
/// slice whose length the compiler does not know becomes a `memcpy` call.
#[inline(always)]
pub(crate) fn load(src: &[f32]) -> Lanes {
    if let Ok(full) = <&[f32; LANES]>::try_from(src) {
        return Lanes::from(*full);
    }
    let mut lanes = [0.0; LANES];
    for (lane, &v) in lanes.iter_mut().zip(src) {
        *lane = v;
    }
    Lanes::from(lanes)
}

/// The first `dst.len()` (at most [`LANES`]) values, a full vector by its own path as in
/// [`load`]. The partial path is a function of its own that is never inlined: inlined, the
/// compiler merged both paths into one piecewise copy of `min(len, 8)` values (four stores and
/// three shuffles where a full vector needs one store).
#[inline(always)]
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
#[inline(always)]
pub(crate) fn add_into(dst: &mut [f32], lanes: Lanes) {
    let sum = add(load(dst), lanes);
    store(dst, sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_whole_numbers_are_read_back_exactly() {
        let values: [f32; LANES] = [0.0, 1.0, 2.0, 7.0, 15.0, 254.0, 255.0, 8_388_607.0];
        let expected = values.map(|v| v as u32);
        assert_eq!(Lanes::from(values).small_whole_numbers(), expected);
    }
}
