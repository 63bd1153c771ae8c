//! The element types collectives move and reduce.

use half::{bf16, f16};

use crate::header::DType;

/// A value that collectives can send as raw bytes and combine with a [`ReduceOp`].
///
/// The sum and `Mean`'s division are methods over whole slices, implemented for each type here:
/// the collectives' algorithms are generic and so compiled in the crate that calls them,
/// perhaps unoptimised (a debug build's training step), while these loops, which touch every
/// value, are compiled here, optimised and vectorised.
pub trait Element: bytemuck::Pod + PartialOrd + Send + Sync + 'static {
    /// Its tag in message headers.
    const DTYPE: DType;
    /// `acc[i] += incoming[i]` for each `i` of the shorter of the two.
    fn add_into(acc: &mut [Self], incoming: &[Self]);
    /// `values[i] /= n` for each `i`, for `Mean`.
    fn div_count_into(values: &mut [Self], n: usize);
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn add_into(acc: &mut [Self], incoming: &[Self]) {
        for (a, &b) in acc.iter_mut().zip(incoming) {
            *a += b;
        }
    }
    fn div_count_into(values: &mut [Self], n: usize) {
        for v in values {
            *v /= n as f32;
        }
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn add_into(acc: &mut [Self], incoming: &[Self]) {
        for (a, &b) in acc.iter_mut().zip(incoming) {
            *a += b;
        }
    }
    fn div_count_into(values: &mut [Self], n: usize) {
        for v in values {
            *v /= n as f64;
        }
    }
}

/// bfloat16, for compressed gradients: each sum is taken in `f32` and rounded once to bf16.
impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn add_into(acc: &mut [Self], incoming: &[Self]) {
        for (a, &b) in acc.iter_mut().zip(incoming) {
            *a = bf16::from_f32(a.to_f32() + b.to_f32());
        }
    }
    fn div_count_into(values: &mut [Self], n: usize) {
        for v in values {
            *v = bf16::from_f32(v.to_f32() / n as f32);
        }
    }
}

/// IEEE half precision, for compressed gradients: as bf16, three more bits of mantissa and a
/// range up to 65,504.
impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn add_into(acc: &mut [Self], incoming: &[Self]) {
        for (a, &b) in acc.iter_mut().zip(incoming) {
            *a = f16::from_f32(a.to_f32() + b.to_f32());
        }
    }
    fn div_count_into(values: &mut [Self], n: usize) {
        for v in values {
            *v = f16::from_f32(v.to_f32() / n as f32);
        }
    }
}

/// How values from all ranks combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the number of ranks.
    Mean,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
}

impl ReduceOp {
    /// Combines `incoming` into `acc` elementwise (`Mean` sums; [`ReduceOp::finish`]'s
    /// division comes once at the end). NaN wins `Max` and `Min`, as in `NumPy`.
    pub fn combine<T: Element>(self, acc: &mut [T], incoming: &[T]) {
        match self {
            Self::Sum | Self::Mean => T::add_into(acc, incoming),
            Self::Max => acc.iter_mut().zip(incoming).for_each(|(a, &b)| {
                if b > *a || b.partial_cmp(&b).is_none() {
                    *a = b;
                }
            }),
            Self::Min => acc.iter_mut().zip(incoming).for_each(|(a, &b)| {
                if b < *a || b.partial_cmp(&b).is_none() {
                    *a = b;
                }
            }),
        }
    }

    /// Applied once to the fully reduced values.
    pub(crate) fn finish<T: Element>(self, values: &mut [T], world_size: usize) {
        if self == Self::Mean {
            T::div_count_into(values, world_size);
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Sum => 0,
            Self::Mean => 1,
            Self::Max => 2,
            Self::Min => 3,
        }
    }
}
