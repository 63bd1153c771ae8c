//! What every launch uses: grid sizes and argument checks.

use cudarc::driver::LaunchConfig;

use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Threads per block of the element-wise kernels.
pub(crate) const THREADS: u32 = 256;

/// Most blocks launched: the kernels' grid-stride loops cover any size with these.
const MAX_BLOCKS: usize = 1 << 16;

pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn count(n: usize) -> u64 {
    n as u64
}

pub(crate) fn launched(result: Result<(), cudarc::driver::DriverError>) -> Result<(), CudaError> {
    result.map_err(CudaError::driver("launching a kernel"))
}

/// The device every buffer is on, or an error naming `op`.
pub(crate) fn same_device<'a>(
    op: &'static str,
    buffers: &[&'a CudaBuffer],
) -> Result<&'a CudaDevice, CudaError> {
    let (first, rest) = buffers
        .split_first()
        .ok_or_else(|| CudaError::invalid(op, "no buffer"))?;
    if rest.iter().any(|b| b.device() != first.device()) {
        return Err(CudaError::invalid(op, "buffers on different devices"));
    }
    Ok(first.device())
}

pub(crate) fn same_len(op: &'static str, buffers: &[&CudaBuffer]) -> Result<usize, CudaError> {
    let len = buffers.first().map_or(0, |b| b.len());
    if buffers.iter().any(|b| b.len() != len) {
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        return Err(CudaError::invalid(op, format!("lengths differ: {lens:?}")));
    }
    Ok(len)
}
