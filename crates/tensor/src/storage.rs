//! Where a tensor's values are: host memory or one GPU's memory. Operations dispatch on it.

use std::sync::Arc;

use lockstep_cuda::{CudaBuffer, CudaDevice, CudaError};

use crate::device::Device;
use crate::error::TensorError;

/// A tensor's values. Shared (`Arc`): clones, views and detached copies of a tensor hold the
/// same storage, and no operation writes to storage after it is made.
#[derive(Clone)]
pub(crate) enum Storage {
    /// Host memory, row-major.
    Cpu(Arc<Vec<f32>>),
    /// One GPU's memory, row-major.
    Cuda(Arc<CudaBuffer>),
}

impl From<Vec<f32>> for Storage {
    fn from(values: Vec<f32>) -> Self {
        Self::Cpu(Arc::new(values))
    }
}

impl From<CudaBuffer> for Storage {
    fn from(buffer: CudaBuffer) -> Self {
        Self::Cuda(Arc::new(buffer))
    }
}

impl Storage {
    pub(crate) fn device(&self) -> Device {
        match self {
            Self::Cpu(_) => Device::Cpu,
            Self::Cuda(buffer) => Device::Cuda(buffer.device().ordinal()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Cpu(values) => values.len(),
            Self::Cuda(buffer) => buffer.len(),
        }
    }

    /// The values copied to `device` (shared, not copied, when they are there already).
    pub(crate) fn to_device(&self, device: Device) -> Result<Self, TensorError> {
        if self.device() == device {
            return Ok(self.clone());
        }
        let failed = |e: CudaError| TensorError::device("to_device", device, e);
        match (self, device) {
            (Self::Cpu(values), Device::Cuda(ordinal)) => {
                let gpu = CudaDevice::open(ordinal).map_err(failed)?;
                Ok(gpu.upload(values).map_err(failed)?.into())
            }
            (Self::Cuda(buffer), Device::Cpu) => Ok(buffer.to_host().map_err(failed)?.into()),
            (Self::Cuda(buffer), Device::Cuda(ordinal)) => {
                // Between GPUs through the host: simple, and rare in data-parallel training
                // (each replica keeps to its own GPU; gradients meet in the collectives).
                let values = buffer.to_host().map_err(failed)?;
                let gpu = CudaDevice::open(ordinal).map_err(failed)?;
                Ok(gpu.upload(&values).map_err(failed)?.into())
            }
            (Self::Cpu(_), Device::Cpu) => Ok(self.clone()),
        }
    }

    /// The values in host memory, copied from a GPU when they are on one.
    pub(crate) fn to_vec(&self) -> Result<Vec<f32>, TensorError> {
        match self {
            Self::Cpu(values) => Ok(values.to_vec()),
            Self::Cuda(buffer) => buffer
                .to_host()
                .map_err(|e| TensorError::device("to_vec", self.device(), e)),
        }
    }
}
