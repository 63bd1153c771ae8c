//! The training kernels' source, which a build without the `cuda` feature cannot compile.

use crate::error::CudaError;

/// The kernels' source.
pub const SOURCE: &str = include_str!("../kernels/training.cu");

/// [`CudaError::NotBuilt`]: NVRTC is reached through the `cuda` feature.
///
/// # Errors
///
/// [`CudaError::NotBuilt`].
pub fn compile_kernels(_arch: &str) -> Result<String, CudaError> {
    Err(CudaError::NotBuilt)
}

/// [`CudaError::NotBuilt`]: NVRTC is reached through the `cuda` feature.
///
/// # Errors
///
/// [`CudaError::NotBuilt`].
pub fn compile_kernels_to_cubin(_arch: &str) -> Result<Vec<u8>, CudaError> {
    Err(CudaError::NotBuilt)
}
