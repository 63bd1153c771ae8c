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
//! - Libraries are loaded at run time: the crate builds and its tests run on machines with no
//!   CUDA (they skip, printing why). NVIDIA's libraries are found on the loader's path, in
//!   `LOCKSTEP_CUDA_LIBRARY_PATH`, or where pip's `nvidia-*` wheels put them
//!   ([`libraries`]).
//!
//! Dependencies: `cudarc` for the driver, NVRTC and cuBLAS APIs with dynamic loading (`cust`
//! needs a CUDA toolkit to build and is unmaintained); `libloading` to open NVIDIA's
//! libraries by path before cudarc opens them by name; `thiserror` for the error type;
//! `tracing` for what was opened where.

mod buffer;
mod device;
mod error;
mod kernels;
pub mod libraries;
mod memory_pool;
pub mod ops;
mod transfers;

pub use buffer::CudaBuffer;
pub use device::{CudaDevice, device_count};
pub use error::CudaError;
pub use kernels::{SOURCE, compile_kernels, compile_kernels_to_cubin};
pub use transfers::Transfers;
