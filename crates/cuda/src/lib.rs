//! NVIDIA GPUs for Lockstep: finding the driver and libraries without a panic, device buffers,
//! the training kernels (compiled by NVRTC once per process for the device's architecture) and
//! cuBLAS SGEMM.
//!
//! ```
//! use lockstep_cuda::{CudaDevice, CudaError, ops};
//!
//! match CudaDevice::open(0) {
//!     Ok(gpu) => {
//!         let x = gpu.upload(&[-1.0, 2.0])?;
//!         assert_eq!(ops::relu(&x)?.to_host()?, [0.0, 2.0]);
//!     }
//!     // No driver, no device, or no NVRTC: the caller picks the CPU or fails.
//!     Err(e) => eprintln!("no GPU here: {e}"),
//! }
//! # Ok::<(), CudaError>(())
//! ```
//!
//! - [`CudaDevice`]: one GPU, opened once per process (one context, one stream).
//! - [`CudaBuffer`]: `f32` values on a device; [`CudaBuffer::to_host`] is the only way back,
//!   and [`Transfers`] counts each thread's copies either way.
//! - [`ops`]: element-wise, bias, relu, reductions, softmax cross-entropy, im2col/col2im, max
//!   pooling, dropout and the SGD/Adam updates as NVRTC kernels; GEMM by cuBLAS. Each call
//!   queues work on the device's stream and returns; nothing waits but reading back.
//! - [`nccl`]: all-reduce and broadcast of GPU buffers among GPUs (of one process or many)
//!   through NCCL, with a deadline on every wait and a communicator aborted when it passes.
//! - Libraries are loaded at run time: the crate builds and its tests run on machines with no
//!   CUDA (a skip the log shows). NVIDIA's libraries are found in `LOCKSTEP_CUDA_LIBRARY_PATH`
//!   first, then on the loader's path, or where pip's `nvidia-*` wheels put them
//!   ([`libraries`]).
//!
//! The `cuda` feature (on by default) is the backend: without it the crate keeps every type
//! and function, so code written for GPUs still compiles, but there is no device:
//! [`CudaDevice::open`] and [`device_count`] are [`CudaError::NotBuilt`], and no
//! [`CudaBuffer`] can exist. [`BUILT_WITH_CUDA`] says which build this is.
//!
//! Dependencies: `cudarc` (the `cuda` feature) for the driver, NVRTC and cuBLAS APIs with dynamic loading and NCCL's types (`cust`
//! needs a CUDA toolkit to build and is unmaintained); `libloading` to open NVIDIA's
//! libraries by path before cudarc opens them by name, and `libc` for `dlinfo`, which names
//! the file the loader opened; `thiserror` for the error type;
//! `tracing` for what was opened where.

#[cfg_attr(not(feature = "cuda"), path = "absent/buffer.rs")]
mod buffer;
#[cfg(feature = "cuda")]
mod buffer_cache;
#[cfg_attr(not(feature = "cuda"), path = "absent/device.rs")]
mod device;
mod error;
#[cfg_attr(not(feature = "cuda"), path = "absent/kernels.rs")]
mod kernels;
pub mod libraries;
#[cfg(feature = "cuda")]
mod memory_pool;
#[cfg_attr(not(feature = "cuda"), path = "absent/nccl.rs")]
pub mod nccl;
pub mod ops;
#[cfg(feature = "cuda")]
mod staging;
mod transfers;

pub use buffer::CudaBuffer;
pub use device::{CudaDevice, device_count};
pub use error::CudaError;
pub use kernels::{SOURCE, compile_kernels, compile_kernels_to_cubin};
pub use transfers::Transfers;

/// Whether this build has the CUDA backend (the `cuda` feature). Without it every device is
/// [`CudaError::NotBuilt`].
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");
