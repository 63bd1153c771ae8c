//! Named `f32` tensors and their safetensors encoding.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::CheckpointError;

/// One named variable: a model's `dense/kernel`, an optimizer's `m/dense/kernel`.
///
/// ```
/// use lockstep_checkpoint::NamedTensor;
///
/// let bias = NamedTensor::new("dense/bias", vec![3], vec![0.0; 3])?;
/// assert_eq!(bias.len(), 3);
/// assert!(NamedTensor::new("dense/bias", vec![4], vec![0.0; 3]).is_err());
/// # Ok::<(), lockstep_checkpoint::CheckpointError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Its name, unique within its file.
    pub name: String,
    /// Its shape; the values are laid out row-major.
    pub shape: Vec<usize>,
    /// Its values.
    pub values: Vec<f32>,
}

impl NamedTensor {
    /// A tensor whose values fill its shape.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Invalid`] when the shape's element count overflows or differs from
    /// the number of values.
    pub fn new(
        name: impl Into<String>,
        shape: Vec<usize>,
        values: Vec<f32>,
    ) -> Result<Self, CheckpointError> {
        let tensor = Self {
            name: name.into(),
            shape,
            values,
        };
        tensor.check()?;
        Ok(tensor)
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn check(&self) -> Result<(), CheckpointError> {
        let count = self
            .shape
            .iter()
            .try_fold(1_usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(size_of::<f32>()).map(|_| n));
        match count {
            Some(n) if n == self.values.len() => Ok(()),
            Some(n) => Err(CheckpointError::Invalid(format!(
                "tensor {} of shape {:?} needs {n} values, has {}",
                self.name,
                self.shape,
                self.values.len()
            ))),
            None => Err(CheckpointError::Invalid(format!(
                "tensor {} has a shape {:?} whose size overflows",
                self.name, self.shape
            ))),
        }
    }
}

/// Encodes `tensors` as a safetensors file (little-endian `F32`) with `metadata` in its
/// header's `__metadata__` (none when empty).
pub(crate) fn encode(
    tensors: &[NamedTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut bytes = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        tensor.check()?;
        bytes.push(le_bytes(&tensor.values));
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (tensor, data) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(Dtype::F32, tensor.shape.clone(), data)
            .map_err(|e| CheckpointError::Invalid(format!("tensor {}: {e}", tensor.name)))?;
        views.push((tensor.name.as_str(), view));
    }
    let metadata = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>()
    });
    safetensors::tensor::serialize(views, metadata)
        .map_err(|e| CheckpointError::Invalid(format!("encoding safetensors: {e}")))
}

/// `values` as safetensors stores `F32`: little-endian, one after another. On a little-endian
/// machine that is their memory, copied as one block: a model's backup every few steps costs a
/// copy, not a conversion per value (unoptimised, such a conversion is a good part of a debug
/// build's step).
fn le_bytes(values: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        return bytemuck::cast_slice(values).to_vec();
    }
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `f32`s [`le_bytes`] wrote (a trailing partial value is left out; the caller has checked
/// the length against the shape). The bytes need not be aligned.
fn from_le_bytes(bytes: &[u8]) -> Vec<f32> {
    let whole = &bytes[..bytes.len() - bytes.len() % size_of::<f32>()];
    if cfg!(target_endian = "little") {
        return bytemuck::pod_collect_to_vec(whole);
    }
    whole
        .chunks_exact(size_of::<f32>())
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Decodes a safetensors file of `F32` tensors.
pub(crate) fn decode(bytes: &[u8], path: &Path) -> Result<Vec<NamedTensor>, CheckpointError> {
    decode_with_metadata(bytes, path).map(|(tensors, _)| tensors)
}

/// Decodes a safetensors file of `F32` tensors and its header's `__metadata__`.
pub(crate) fn decode_with_metadata(
    bytes: &[u8],
    path: &Path,
) -> Result<(Vec<NamedTensor>, BTreeMap<String, String>), CheckpointError> {
    let not_safetensors = |e: safetensors::SafeTensorError| {
        CheckpointError::damaged(path, format!("not a safetensors file: {e}"))
    };
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(not_safetensors)?;
    let metadata = header
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let file = SafeTensors::deserialize(bytes).map_err(not_safetensors)?;
    let mut tensors = Vec::new();
    for (name, view) in file.iter() {
        if view.dtype() != Dtype::F32 {
            return Err(CheckpointError::damaged(
                path,
                format!("tensor {name} is {:?}, not F32", view.dtype()),
            ));
        }
        let values = from_le_bytes(view.data());
        let tensor = NamedTensor {
            name: name.to_owned(),
            shape: view.shape().to_vec(),
            values,
        };
        tensor
            .check()
            .map_err(|e| CheckpointError::damaged(path, e.to_string()))?;
        tensors.push(tensor);
    }
    Ok((tensors, metadata))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> Vec<NamedTensor> {
        vec![
            NamedTensor::new(
                "conv2d/kernel",
                vec![3, 3, 1, 2],
                (0..18).map(|i| i as f32 * 0.5).collect(),
            )
            .unwrap(),
            NamedTensor::new("conv2d/bias", vec![2], vec![-1.0, f32::MIN_POSITIVE]).unwrap(),
            NamedTensor::new("empty", vec![0, 4], vec![]).unwrap(),
        ]
    }

    #[test]
    fn tensors_and_metadata_survive_encoding_bit_for_bit() {
        let tensors = sample();
        let metadata = BTreeMap::from([("iterations".to_owned(), "189".to_owned())]);
        let bytes = encode(&tensors, &metadata).unwrap();
        let (mut back, back_metadata) = decode_with_metadata(&bytes, Path::new("t")).unwrap();
        assert_eq!(back_metadata, metadata);
        back.sort_by(|a, b| a.name.cmp(&b.name));
        let mut want = tensors;
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back, want);
    }

    #[test]
    fn values_read_back_from_bytes_at_any_alignment() {
        let values = [1.5_f32, -0.0, f32::MAX, f32::MIN_POSITIVE];
        let mut shifted = vec![0xAB];
        shifted.extend(le_bytes(&values));
        let back = from_le_bytes(&shifted[1..]);
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(le_bytes(&values)[..4], 1.5_f32.to_le_bytes());
    }

    #[test]
    fn a_shape_whose_size_overflows_is_an_error() {
        let err = NamedTensor::new("x", vec![usize::MAX, 3], vec![]).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn damaged_files_are_errors_never_panics(
            cut in 0_usize..400,
            flips in prop::collection::vec((0_usize..400, any::<u8>()), 0..4),
        ) {
            let mut bytes = encode(&sample(), &BTreeMap::new()).unwrap();
            for (at, value) in flips {
                let at = at % bytes.len();
                bytes[at] = value;
            }
            bytes.truncate(cut.min(bytes.len()));
            // Either decodes (the damage hit only values) or says why not.
            if let Err(e) = decode(&bytes, Path::new("t")) {
                prop_assert!(e.to_string().contains("damaged"));
            }
        }

        #[test]
        fn arbitrary_bytes_are_errors_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, Path::new("t"));
        }
    }
}
