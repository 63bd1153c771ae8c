//! The training kernels' CUDA source (`training.cu`), compiled by NVRTC once per device and
//! process for the device's architecture: to its machine code first (nothing left for the
//! driver to compile, and loadable whatever the driver's age beside NVRTC's), to PTX when the
//! driver will not load that.

#![allow(
    unsafe_code,
    reason = "asking NVRTC whether its library is present, and NVRTC's CUBIN calls, which \
              cudarc exposes only as unsafe functions; see the SAFETY comments"
)]

use std::sync::Arc;

use std::ffi::CString;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

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
    "scale_in_place_f32",
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
    "exp_f32",
    "clip_f32",
    "clip_grad_f32",
    "tanh_f32",
    "tanh_grad_f32",
    "gelu_f32",
    "gelu_grad_f32",
    "gelu_tanh_f32",
    "gelu_tanh_grad_f32",
    "silu_f32",
    "silu_grad_f32",
    "sqrt_f32",
    "sqrt_grad_f32",
    "rsqrt_f32",
    "rsqrt_grad_f32",
    "select_f32",
    "permute_f32",
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

/// Compiles [`SOURCE`] to machine code (a CUBIN) for `arch` (`sm_90` for an H100): the form
/// the kernels are loaded in. Unlike PTX, a driver older than NVRTC loads it, and it has no
/// JIT compilation left to do at start.
///
/// ```no_run
/// let cubin = lockstep_cuda::compile_kernels_to_cubin("sm_90")?;
/// assert!(cubin.starts_with(b"\x7fELF"));
/// # Ok::<(), lockstep_cuda::CudaError>(())
/// ```
///
/// # Errors
///
/// As [`compile_kernels`].
pub fn compile_kernels_to_cubin(arch: &str) -> Result<Vec<u8>, CudaError> {
    nvrtc_present()?;
    let failed = |log: String| CudaError::Compile {
        arch: arch.to_owned(),
        log,
    };
    let source = CString::new(SOURCE).map_err(|e| failed(e.to_string()))?;
    let program = Program(
        nvrtc::result::create_program(&source, Some(c"training.cu"))
            .map_err(|e| failed(e.to_string()))?,
    );
    let options = compile_options(arch);
    // SAFETY: `program` was created above and is destroyed only when dropped, after these
    // calls; the CUBIN is copied into a buffer of the size NVRTC reports for it.
    unsafe {
        if let Err(e) = nvrtc::result::compile_program(program.0, &options) {
            let log = nvrtc::result::get_program_log(program.0).map_or_else(
                |_| e.to_string(),
                |log| {
                    let bytes: Vec<u8> = log.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_owned()
                },
            );
            return Err(failed(log));
        }
        let mut size = 0_usize;
        nvrtc::sys::nvrtcGetCUBINSize(program.0, &raw mut size)
            .result()
            .map_err(|e| failed(e.to_string()))?;
        let mut cubin = vec![0_u8; size];
        nvrtc::sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast())
            .result()
            .map_err(|e| failed(e.to_string()))?;
        Ok(cubin)
    }
}

/// An NVRTC program, destroyed when dropped.
struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        if let Err(e) = unsafe { nvrtc::result::destroy_program(self.0) } {
            tracing::warn!(%e, "destroying an NVRTC program");
        }
    }
}

/// NVRTC's options for `arch`, to PTX or to machine code alike.
fn compile_options(arch: &str) -> [String; 2] {
    [
        // Products and sums round apart, as on the CPU.
        "--fmad=false".to_owned(),
        format!("--gpu-architecture={arch}"),
    ]
}

/// NVRTC's library, found and loadable.
fn nvrtc_present() -> Result<(), CudaError> {
    libraries::ensure(libraries::NVRTC)?;
    // SAFETY: loads NVRTC's library, now found, as cudarc would.
    if unsafe { nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::MissingLibrary {
            library: libraries::NVRTC[0],
            searched: libraries::search_folders(),
        })
    }
}

fn compile(arch: &str) -> Result<Ptx, CudaError> {
    nvrtc_present()?;
    let options = CompileOptions {
        options: compile_options(arch).to_vec(),
        name: Some("training.cu".to_owned()),
        ..CompileOptions::default()
    };
    nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| CudaError::Compile {
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
    /// Loads the kernels for compute capability `(major, minor)`: as machine code for
    /// `sm_XY`, or, when that fails to compile or load (an architecture NVRTC cannot target,
    /// a driver that refuses the image), from PTX for `compute_XY`, which the driver compiles.
    /// The log says which form was loaded.
    pub(crate) fn load(
        stream: &Arc<CudaStream>,
        (major, minor): (i32, i32),
    ) -> Result<Self, CudaError> {
        let context = stream.context();
        let (machine, virtual_arch) = (
            format!("sm_{major}{minor}"),
            format!("compute_{major}{minor}"),
        );
        let cubin = compile_kernels_to_cubin(&machine).and_then(|cubin| {
            context
                .load_module(Ptx::from_binary(cubin))
                .map_err(CudaError::driver("loading the kernels' machine code"))
        });
        let module = match cubin {
            Ok(module) => {
                tracing::info!(arch = %machine, "loaded the kernels as machine code");
                module
            }
            Err(CudaError::MissingLibrary { library, searched }) => {
                return Err(CudaError::MissingLibrary { library, searched });
            }
            Err(e) => {
                tracing::warn!(arch = %machine, error = %e, "the kernels' machine code did not load: loading PTX");
                let module = context
                    .load_module(compile(&virtual_arch)?)
                    .map_err(CudaError::driver("loading the kernels' PTX"))?;
                tracing::info!(arch = %virtual_arch, "loaded the kernels as PTX");
                module
            }
        };
        Self::from_module(&module)
    }

    fn from_module(module: &Arc<CudaModule>) -> Result<Self, CudaError> {
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
