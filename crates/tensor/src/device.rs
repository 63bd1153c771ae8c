//! Where a tensor's data lives.

use std::fmt;

/// The device holding a tensor's data. Model code never names it: operations run where their
/// inputs live, so a GPU backend adds a variant here without changing any model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Device {
    /// Host memory; kernels run on rayon's thread pool.
    #[default]
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
        }
    }
}
