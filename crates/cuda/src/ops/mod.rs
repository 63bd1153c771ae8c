//! The operations on device buffers: each checks its arguments, then queues one kernel (or one
//! cuBLAS call) on the device's stream. Nothing waits for the GPU here; reading a result back
//! ([`CudaBuffer::to_host`]) does.
//!
//! One file per family of operations: element-wise arithmetic, relu, bias,
//! log, clip and dropout; sums; softmax and cross-entropy; convolution and pooling windows; the
//! optimizers' updates; GEMM. The helpers every launch uses (grid sizes, argument checks) live
//! here.

mod elementwise;
mod gemm;
mod optimizers;
mod reduce;
mod softmax;
mod window;

pub use elementwise::{
    Binary, bias_add, binary, clip, clip_grad, dropout, exp, fill, log, relu, relu_grad, scale,
};
pub use gemm::{MatRef, matmul};
pub use optimizers::{AdamStep, adam, sgd, sgd_momentum};
pub use reduce::{COLUMN_SUM_BLOCK_ROWS, column_sums, sum};
pub use softmax::{scale_rows, softmax, softmax_grad, sparse_softmax_cross_entropy};
pub use window::{Argmax, Geometry, col2im, im2col, max_pool, max_pool_grad};

use cudarc::driver::LaunchConfig;

use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;

/// Most blocks launched: the kernels' grid-stride loops cover any size with these.
const MAX_BLOCKS: usize = 1 << 16;

fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn count(n: usize) -> u64 {
    n as u64
}

fn launched(result: Result<(), cudarc::driver::DriverError>) -> Result<(), CudaError> {
    result.map_err(CudaError::driver("launching a kernel"))
}

/// The device every buffer is on, or an error naming `op`.
fn same_device<'a>(
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

fn same_len(op: &'static str, buffers: &[&CudaBuffer]) -> Result<usize, CudaError> {
    let len = buffers.first().map_or(0, |b| b.len());
    if buffers.iter().any(|b| b.len() != len) {
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        return Err(CudaError::invalid(op, format!("lengths differ: {lens:?}")));
    }
    Ok(len)
}
