//! A build without the `cuda` feature has no devices: opening one names the missing feature.

use std::convert::Infallible;

use crate::buffer::CudaBuffer;
use crate::error::CudaError;

/// The number of CUDA devices: always [`CudaError::NotBuilt`] without the `cuda` feature.
///
/// # Errors
///
/// [`CudaError::NotBuilt`].
pub fn device_count() -> Result<usize, CudaError> {
    Err(CudaError::NotBuilt)
}

/// One GPU. Without the `cuda` feature there is none: [`CudaDevice::open`] is
/// [`CudaError::NotBuilt`], and no value of this type exists.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CudaDevice {
    never: Infallible,
}

#[allow(
    missing_docs,
    clippy::missing_errors_doc,
    reason = "the `cuda` build documents each"
)]
impl CudaDevice {
    /// [`CudaError::NotBuilt`]: this build has no CUDA backend.
    ///
    /// # Errors
    ///
    /// [`CudaError::NotBuilt`].
    pub fn open(_ordinal: usize) -> Result<Self, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub fn ordinal(&self) -> usize {
        match self.never {}
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        match self.never {}
    }

    pub fn upload(&self, _values: &[f32]) -> Result<CudaBuffer, CudaError> {
        match self.never {}
    }

    pub fn zeros(&self, _len: usize) -> Result<CudaBuffer, CudaError> {
        match self.never {}
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        match self.never {}
    }

    /// Any result at all: there is no device to call this on.
    pub(crate) fn absent<T>(&self) -> T {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_every_device_names_the_missing_feature() {
        let err = CudaDevice::open(0).unwrap_err();
        assert!(matches!(err, CudaError::NotBuilt), "{err:?}");
        assert!(err.to_string().contains("`cuda` feature"), "{err}");
        assert!(matches!(device_count(), Err(CudaError::NotBuilt)));
        assert!(matches!(
            crate::compile_kernels("compute_90"),
            Err(CudaError::NotBuilt)
        ));
    }
}
