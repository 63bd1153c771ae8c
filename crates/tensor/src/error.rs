//! The one error type of the crate.

use crate::device::Device;

/// What went wrong in a tensor operation; every variant names the operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// Operand shapes that the operation cannot combine.
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not fit: {why}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
        /// The rule that is broken.
        why: String,
    },
    /// An argument out of its domain (a rank, an axis, a rate, a label).
    #[error("{op}: {why}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The operands' device cannot run the operation, they lie on different devices, or the
    /// device failed (out of memory, a missing driver or library).
    #[error("{op} on {device}: {why}")]
    Device {
        /// The operation.
        op: &'static str,
        /// The device it was to run on.
        device: Device,
        /// What went wrong.
        why: String,
    },
    /// A collective inside an operation failed ([`crate::ops::all_reduce_sum`]).
    #[error("{op}: the replicas could not meet: {why}")]
    Collective {
        /// The operation.
        op: &'static str,
        /// Why the collective failed.
        why: String,
    },
}

impl TensorError {
    pub(crate) fn device(op: &'static str, device: Device, why: impl std::fmt::Display) -> Self {
        Self::Device {
            op,
            device,
            why: why.to_string(),
        }
    }

    pub(crate) fn invalid(op: &'static str, why: impl Into<String>) -> Self {
        Self::InvalidArgument {
            op,
            why: why.into(),
        }
    }

    pub(crate) fn mismatch(
        op: &'static str,
        lhs: &[usize],
        rhs: &[usize],
        why: impl Into<String>,
    ) -> Self {
        Self::ShapeMismatch {
            op,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
            why: why.into(),
        }
    }
}
