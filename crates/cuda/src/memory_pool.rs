//! Keeping freed device memory for reuse, as PyTorch's caching allocator does.
//!
//! Buffers come from the device's default stream-ordered pool (`cuMemAllocAsync`, through
//! cudarc). By default that pool hands freed memory back to the driver at every
//! synchronisation, and a training step frees and allocates its activations and gradients
//! each time: reading the loss after every step would then map fresh memory every step. A
//! release threshold of "never" keeps it in the pool instead.
#![allow(
    unsafe_code,
    reason = "the driver's memory-pool calls are only exposed as unsafe functions"
)]

use cudarc::driver::result::{device, mem_pool};
use cudarc::driver::sys::CUmemPool_attribute;
use cudarc::driver::{CudaContext, DriverError};

/// Sets the release threshold of `context`'s device's default pool to `u64::MAX`. Devices
/// without stream-ordered allocation are left alone (cudarc allocates synchronously there).
///
/// # Errors
///
/// The driver's error; the caller may go on without the setting (it only costs speed).
pub(crate) fn keep_freed_memory(context: &CudaContext) -> Result<(), DriverError> {
    if !context.has_async_alloc() {
        return Ok(());
    }
    let mut threshold = u64::MAX;
    // SAFETY: `cu_device()` is a device handle the driver gave for this context, and the
    // release threshold's value is a `cuuint64_t`, which `threshold` is; the driver reads it
    // during the call only.
    unsafe {
        let pool = device::get_default_mem_pool(context.cu_device())?;
        mem_pool::set_attribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    }
}
