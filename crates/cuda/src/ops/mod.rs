//! The operations on device buffers: each checks its arguments, then queues one kernel (or one
//! cuBLAS call) on the device's stream. Nothing waits for the GPU here; reading a result back
//! ([`CudaBuffer::to_host`](crate::CudaBuffer::to_host)) does.
//!
//! One file per family of operations: element-wise arithmetic, relu, bias,
//! log, clip, the smooth activations, selection and dropout; reordering axes; sums; softmax and cross-entropy; convolution and pooling windows; the
//! optimizers' updates; GEMM. Their plain-value arguments are in `arguments.rs`, what every
//! launch uses (grid sizes, argument checks) in `launch.rs`. Without the `cuda` feature,
//! `absent.rs` has the same functions, which no buffer can reach.

#[cfg(not(feature = "cuda"))]
mod absent;
mod arguments;
#[cfg(feature = "cuda")]
mod elementwise;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
mod layout;
#[cfg(feature = "cuda")]
mod optimizers;
#[cfg(feature = "cuda")]
mod reduce;
#[cfg(feature = "cuda")]
mod softmax;
#[cfg(feature = "cuda")]
mod window;

#[cfg(not(feature = "cuda"))]
pub use absent::{
    Argmax, adam, bias_add, binary, clip, clip_grad, col2im, column_sums, dropout, exp, fill,
    im2col, log, matmul, max_pool, max_pool_grad, permute, pointwise, pointwise_grad, relu,
    relu_grad, scale, scale_in_place, scale_rows, select, sgd, sgd_momentum, softmax, softmax_grad,
    sparse_softmax_cross_entropy, sum,
};
pub use arguments::{AdamStep, Binary, COLUMN_SUM_BLOCK_ROWS, Geometry, MatRef, Pointwise};
#[cfg(feature = "cuda")]
pub use elementwise::{
    bias_add, binary, clip, clip_grad, dropout, exp, fill, log, pointwise, pointwise_grad, relu,
    relu_grad, scale, scale_in_place, select,
};
#[cfg(feature = "cuda")]
pub use gemm::matmul;
#[cfg(feature = "cuda")]
use launch::{THREADS, count, grid, launched, same_device, same_len};
#[cfg(feature = "cuda")]
pub use layout::permute;
#[cfg(feature = "cuda")]
pub use optimizers::{adam, sgd, sgd_momentum};
#[cfg(feature = "cuda")]
pub use reduce::{column_sums, sum};
#[cfg(feature = "cuda")]
pub use softmax::{scale_rows, softmax, softmax_grad, sparse_softmax_cross_entropy};
#[cfg(feature = "cuda")]
pub use window::{Argmax, col2im, im2col, max_pool, max_pool_grad};
