//! `f32` tensors with define-by-run reverse-mode autograd and deterministic, fast CPU kernels —
//! everything the Keras models of TensorFlow's MNIST tutorials need.
//!
//! ```
//! use lockstep_tensor::{Tensor, ops};
//!
//! // One step of logistic regression on two examples.
//! let w = Tensor::parameter(vec![0.0; 6], &[3, 2])?;
//! let b = Tensor::parameter(vec![0.0; 2], &[2])?;
//! let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let logits = ops::bias_add(&ops::matmul(&x, &w)?, &b)?;
//! let loss = ops::mean(&ops::sparse_softmax_cross_entropy_with_logits(&logits, &[0, 1])?, &[0], false)?;
//! assert!((loss.item()? - 2.0_f32.ln()).abs() < 1e-6);
//! let grads = loss.backward()?;
//! assert_eq!(grads.get(&b).unwrap().host_data()?, [0.0, 0.0]); // one example per class
//! # Ok::<(), lockstep_tensor::TensorError>(())
//! ```
//!
//! - [`Tensor`]: immutable, cheaply cloned, row-major `f32`; its [`Device`] (host memory or a
//!   CUDA GPU) is part of the value, and operations run where their operands are.
//! - [`ops`]: differentiable operations that check shapes and record backward rules only when
//!   gradients are wanted.
//! - [`kernels`]: the CPU kernels behind them (GEMM through gemm's `f32` kernels; Winograd
//!   F(2×2, 3×3) and F(4×4, 3×3) for 3×3 stride-1 convolutions with 8 or more channels, im2col
//!   for the rest; a convolution fused with the max pooling after it, computed directly for a
//!   first layer or pooled tile by tile out of Winograd's transform; pooling; stable softmax),
//!   parallel on rayon with a fixed partition of work.
//!
//! Dependencies: `gemm-f32` (with `gemm-common` for its `Parallelism`) for matrix products
//! near the machine's peak (`ndarray`'s own product reaches about half; the `gemm` crate would
//! also compile its `f64` and complex kernels, which nothing here multiplies); `ndarray` for conversions; `rayon` for parallel kernels;
//! `multiversion` to compile the SIMD kernels for AVX2 + FMA beside the baseline and pick one
//! at run time (a dependent crate's build gets no `target-cpu` flag from this workspace);
//! `bytemuck` to move eight lanes between `[f32; 8]` and the 256-bit vector type without
//! `unsafe`; `rand_pcg` for seeded dropout masks; `thiserror` for the error type;
//! `lockstep-cuda` for the GPU paths (loaded at run time, so the crate builds and runs on
//! machines without CUDA; its backend is the `cuda` feature).

mod autograd;
mod device;
mod error;
pub mod kernels;
pub mod ops;
mod storage;
mod tensor;

pub use autograd::{BlockOf, Gradients};
pub use device::Device;
pub use error::TensorError;
pub use tensor::{Tensor, TensorId, element_count};
