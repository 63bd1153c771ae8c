//! `Element`: what a pipeline can hold, fingerprint and write to a cache file.

use ndarray::{ArcArray, Array, ArrayBase, ArrayD, Data, Dimension, IxDyn};

use crate::error::DataError;

/// A value that can flow through a pipeline and be written to and read back from a cache file.
///
/// Implemented for the numeric scalars, `bool`, `String`, `Vec<T>`, ndarray arrays of numeric
/// scalars, and tuples of up to three elements. The encoding is little-endian and
/// self-delimiting; `decode(encode(x)) == x` for every value.
///
/// ```
/// use lockstep_data::Element;
/// use ndarray::array;
///
/// let value = (array![[1.0_f32, 2.0], [3.0, 4.0]], 7_u8);
/// let mut bytes = Vec::new();
/// value.encode(&mut bytes);
/// let back = <(ndarray::Array2<f32>, u8)>::decode(&mut bytes.as_slice())?;
/// assert_eq!(back, value);
/// # Ok::<(), lockstep_data::DataError>(())
/// ```
pub trait Element: Clone + Send + Sync + 'static {
    /// Appends the value's bytes to `out`.
    fn encode(&self, out: &mut Vec<u8>);

    /// Reads one value from the front of `input` and advances it past the value.
    ///
    /// # Errors
    ///
    /// [`DataError::Decode`] when the bytes are too short or inconsistent.
    fn decode(input: &mut &[u8]) -> Result<Self, DataError>;
}

/// A fixed-size numeric type, the elements of arrays.
pub trait Scalar: Element + Copy {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Reads the value from exactly [`Scalar::SIZE`] little-endian bytes.
    fn from_le_slice(bytes: &[u8]) -> Self;

    /// Appends every value of `values`, as [`Element::encode`] would one by one.
    fn encode_slice(values: &[Self], out: &mut Vec<u8>);
}

pub(crate) fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], DataError> {
    if input.len() < n {
        return Err(DataError::Decode(format!(
            "needed {n} more bytes, {} left",
            input.len()
        )));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

macro_rules! scalar {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
                Ok(<Self as Scalar>::from_le_slice(take(input, Self::SIZE)?))
            }
        }
        impl Scalar for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le_slice(bytes: &[u8]) -> Self {
                let mut raw = [0_u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
            fn encode_slice(values: &[Self], out: &mut Vec<u8>) {
                // Into a sized region a chunk per value: no capacity check per value, so a
                // fingerprint of a large in-memory data set is one quick pass.
                let start = out.len();
                out.resize(start + values.len() * Self::SIZE, 0);
                for (bytes, v) in out[start..].chunks_exact_mut(Self::SIZE).zip(values) {
                    bytes.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    )*};
}
scalar!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

impl Element for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
        match take(input, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DataError::Decode(format!("byte {b} is not a bool"))),
        }
    }
}

fn encode_len(len: usize, out: &mut Vec<u8>) {
    (len as u64).encode(out);
}

fn decode_len(input: &mut &[u8], item_size: usize) -> Result<usize, DataError> {
    let len = u64::decode(input)?;
    // A damaged length must not make us allocate terabytes before noticing.
    match usize::try_from(len) {
        Ok(len) if len.saturating_mul(item_size.max(1)) <= input.len() => Ok(len),
        _ => Err(DataError::Decode(format!(
            "length {len} is larger than the {} bytes left",
            input.len()
        ))),
    }
}

impl Element for String {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len(self.len(), out);
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
        let len = decode_len(input, 1)?;
        String::from_utf8(take(input, len)?.to_vec()).map_err(|e| DataError::Decode(e.to_string()))
    }
}

impl<T: Element> Element for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len(self.len(), out);
        for item in self {
            item.encode(out);
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
        let len = decode_len(input, 1)?;
        (0..len).map(|_| T::decode(input)).collect()
    }
}

fn encode_array<A: Scalar, S: Data<Elem = A>, D: Dimension>(
    array: &ArrayBase<S, D>,
    out: &mut Vec<u8>,
) {
    out.push(array.ndim() as u8);
    for &d in array.shape() {
        encode_len(d, out);
    }
    if let Some(values) = array.as_slice() {
        A::encode_slice(values, out);
        return;
    }
    out.reserve(array.len() * A::SIZE);
    for x in array {
        x.encode(out);
    }
}

fn decode_array<A: Scalar, D: Dimension>(input: &mut &[u8]) -> Result<Array<A, D>, DataError> {
    let ndim = usize::from(take(input, 1)?[0]);
    let shape = (0..ndim)
        .map(|_| decode_len(input, 0))
        .collect::<Result<Vec<_>, _>>()?;
    let count = shape.iter().try_fold(1_usize, |acc, &d| acc.checked_mul(d));
    let bytes = count
        .and_then(|c| c.checked_mul(A::SIZE))
        .ok_or_else(|| DataError::Decode(format!("array shape {shape:?} overflows")))?;
    let data = take(input, bytes)?
        .chunks_exact(A::SIZE)
        .map(A::from_le_slice)
        .collect();
    ArrayD::from_shape_vec(IxDyn(&shape), data)
        .and_then(ArrayBase::into_dimensionality::<D>)
        .map_err(|e| DataError::Decode(format!("array of shape {shape:?}: {e}")))
}

impl<A: Scalar, D: Dimension + 'static> Element for Array<A, D> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_array(self, out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
        decode_array(input)
    }
}

/// Shared arrays clone by reference count: the cheap choice for elements that a cache replays
/// every epoch.
impl<A: Scalar, D: Dimension + 'static> Element for ArcArray<A, D> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_array(self, out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
        decode_array(input).map(Array::into_shared)
    }
}

macro_rules! tuple {
    ($($name:ident),+) => {
        impl<$($name: Element),+> Element for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $($name.encode(out);)+
            }
            fn decode(input: &mut &[u8]) -> Result<Self, DataError> {
                Ok(($($name::decode(input)?,)+))
            }
        }
    };
}
tuple!(A);
tuple!(A, B);
tuple!(A, B, C);

#[cfg(test)]
mod tests {
    use ndarray::{Array3, array};

    use super::*;

    fn round_trip<T: Element + PartialEq + std::fmt::Debug>(value: &T) {
        let mut bytes = Vec::new();
        value.encode(&mut bytes);
        let mut input = bytes.as_slice();
        assert_eq!(&T::decode(&mut input).unwrap(), value);
        assert!(
            input.is_empty(),
            "decode must consume exactly what encode wrote"
        );
    }

    #[test]
    fn every_kind_of_element_round_trips() {
        round_trip(&7_u8);
        round_trip(&-3.5_f64);
        round_trip(&true);
        round_trip(&"héllo".to_owned());
        round_trip(&vec![1_i64, -2, 3]);
        round_trip(&Array3::<f32>::from_shape_fn((2, 3, 1), |(i, j, _)| {
            (i * 3 + j) as f32
        }));
        round_trip(&(array![1_u8, 2], 5_u32, "x".to_owned()));
        round_trip(&ndarray::Array0::from_elem((), 1.5_f32));
        round_trip(&ndarray::ArcArray2::from_elem((2, 2), 9_u16));
    }

    #[test]
    fn truncated_or_damaged_bytes_are_errors() {
        let mut bytes = Vec::new();
        array![[1.0_f32, 2.0]].encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(
                ndarray::Array2::<f32>::decode(&mut &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        assert!(
            ndarray::Array3::<f32>::decode(&mut bytes.as_slice()).is_err(),
            "wrong rank"
        );
        let huge = u64::MAX.to_le_bytes();
        assert!(Vec::<u8>::decode(&mut huge.as_slice()).is_err());
        assert!(bool::decode(&mut [2_u8].as_slice()).is_err());
    }
}
