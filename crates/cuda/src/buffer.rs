//! `f32` values in a GPU's memory.

use std::fmt;

use cudarc::driver::CudaSlice;

use crate::device::CudaDevice;
use crate::error::CudaError;

/// `len` `f32` values on one device. Operations that take several buffers check that they
/// share a device.
pub struct CudaBuffer {
    /// At least one value: the driver refuses empty allocations, and an empty buffer still
    /// needs a pointer to pass.
    slice: CudaSlice<f32>,
    len: usize,
    device: CudaDevice,
}

impl CudaBuffer {
    pub(crate) fn upload(device: &CudaDevice, values: &[f32]) -> Result<Self, CudaError> {
        let stream = device.stream();
        let slice = if values.is_empty() {
            stream.alloc_zeros::<f32>(1)
        } else {
            stream.clone_htod(values)
        }
        .map_err(CudaError::driver("copying to the device"))?;
        Ok(Self {
            slice,
            len: values.len(),
            device: device.clone(),
        })
    }

    pub(crate) fn zeros(device: &CudaDevice, len: usize) -> Result<Self, CudaError> {
        let slice = device
            .stream()
            .alloc_zeros::<f32>(len.max(1))
            .map_err(CudaError::driver("allocating"))?;
        Ok(Self {
            slice,
            len,
            device: device.clone(),
        })
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device holding the values.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The values, copied to the host once the work queued before has finished.
    ///
    /// # Errors
    ///
    /// The driver's error, which may come from an earlier asynchronous operation.
    pub fn to_host(&self) -> Result<Vec<f32>, CudaError> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        let stream = self.device.stream();
        let values = stream
            .clone_dtoh(&self.slice)
            .map_err(CudaError::driver("copying to the host"))?;
        stream
            .synchronize()
            .map_err(CudaError::driver("copying to the host"))?;
        Ok(values)
    }

    /// A copy on the same device.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn try_clone(&self) -> Result<Self, CudaError> {
        let mut copy = Self::zeros(&self.device, self.len)?;
        self.device
            .stream()
            .memcpy_dtod(&self.slice, &mut copy.slice)
            .map_err(CudaError::driver("copying on the device"))?;
        Ok(copy)
    }

    pub(crate) fn slice(&self) -> &CudaSlice<f32> {
        &self.slice
    }

    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.slice
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("len", &self.len)
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}
