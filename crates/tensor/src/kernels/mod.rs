//! CPU kernels on plain slices: no shapes checks beyond what memory safety needs, no autograd.
//! The operations in [`crate::ops`] check shapes, call these, and record backward rules.
//!
//! Parallel kernels split work into fixed pieces that do not depend on the thread count or on
//! scheduling, and combine partial results in a fixed order: results are bit-identical from run
//! to run (and, except inside GEMM, across thread counts).

pub(crate) mod batch_norm;
pub(crate) mod batch_norm_pool;
pub(crate) mod conv;
pub(crate) mod conv_pool;
pub(crate) mod elementwise;
pub mod gemm;
pub(crate) mod geometry;
pub(crate) mod lanes;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod window_max;
pub(crate) mod winograd;

/// Elements per parallel task in elementwise kernels: large enough to amortise a task.
pub(crate) const CHUNK: usize = 1 << 14;
