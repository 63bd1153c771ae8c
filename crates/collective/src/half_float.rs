//! The 16-bit floats compressed gradients travel in: `f32` values rounded to bf16 or f16 and
//! widened back, with the rounding error carried into the next step where asked (error
//! feedback). Each type's loops are compiled here, optimised, whatever the caller's build.

use half::{bf16, f16};

use crate::Element;

/// bf16 or f16: what [`Compression`](crate::Compression) sends a gradient as.
pub trait HalfFloat: Element {
    /// `values` divided by `divisor` and rounded. With residuals (`residual` as long as
    /// `values`; empty: none kept), each value's residual is added first and what the rounding
    /// dropped, in the values' units, becomes its new residual; a value past the type's range
    /// goes as infinity and its residual starts again at zero rather than stay infinite or NaN.
    fn round_from(values: &[f32], divisor: f32, residual: &mut [f32]) -> Vec<Self>;

    /// `values[i] = wire[i] × divisor`, for each `i` of the shorter of the two.
    fn widen_into(wire: &[Self], divisor: f32, values: &mut [f32]);
}

macro_rules! half_float {
    ($($t:ty),*) => {$(
        impl HalfFloat for $t {
            fn round_from(values: &[f32], divisor: f32, residual: &mut [f32]) -> Vec<Self> {
                if residual.len() != values.len() {
                    return values.iter().map(|&v| <$t>::from_f32(v / divisor)).collect();
                }
                values
                    .iter()
                    .zip(residual)
                    .map(|(&v, r)| {
                        let carried = v + *r;
                        let sent = <$t>::from_f32(carried / divisor);
                        let back = sent.to_f32() * divisor;
                        *r = if back.is_finite() { carried - back } else { 0.0 };
                        sent
                    })
                    .collect()
            }

            fn widen_into(wire: &[Self], divisor: f32, values: &mut [f32]) {
                for (v, w) in values.iter_mut().zip(wire) {
                    *v = w.to_f32() * divisor;
                }
            }
        }
    )*};
}
half_float!(bf16, f16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_residuals_what_is_sent_over_many_steps_sums_to_what_was_computed() {
        // A gradient bf16 cannot hold (its values near 1 are 2^-7 apart: it rounds to 1),
        // sent 1000 times.
        let gradient = 1.001_f32;
        let (mut sent_plain, mut sent_carried) = (0.0_f64, 0.0_f64);
        let mut residual = [0.0_f32];
        for _ in 0..1000 {
            let plain = bf16::round_from(&[gradient], 1.0, &mut []);
            sent_plain += f64::from(plain[0].to_f32());
            let carried = bf16::round_from(&[gradient], 1.0, &mut residual);
            sent_carried += f64::from(carried[0].to_f32());
        }
        let computed = 1000.0 * f64::from(gradient);
        // Without residuals every step drops the same 0.001: a whole unit over 1000 steps.
        assert!((sent_plain - computed).abs() > 0.9, "{sent_plain}");
        // With them, what is still owed is one step's rounding at most.
        assert!((sent_carried - computed).abs() < 0.01, "{sent_carried}");
        assert!((sent_carried + f64::from(residual[0]) - computed).abs() < 1e-3);
    }

    #[test]
    fn a_value_past_fp16_s_range_goes_as_infinity_and_its_residual_starts_again_at_zero() {
        let mut residual = [0.0_f32, 0.25];
        let sent = f16::round_from(&[1e6, 1.0], 1.0, &mut residual);
        assert!(sent[0].to_f32().is_infinite());
        assert_eq!(residual[0], 0.0);
        assert_eq!(sent[1].to_f32(), 1.25);
    }

    #[test]
    fn values_are_divided_before_rounding_and_multiplied_after_widening() {
        let sent = f16::round_from(&[3.0, -6.0], 2.0, &mut []);
        assert_eq!([sent[0].to_f32(), sent[1].to_f32()], [1.5, -3.0]);
        let mut back = [0.0; 2];
        f16::widen_into(&sent, 2.0, &mut back);
        assert_eq!(back, [3.0, -6.0]);
    }
}
