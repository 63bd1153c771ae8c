//! What can go wrong between a program and a GPU, each case naming its cause.

use std::path::PathBuf;

/// An error from finding, opening or using a CUDA device.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so.1`) is not installed: no NVIDIA driver on this
    /// machine. The caller chooses between the CPU and failing.
    #[error("no CUDA driver: libcuda could not be loaded (no NVIDIA driver on this machine)")]
    NoDriver,
    /// A CUDA library other than the driver is missing.
    #[error(
        "CUDA library {library} not found on the loader path nor in {searched:?}; set \
         LOCKSTEP_CUDA_LIBRARY_PATH to the folders holding it (pip's nvidia-* wheels put them \
         in site-packages/nvidia/*/lib)"
    )]
    MissingLibrary {
        /// The library's file name, as the loader looks it up.
        library: &'static str,
        /// The folders searched beside the loader's own path.
        searched: Vec<PathBuf>,
    },
    /// A library was found in a folder `LOCKSTEP_CUDA_LIBRARY_PATH` names, but the loader finds
    /// another file under the unversioned name that cudarc asks for first, which cudarc would
    /// use instead.
    #[error(
        "{library} is taken from {named} (LOCKSTEP_CUDA_LIBRARY_PATH), but the loader finds \
         another {unversioned} at {other}, which cudarc would load instead: take its folder \
         out of LD_LIBRARY_PATH (or the loader's cache), or unset LOCKSTEP_CUDA_LIBRARY_PATH \
         to use it"
    )]
    ShadowedLibrary {
        /// The library's file name, as the loader looks it up.
        library: &'static str,
        /// The file found in a folder the variable names.
        named: PathBuf,
        /// The name cudarc tries first (`libnvrtc.so`).
        unversioned: String,
        /// The other file the loader opens under that name.
        other: PathBuf,
    },
    /// A library found in a folder `LOCKSTEP_CUDA_LIBRARY_PATH` names that the loader cannot
    /// open (another architecture, a damaged file): the folder named is not passed over for
    /// another copy.
    #[error(
        "{library} found at {} (LOCKSTEP_CUDA_LIBRARY_PATH) cannot be opened: {reason}",
        path.display()
    )]
    UnopenableLibrary {
        /// The library's file name, as the loader looks it up.
        library: &'static str,
        /// The file found.
        path: PathBuf,
        /// The loader's reason.
        reason: String,
    },
    /// The driver is there but has no device of this ordinal.
    #[error("no CUDA device {ordinal}: the driver sees {count}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver sees.
        count: usize,
    },
    /// This build of `lockstep-cuda` has no CUDA backend: it was compiled without its `cuda`
    /// feature (for example as a dependency with `default-features = false`).
    #[error(
        "no CUDA backend in this build: lockstep-cuda was compiled without its `cuda` feature \
         (enable the `cuda` feature of lockstep-tensor, lockstep-nn or lockstep-train)"
    )]
    NotBuilt,
    /// A driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {what}: {source}")]
    Driver {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// NVRTC refused the kernels' source: a bug in this crate, reported with the compiler's log.
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile {
        /// The target architecture.
        arch: String,
        /// The compiler's log, or its error when it gave no log.
        log: String,
    },
    /// A cuBLAS call failed.
    #[cfg(feature = "cuda")]
    #[error("cuBLAS: {what}: {source}")]
    Blas {
        /// What was being done.
        what: &'static str,
        /// cuBLAS's error.
        #[source]
        source: cudarc::cublas::result::CublasError,
    },
    /// An NCCL call failed (the communicator was aborted if it had been made).
    #[error("NCCL: {what}: {message}{}", code.map(|c| format!(" (code {c})")).unwrap_or_default())]
    Nccl {
        /// What was being done.
        what: &'static str,
        /// NCCL's result code, when the call returned one.
        code: Option<i32>,
        /// NCCL's description of the code and its last error message.
        message: String,
    },
    /// A collective did not finish within its timeout: some rank did not take part. The
    /// communicator was aborted and refuses every later call.
    #[error(
        "NCCL {op} on rank {rank} of {world_size} did not finish within {waited:?}: a rank did \
         not take part (NCCL cannot tell which); the communicator was aborted"
    )]
    CollectiveTimeout {
        /// The collective, or `joining the group`.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The ranks in the group.
        world_size: usize,
        /// How long this rank waited.
        waited: std::time::Duration,
    },
    /// A peer of an NCCL group is gone, as the side channel beside it tells: its process died
    /// or closed its connection. The communicator was aborted.
    #[error("NCCL {op} on rank {rank}: rank {peer} is gone ({why}); the communicator was aborted")]
    PeerLost {
        /// The collective that was waiting.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The rank that is gone.
        peer: usize,
        /// What the side channel saw.
        why: String,
    },
    /// Buffers of the wrong length, or from another device, were passed to an operation.
    #[error("{op}: {reason}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl CudaError {
    #[cfg(feature = "cuda")]
    pub(crate) fn driver(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Driver { what, source }
    }

    #[cfg_attr(
        not(feature = "cuda"),
        allow(dead_code, reason = "the operations' checks")
    )]
    pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            op,
            reason: reason.into(),
        }
    }
}
