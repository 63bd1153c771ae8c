//! Matrix products by cuBLAS SGEMM.

#![allow(
    unsafe_code,
    reason = "cuBLAS calls; each states its reasoning in a SAFETY comment"
)]

use cudarc::cublas::{Gemm, GemmConfig, sys::cublasOperation_t};

use super::MatRef;
use super::same_device;
use crate::buffer::CudaBuffer;
use crate::error::CudaError;

impl MatRef<'_> {
    /// `(rows, cols)` as the product reads it.
    fn shape(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    fn operation(&self) -> cublasOperation_t {
        if self.transposed {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    }
}

fn int(op: &'static str, value: usize) -> Result<i32, CudaError> {
    i32::try_from(value.max(1))
        .map_err(|_| CudaError::invalid(op, format!("dimension {value} exceeds cuBLAS's i32")))
}

/// `a · b` by cuBLAS SGEMM (full `f32`, no TF32), row-major `[m, n]`.
///
/// # Errors
///
/// Shapes that do not match each other or their buffers, buffers on different devices, or a
/// dimension past `i32`; cuBLAS's error.
pub fn matmul(a: MatRef<'_>, b: MatRef<'_>) -> Result<CudaBuffer, CudaError> {
    const OP: &str = "matmul";
    let device = same_device(OP, &[a.buffer, b.buffer])?;
    let ((m, k), (k2, n)) = (a.shape(), b.shape());
    for operand in [&a, &b] {
        if operand.rows.checked_mul(operand.cols) != Some(operand.buffer.len()) {
            return Err(CudaError::invalid(
                OP,
                format!(
                    "{}×{} does not fit {} values",
                    operand.rows,
                    operand.cols,
                    operand.buffer.len()
                ),
            ));
        }
    }
    if k != k2 {
        return Err(CudaError::invalid(OP, format!("[{m}, {k}] · [{k2}, {n}]")));
    }
    let len = m
        .checked_mul(n)
        .ok_or_else(|| CudaError::invalid(OP, "the product's size overflows"))?;
    if len == 0 || k == 0 {
        // A product over nothing is zeros.
        return device.zeros(len);
    }
    // Every value of `c` is written: cuBLAS ignores its input with `beta` 0.
    let mut c = CudaBuffer::output(device, len)?;
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS multiplies B's storage by A's.
    let config = GemmConfig {
        transa: b.operation(),
        transb: a.operation(),
        m: int(OP, n)?,
        n: int(OP, m)?,
        k: int(OP, k)?,
        alpha: 1.0_f32,
        lda: int(OP, b.cols)?,
        ldb: int(OP, a.cols)?,
        beta: 0.0_f32,
        ldc: int(OP, n)?,
    };
    let blas = device.blas()?;
    // SAFETY: the shapes are checked against each other and against the buffers' lengths, and
    // the leading dimensions are the stored rows' lengths, so cuBLAS stays inside the buffers.
    unsafe { blas.gemm(config, b.buffer.slice(), a.buffer.slice(), c.slice_mut()) }.map_err(
        |source| CudaError::Blas {
            what: "sgemm",
            source,
        },
    )?;
    Ok(c)
}
