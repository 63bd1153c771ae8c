//! Freed device buffers kept for reuse by the next allocation of the same length, as
//! PyTorch's caching allocator keeps them.
//!
//! A training step allocates the same activations and gradients, of the same lengths, every
//! step. The stream-ordered pool behind `cuMemAllocAsync` already keeps the memory, but each
//! allocation and each free is still a driver call, and a step that queues a few hundred of
//! them spends a good part of its host time there (the host, not the GPU, is what bounds a
//! small model's step). Here a freed buffer goes into a list by length and the next buffer
//! of that length takes it back without the driver.
//!
//! Reuse needs no event: every buffer of a device is used on the device's one stream, in
//! queue order (event tracking is off, see `device.rs`), so work queued with the reused
//! buffer runs after all work queued with it before.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;

/// The most bytes kept per device; past it, freed buffers go back to the driver's pool.
const CAPACITY: usize = 2 << 30;

/// One device's freed buffers, by length.
#[derive(Default)]
pub(crate) struct BufferCache {
    free: HashMap<usize, Vec<CudaSlice<f32>>>,
    bytes: usize,
}

impl BufferCache {
    /// A kept buffer of exactly `len` values, if there is one.
    pub(crate) fn take(&mut self, len: usize) -> Option<CudaSlice<f32>> {
        let slice = self.free.get_mut(&len)?.pop()?;
        self.bytes -= len * size_of::<f32>();
        Some(slice)
    }

    /// Keeps `slice` for reuse; hands it back when the cache is full (the caller frees it).
    pub(crate) fn keep(&mut self, slice: CudaSlice<f32>) -> Option<CudaSlice<f32>> {
        let bytes = slice.len() * size_of::<f32>();
        if self.bytes + bytes > CAPACITY {
            return Some(slice);
        }
        self.bytes += bytes;
        self.free.entry(slice.len()).or_default().push(slice);
        None
    }

    /// Hands every kept buffer back (to be freed by the caller): an allocation failed, and the
    /// memory kept here may be what it needs.
    pub(crate) fn release(&mut self) -> Vec<CudaSlice<f32>> {
        self.bytes = 0;
        self.free.drain().flat_map(|(_, slices)| slices).collect()
    }
}
