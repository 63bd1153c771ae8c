//! A build without the `cuda` feature has no NCCL: every call names the missing feature, and no
//! communicator exists.

use std::convert::Infallible;
use std::ops::Range;
use std::time::Duration;

use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;

/// NCCL's version: [`CudaError::NotBuilt`] without the `cuda` feature.
///
/// # Errors
///
/// [`CudaError::NotBuilt`].
pub fn version() -> Result<(u32, u32, u32), CudaError> {
    Err(CudaError::NotBuilt)
}

/// Whether NCCL can be loaded: never without the `cuda` feature.
pub fn available() -> bool {
    false
}

/// The 128 bytes that name one NCCL group.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; 128]);

#[allow(
    missing_docs,
    clippy::missing_errors_doc,
    reason = "the `cuda` build documents each"
)]
impl UniqueId {
    pub fn new() -> Result<Self, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub fn to_bytes(self) -> [u8; 128] {
        self.0
    }

    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// What a communicator asks, while it waits, whether a peer is known to be gone.
pub type PeerCheck = Box<dyn FnMut() -> Option<(usize, String)> + Send>;

/// One rank's handle on an NCCL group. Without the `cuda` feature no value of this type exists.
#[derive(Debug)]
pub struct NcclComm {
    never: Infallible,
}

#[allow(
    missing_docs,
    clippy::missing_errors_doc,
    reason = "the `cuda` build documents each"
)]
impl NcclComm {
    pub fn join(
        _device: &CudaDevice,
        _id: UniqueId,
        _rank_of: (usize, usize),
        _timeout: Duration,
    ) -> Result<Self, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub fn join_watched(
        _device: &CudaDevice,
        _id: UniqueId,
        _rank_of: (usize, usize),
        _timeout: Duration,
        _peers: Option<PeerCheck>,
    ) -> Result<Self, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub fn local_group(
        _devices: &[CudaDevice],
        _timeout: Duration,
    ) -> Result<Vec<Self>, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub fn set_peer_check(&mut self, _peers: PeerCheck) {
        match self.never {}
    }

    pub fn rank(&self) -> usize {
        match self.never {}
    }

    pub fn world_size(&self) -> usize {
        match self.never {}
    }

    pub fn device(&self) -> &CudaDevice {
        match self.never {}
    }

    pub fn timeout(&self) -> Duration {
        match self.never {}
    }

    pub fn all_reduce_sum(&mut self, _buffer: &mut CudaBuffer) -> Result<(), CudaError> {
        match self.never {}
    }

    pub fn all_reduce_sum_range(
        &mut self,
        _buffer: &mut CudaBuffer,
        _range: Range<usize>,
    ) -> Result<(), CudaError> {
        match self.never {}
    }

    pub fn broadcast(&mut self, _buffer: &mut CudaBuffer, _root: usize) -> Result<(), CudaError> {
        match self.never {}
    }
}
