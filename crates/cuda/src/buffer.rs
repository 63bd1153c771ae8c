//! `f32` values in a GPU's memory.

use std::fmt;
use std::mem::ManuallyDrop;
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
    /// Handed to the device's cache when the buffer is dropped ([`crate::buffer_cache`]).
    slice: ManuallyDrop<CudaSlice<f32>>,
    len: usize,
    device: CudaDevice,
}

impl CudaBuffer {
    pub(crate) fn upload(device: &CudaDevice, values: &[f32]) -> Result<Self, CudaError> {
        let mut buffer = Self::output(device, values.len())?;
        if !values.is_empty() {
            transfers::count_to_device();
            device
                .write_f32(values, &mut buffer.slice)
                .map_err(CudaError::driver("copying to the device"))?;
        }
        Ok(buffer)
    }

    pub(crate) fn zeros(device: &CudaDevice, len: usize) -> Result<Self, CudaError> {
        let slice = match device.take_cached(len.max(1)) {
            Some(mut slice) => {
                device
                    .stream()
                    .memset_zeros(&mut slice)
                    .map_err(CudaError::driver("zeroing on the device"))?;
                slice
            }
            None => retry_after_release(device, || device.stream().alloc_zeros::<f32>(len.max(1)))
                .map_err(CudaError::driver("allocating"))?,
        };
        Ok(Self {
            slice: ManuallyDrop::new(slice),
            len,
            device: device.clone(),
        })
    }

    /// A buffer of `len` values left as they were: for the output of a kernel or copy about
    /// to write every one of them (each caller's SAFETY comment says so). Skips the zeroing
    /// [`CudaBuffer::zeros`] queues, which on a training step's activations costs a driver
    /// call and a pass over the memory for each operation. A freed buffer of that length is
    /// taken back from the device's cache where there is one.
    #[allow(
        unsafe_code,
        reason = "an allocation whose values stay unset until the caller's kernel writes them"
    )]
    pub(crate) fn output(device: &CudaDevice, len: usize) -> Result<Self, CudaError> {
        let slice = match device.take_cached(len.max(1)) {
            Some(slice) => slice,
            // SAFETY: the caller queues, on this stream, a kernel or copy that writes all
            // `len` values before anything reads them; the one extra value of an empty buffer
            // is never read.
            None => retry_after_release(device, || unsafe {
                device.stream().alloc::<f32>(len.max(1))
            })
            .map_err(CudaError::driver("allocating"))?,
        };
        Ok(Self {
            slice: ManuallyDrop::new(slice),
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
            .clone_dtoh(&*self.slice)
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
        let mut copy = Self::output(&self.device, self.len)?;
        self.device
            .stream()
            .memcpy_dtod(&*self.slice, &mut *copy.slice)
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
        let mut copy = Self::output(&self.device, range.len())?;
        if !range.is_empty() {
            self.device
                .stream()
                .memcpy_dtod(&self.slice.slice(range), &mut *copy.slice)
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

    /// Replaces every value with `values` (as many), copied from the host: queued through a
    /// pinned buffer, so the caller goes on while earlier work runs.
    ///
    /// # Errors
    ///
    /// [`CudaError::Invalid`] when `values` is another length; the driver's error.
    pub fn write_from_host(&mut self, values: &[f32]) -> Result<(), CudaError> {
        if values.len() != self.len {
            return Err(CudaError::invalid(
                "write_from_host",
                format!("{} values for a buffer of {}", values.len(), self.len),
            ));
        }
        if values.is_empty() {
            return Ok(());
        }
        transfers::count_to_device();
        self.device
            .write_f32(values, &mut self.slice)
            .map_err(CudaError::driver("copying to the device"))
    }

    /// Sets every value to zero, on the device.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn fill_zero(&mut self) -> Result<(), CudaError> {
        self.device
            .stream()
            .memset_zeros(&mut *self.slice)
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

/// `allocate`, and once more after the device's cache freed what it kept when it fails (the
/// kept buffers, of lengths no longer asked for, may hold the memory it needs).
fn retry_after_release<T>(
    device: &CudaDevice,
    allocate: impl Fn() -> Result<T, cudarc::driver::DriverError>,
) -> Result<T, cudarc::driver::DriverError> {
    allocate().or_else(|e| {
        if device.release_cached() > 0 {
            allocate()
        } else {
            Err(e)
        }
    })
}

impl Drop for CudaBuffer {
    #[allow(
        unsafe_code,
        reason = "the slice is moved out of its `ManuallyDrop` once, as the buffer goes"
    )]
    fn drop(&mut self) {
        // SAFETY: `slice` is taken here only, and the buffer is never used after its drop.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        self.device.keep_cached(slice);
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
