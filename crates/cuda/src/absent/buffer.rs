//! A build without the `cuda` feature has no device buffers.

use std::convert::Infallible;
use std::ops::Range;

use crate::device::CudaDevice;
use crate::error::CudaError;

/// `f32` values in a GPU's memory. Without the `cuda` feature no value of this type exists:
/// there is no device to hold one ([`CudaDevice::open`]).
#[derive(Debug)]
pub struct CudaBuffer {
    never: Infallible,
}

#[allow(
    missing_docs,
    clippy::missing_errors_doc,
    reason = "the `cuda` build documents each"
)]
impl CudaBuffer {
    pub fn len(&self) -> usize {
        match self.never {}
    }

    pub fn is_empty(&self) -> bool {
        match self.never {}
    }

    pub fn device(&self) -> &CudaDevice {
        match self.never {}
    }

    pub fn to_host(&self) -> Result<Vec<f32>, CudaError> {
        match self.never {}
    }

    pub fn try_clone(&self) -> Result<Self, CudaError> {
        match self.never {}
    }

    pub fn copy_range(&self, _range: Range<usize>) -> Result<Self, CudaError> {
        match self.never {}
    }

    pub fn write_at(&mut self, _offset: usize, _source: &CudaBuffer) -> Result<(), CudaError> {
        match self.never {}
    }

    pub fn write_from_host(&mut self, _values: &[f32]) -> Result<(), CudaError> {
        match self.never {}
    }

    pub fn fill_zero(&mut self) -> Result<(), CudaError> {
        match self.never {}
    }

    /// Any result at all: there is no buffer to call this on.
    pub(crate) fn absent<T>(&self) -> T {
        match self.never {}
    }
}
