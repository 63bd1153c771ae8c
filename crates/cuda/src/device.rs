//! Opening a GPU: one context and one stream per device and process, the kernels compiled
//! once for its architecture, and its cuBLAS handle; freed memory stays in the device's pool.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};

use crate::buffer::CudaBuffer;
use crate::buffer_cache::BufferCache;
use crate::error::CudaError;
use crate::kernels::Kernels;
use crate::libraries;
use crate::memory_pool;
use crate::staging::Ring;

/// Devices opened so far, by ordinal: a device is opened once per process.
static OPEN: Mutex<Vec<(usize, CudaDevice)>> = Mutex::new(Vec::new());

/// The number of CUDA devices the driver sees.
///
/// # Errors
///
/// [`CudaError::NoDriver`] on a machine without the NVIDIA driver (never a panic), or the
/// driver's own error.
pub fn device_count() -> Result<usize, CudaError> {
    if !libraries::driver_present() {
        return Err(CudaError::NoDriver);
    }
    let count = CudaContext::device_count().map_err(CudaError::driver("counting devices"))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// One GPU, opened: cheap to clone, shared by every buffer on it.
///
/// Work is queued in order on the device's one stream; reading a buffer back to the host
/// waits for it.
#[derive(Clone)]
pub struct CudaDevice {
    shared: Arc<Shared>,
}

struct Shared {
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    stream: Arc<CudaStream>,
    kernels: OnceLock<Result<Kernels, CudaError>>,
    blas: OnceLock<Result<CudaBlas, String>>,
    /// Pinned buffers that uploads of values go through ([`crate::staging`]).
    staged_f32: Mutex<Ring<f32>>,
    /// The same for labels.
    staged_u32: Mutex<Ring<u32>>,
    /// Freed buffers, kept for the next allocation of their length ([`crate::buffer_cache`]).
    cache: Mutex<BufferCache>,
}

impl CudaDevice {
    /// Opens device `ordinal` (the same device on every call in a process).
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] without the NVIDIA driver, [`CudaError::NoDevice`] when the
    /// driver has no such device, or the driver's error.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, device)) = open.iter().find(|(o, _)| *o == ordinal) {
            return Ok(device.clone());
        }
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let context = CudaContext::new(ordinal).map_err(CudaError::driver("creating a context"))?;
        let name = context
            .name()
            .map_err(CudaError::driver("reading the device's name"))?;
        let capability = context
            .compute_capability()
            .map_err(CudaError::driver("reading the compute capability"))?;
        single_stream(&context);
        if let Err(e) = memory_pool::keep_freed_memory(&context) {
            tracing::warn!(ordinal, error = %e, "freed GPU memory goes back to the driver at each synchronisation");
        }
        let stream = context
            .new_stream()
            .map_err(CudaError::driver("creating a stream"))?;
        tracing::info!(ordinal, %name, ?capability, "opened a CUDA device");
        let device = Self {
            shared: Arc::new(Shared {
                ordinal,
                name,
                capability,
                stream,
                kernels: OnceLock::new(),
                blas: OnceLock::new(),
                staged_f32: Mutex::default(),
                staged_u32: Mutex::default(),
                cache: Mutex::default(),
            }),
        };
        open.push((ordinal, device.clone()));
        Ok(device)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    /// The device's name, as the driver gives it.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The compute capability, `(major, minor)`: `(9, 0)` for an H100.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.shared.capability
    }

    /// The stream all of this device's work is queued on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.shared.stream
    }

    /// A freed buffer of exactly `len` values, for reuse.
    pub(crate) fn take_cached(&self, len: usize) -> Option<CudaSlice<f32>> {
        self.shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(len)
    }

    /// Frees every buffer kept for reuse; returns how many there were.
    pub(crate) fn release_cached(&self) -> usize {
        let released = self
            .shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release();
        // Freed (driver calls) outside the lock.
        released.len()
    }

    /// Keeps a freed buffer for reuse, or frees it when the cache is full.
    pub(crate) fn keep_cached(&self, slice: CudaSlice<f32>) {
        let rejected = self
            .shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keep(slice);
        // Freed (a driver call) outside the lock.
        drop(rejected);
    }

    /// Copies `values` into the start of `dst` (at least as long), queued on the stream
    /// through a pinned buffer ([`crate::staging`]): the caller goes on while earlier work
    /// runs.
    pub(crate) fn write_f32(
        &self,
        values: &[f32],
        dst: &mut CudaSlice<f32>,
    ) -> Result<(), DriverError> {
        let stream = &self.shared.stream;
        let mut ring = self
            .shared
            .staged_f32
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.write(stream.context(), stream, values, dst)
    }

    /// A device copy of labels, queued as [`CudaDevice::write_f32`] queues its copy.
    pub(crate) fn upload_u32(&self, values: &[u32]) -> Result<CudaSlice<u32>, DriverError> {
        let stream = &self.shared.stream;
        let mut ring = self
            .shared
            .staged_u32
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.upload(stream.context(), stream, values)
    }

    /// Makes this device's context the calling thread's current one, as NCCL expects of the
    /// device a rank runs on.
    pub(crate) fn bind_to_thread(&self) -> Result<(), CudaError> {
        self.shared
            .stream
            .context()
            .bind_to_thread()
            .map_err(CudaError::driver("making the device current"))
    }

    /// The training kernels, compiled by NVRTC on first use; a failure is kept and returned
    /// again as the same error (a missing NVRTC stays [`CudaError::MissingLibrary`]).
    pub(crate) fn kernels(&self) -> Result<&Kernels, CudaError> {
        cached(&self.shared.kernels, || {
            Kernels::load(&self.shared.stream, self.shared.capability)
        })
    }

    /// The cuBLAS handle, created on first use.
    ///
    /// # Errors
    ///
    /// [`CudaError::MissingLibrary`] when cuBLAS is not found (checked on every call, so the
    /// error keeps its kind); the handle's creation error.
    pub(crate) fn blas(&self) -> Result<&CudaBlas, CudaError> {
        libraries::ensure(libraries::CUBLAS)?;
        self.shared
            .blas
            .get_or_init(|| {
                CudaBlas::new(Arc::clone(&self.shared.stream)).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|reason| CudaError::invalid("cublas", reason.clone()))
    }

    /// A buffer holding a copy of `values`.
    ///
    /// # Errors
    ///
    /// The driver's error (out of memory, a device in an error state).
    pub fn upload(&self, values: &[f32]) -> Result<CudaBuffer, CudaError> {
        CudaBuffer::upload(self, values)
    }

    /// A buffer of `len` zeros.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn zeros(&self, len: usize) -> Result<CudaBuffer, CudaError> {
        CudaBuffer::zeros(self, len)
    }

    /// Waits until every operation queued on this device has finished.
    ///
    /// # Errors
    ///
    /// The driver's error, which may come from an earlier asynchronous operation.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.shared
            .stream
            .synchronize()
            .map_err(CudaError::driver("synchronizing"))
    }
}

impl PartialEq for CudaDevice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.shared.ordinal)
            .field("name", &self.shared.name)
            .field("capability", &self.shared.capability)
            .finish_non_exhaustive()
    }
}

/// The value in `cell`, made by `init` on first use; an error is kept and each caller gets a
/// copy of it, of the same kind.
fn cached<T>(
    cell: &OnceLock<Result<T, CudaError>>,
    init: impl FnOnce() -> Result<T, CudaError>,
) -> Result<&T, CudaError> {
    cell.get_or_init(init).as_ref().map_err(CudaError::clone)
}

/// Turns off cudarc's per-buffer events, which order a buffer's uses across streams: they
/// would add an event record and a stream wait to every launch, for every buffer it touches.
#[allow(
    unsafe_code,
    reason = "cudarc marks turning its stream synchronisation off as unsafe; see the SAFETY comment"
)]
fn single_stream(context: &CudaContext) {
    // SAFETY: every buffer of a device is allocated, used and freed on the device's one stream
    // (`Shared::stream`), in queue order, and nothing has been allocated yet in this new
    // context. A second stream (for collectives, say) must order its uses itself.
    unsafe { context.disable_event_tracking() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_missing_library_stays_a_missing_library() {
        let cell: OnceLock<Result<u32, CudaError>> = OnceLock::new();
        let missing = || CudaError::MissingLibrary {
            library: "libnvrtc.so.13",
            searched: vec!["/nowhere".into()],
        };
        for _ in 0..2 {
            let err = cached(&cell, || Err(missing())).unwrap_err();
            assert!(
                matches!(&err, CudaError::MissingLibrary { library, .. } if *library == "libnvrtc.so.13"),
                "{err:?}"
            );
        }
        let ok: OnceLock<Result<u32, CudaError>> = OnceLock::new();
        assert_eq!(cached(&ok, || Ok(7)).unwrap(), &7);
        assert_eq!(cached(&ok, || Err(missing())).unwrap(), &7);
    }
}
