//! `f32` values in a GPU's memory.

use std::fmt;
use std::ops::Range;

use cudarc::driver::CudaSlice;

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::transfers;

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
            transfers::count_to_device();
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
        transfers::count_to_host();
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

    /// A copy of the values in `range`, on the same device (a variable cut out of a model's
    /// flat parameter buffer).
    ///
    /// ```
    /// # use lockstep_cuda::{CudaDevice, CudaError};
    /// # let Ok(gpu) = CudaDevice::open(0) else { return Ok(()) };
    /// let x = gpu.upload(&[1.0, 2.0, 3.0, 4.0])?;
    /// assert_eq!(x.copy_range(1..3)?.to_host()?, [2.0, 3.0]);
    /// # Ok::<(), CudaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CudaError::Invalid`] when `range` reaches past the end; the driver's error.
    pub fn copy_range(&self, range: Range<usize>) -> Result<Self, CudaError> {
        self.check_range("copy_range", &range)?;
        let mut copy = Self::zeros(&self.device, range.len())?;
        if !range.is_empty() {
            self.device
                .stream()
                .memcpy_dtod(&self.slice.slice(range), &mut copy.slice)
                .map_err(CudaError::driver("copying on the device"))?;
        }
        Ok(copy)
    }

    /// Copies every value of `source` into this buffer from `offset` on, on the device (a
    /// variable's gradient into a model's flat gradient buffer).
    ///
    /// # Errors
    ///
    /// [`CudaError::Invalid`] when `source` is on another device or does not fit from
    /// `offset` on; the driver's error.
    pub fn write_at(&mut self, offset: usize, source: &CudaBuffer) -> Result<(), CudaError> {
        if source.device != self.device {
            return Err(CudaError::invalid(
                "write_at",
                "buffers on different devices",
            ));
        }
        let range = offset..offset.saturating_add(source.len);
        self.check_range("write_at", &range)?;
        if range.is_empty() {
            return Ok(());
        }
        self.device
            .stream()
            .memcpy_dtod(
                &source.slice.slice(..source.len),
                &mut self.slice.slice_mut(range),
            )
            .map_err(CudaError::driver("copying on the device"))
    }

    /// Sets every value to zero, on the device.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn fill_zero(&mut self) -> Result<(), CudaError> {
        self.device
            .stream()
            .memset_zeros(&mut self.slice)
            .map_err(CudaError::driver("zeroing on the device"))
    }

    fn check_range(&self, op: &'static str, range: &Range<usize>) -> Result<(), CudaError> {
        if range.start <= range.end && range.end <= self.len {
            Ok(())
        } else {
            Err(CudaError::invalid(
                op,
                format!(
                    "values {}..{} of a buffer of {}",
                    range.start, range.end, self.len
                ),
            ))
        }
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
