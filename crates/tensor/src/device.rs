//! Where a tensor's data lives.

use std::fmt;

/// The device holding a tensor's data. Operations run where their inputs live (all on one
/// device, or the operation is an error naming both), so model code names a device only when it
/// moves tensors there ([`crate::Tensor::to_device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Device {
    /// Host memory; kernels run on rayon's thread pool.
    #[default]
    Cpu,
    /// The GPU of this CUDA ordinal; kernels run on its one stream (`lockstep-cuda`).
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}
