//! The training kernels' CUDA source (`training.cu`), compiled by NVRTC once per device and
//! process for the device's architecture.

#![allow(
    unsafe_code,
    reason = "asking NVRTC whether its library is present; see the SAFETY comment"
)]

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::error::CudaError;
use crate::libraries;

/// The kernels' source.
pub const SOURCE: &str = include_str!("training.cu");

/// Every kernel in [`SOURCE`], loaded together.
pub(crate) const NAMES: &[&str] = &[
    "fill_f32",
    "add_f32",
    "sub_f32",
    "mul_f32",
    "div_f32",
    "scale_f32",
    "relu_f32",
    "relu_grad_f32",
    "bias_add_f32",
    "column_block_sums_f32",
    "column_sums_f32",
    "sum_f32",
    "sparse_softmax_cross_entropy_f32",
    "softmax_f32",
    "softmax_grad_f32",
    "scale_rows_f32",
    "log_f32",
    "clip_f32",
    "clip_grad_f32",
    "im2col_f32",
    "col2im_f32",
    "max_pool_f32",
    "max_pool_grad_f32",
    "dropout_f32",
    "sgd_f32",
    "sgd_momentum_f32",
    "adam_f32",
];

/// Compiles [`SOURCE`] to PTX for `arch` (`compute_90` for an H100). Needs NVRTC's library,
/// not a GPU.
///
/// ```no_run
/// let ptx = lockstep_cuda::compile_kernels("compute_90")?;
/// assert!(ptx.contains(".entry adam_f32"));
/// # Ok::<(), lockstep_cuda::CudaError>(())
/// ```
///
/// # Errors
///
/// [`CudaError::MissingLibrary`] without NVRTC, [`CudaError::Compile`] with the compiler's log.
pub fn compile_kernels(arch: &str) -> Result<String, CudaError> {
    Ok(compile(arch)?.to_src())
}

fn compile(arch: &str) -> Result<Ptx, CudaError> {
    libraries::ensure(libraries::NVRTC)?;
    // SAFETY: loads NVRTC's library, now found, as cudarc would.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::MissingLibrary {
            library: libraries::NVRTC[0],
            searched: libraries::search_folders(),
        });
    }
    let options = CompileOptions {
        // Products and sums round apart, as on the CPU.
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("training.cu".to_owned()),
        ..CompileOptions::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| CudaError::Compile {
        arch: arch.to_owned(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// The kernels, loaded on one device.
pub(crate) struct Kernels {
    functions: Vec<(&'static str, CudaFunction)>,
}

impl Kernels {
    pub(crate) fn load(stream: &Arc<CudaStream>, arch: &str) -> Result<Self, CudaError> {
        let ptx = compile(arch)?;
        let module = stream
            .context()
            .load_module(ptx)
            .map_err(CudaError::driver("loading the kernels"))?;
        let functions = NAMES
            .iter()
            .map(|&name| {
                let function = module
                    .load_function(name)
                    .map_err(CudaError::driver("finding a kernel"))?;
                Ok((name, function))
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(Self { functions })
    }

    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction, CudaError> {
        self.functions
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f)
            .ok_or_else(|| CudaError::invalid("kernels", format!("no kernel named {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_in_the_source_is_loaded_by_name_and_no_other() {
        let mut defined: Vec<&str> = SOURCE
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .collect();
        let mut loaded = NAMES.to_vec();
        defined.sort_unstable();
        loaded.sort_unstable();
        assert_eq!(defined, loaded);
    }
}
