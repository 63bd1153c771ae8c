//! NCCL: all-reduce and broadcast of GPU buffers among the GPUs of one process or of many, on
//! each device's one stream, with a deadline on every wait.
//!
//! The library is opened at run time, as the others: `libnccl.so.2` in
//! `LOCKSTEP_CUDA_LIBRARY_PATH`, on the loader's path or in pip's `site-packages/nvidia/nccl/lib` (the
//! `nvidia-nccl-cu13` wheel that PyTorch installs). Its types are cudarc's (`cudarc::nccl::sys`,
//! the layout of NCCL 2.28); its functions are looked up here, in the library found, because
//! cudarc's loader asks for `libnccl.so` or `libnccl.so.13` by name (the wheel has neither)
//! and panics when it finds none, and because each result is read here as the integer NCCL
//! returns, so a code newer than these bindings is an error, never an invalid enum.
//!
//! **No hang.** Every communicator is non-blocking (NCCL's `blocking = 0`): joining and each
//! collective return at once, and this module waits for them itself, polling NCCL's
//! asynchronous error, the stream's progress and the caller's [`PeerCheck`] (a side channel
//! that can tell a dead peer process) until the communicator's timeout. When the timeout
//! passes or a peer is known dead, the communicator is aborted (`ncclCommAbort`, which also
//! stops its kernels on the device) and the call returns [`CudaError::CollectiveTimeout`] or
//! [`CudaError::PeerLost`]; an aborted communicator refuses every later call.
//!
//! **One stream.** A collective is queued on its device's stream, after the work queued
//! before it (the backward pass that wrote the gradients) and before the work queued after it
//! (the update that reads them), so no other ordering is needed (invariant 8).

#![allow(
    unsafe_code,
    reason = "calls into NCCL, a C library; see each SAFETY comment"
)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ops::Range;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::DevicePtrMut;
use cudarc::nccl::sys::{ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::buffer::CudaBuffer;
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::libraries;

/// NCCL's result codes that this module tells apart.
const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;

/// `NCCL_CONFIG_INITIALIZER`'s magic number, which NCCL checks.
const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// The version of the configuration's layout (NCCL 2.28's), `NCCL_VERSION(2, 28, 0)`.
const CONFIG_VERSION: u32 = 22_800;

/// `NCCL_CONFIG_UNDEF_INT`: a field NCCL chooses itself.
const UNDEFINED: c_int = c_int::MIN;

/// The functions this module calls, looked up once in the library.
struct Functions {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> c_int,
    init_rank_config: unsafe extern "C" fn(
        *mut ncclComm_t,
        c_int,
        ncclUniqueId,
        c_int,
        *mut ncclConfig_t,
    ) -> c_int,
    async_error: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int,
    abort: unsafe extern "C" fn(ncclComm_t) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudarc::driver::sys::CUstream,
    ) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudarc::driver::sys::CUstream,
    ) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    /// Kept open while the functions above are used: for the life of the process.
    _library: Library,
}

static FUNCTIONS: OnceLock<Result<Functions, CudaError>> = OnceLock::new();

/// NCCL's functions, from the library opened on first use; the same error on every call when
/// it is missing.
fn functions() -> Result<&'static Functions, CudaError> {
    FUNCTIONS
        .get_or_init(load)
        .as_ref()
        .map_err(CudaError::clone)
}

fn load() -> Result<Functions, CudaError> {
    libraries::ensure(libraries::NCCL)?;
    let name = libraries::NCCL[0];
    // SAFETY: `ensure` opened NVIDIA's NCCL under this name already; opening it again by its
    // soname returns the same handle and runs no initialiser a second time.
    let library = unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        CudaError::Nccl {
            what: "opening the library",
            code: None,
            message: e.to_string(),
        }
    })?;
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL's exported function of that name, whose C signature
            // (nccl.h, 2.18 to 2.28) is the field's type; results are read as `int`.
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                CudaError::Nccl {
                    what: concat!("looking up ", $name),
                    code: None,
                    message: e.to_string(),
                }
            })?
        };
    }
    Ok(Functions {
        get_version: symbol!("ncclGetVersion"),
        get_unique_id: symbol!("ncclGetUniqueId"),
        init_rank_config: symbol!("ncclCommInitRankConfig"),
        async_error: symbol!("ncclCommGetAsyncError"),
        abort: symbol!("ncclCommAbort"),
        all_reduce: symbol!("ncclAllReduce"),
        broadcast: symbol!("ncclBroadcast"),
        error_string: symbol!("ncclGetErrorString"),
        last_error: symbol!("ncclGetLastError"),
        _library: library,
    })
}

/// A C string from NCCL, or nothing.
fn text(pointer: *const c_char) -> String {
    if pointer.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns NUL-terminated static strings (or its thread's last error).
    unsafe { CStr::from_ptr(pointer) }
        .to_string_lossy()
        .into_owned()
}

/// `code` as an error of `what`, with NCCL's description and its last error message.
fn failure(nccl: &Functions, what: &'static str, code: c_int, comm: ncclComm_t) -> CudaError {
    // SAFETY: both accept any code, and any communicator or null.
    let described = text(unsafe { (nccl.error_string)(code) });
    let last = text(unsafe { (nccl.last_error)(comm) });
    CudaError::Nccl {
        what,
        code: Some(code),
        message: if last.is_empty() {
            described
        } else {
            format!("{described}: {last}")
        },
    }
}

/// NCCL's version as `(major, minor, patch)`.
///
/// # Errors
///
/// [`CudaError::MissingLibrary`] when NCCL is not found.
pub fn version() -> Result<(u32, u32, u32), CudaError> {
    let nccl = functions()?;
    let mut code: c_int = 0;
    // SAFETY: writes one int.
    let result = unsafe { (nccl.get_version)(&raw mut code) };
    if result != SUCCESS {
        return Err(failure(
            nccl,
            "reading the version",
            result,
            std::ptr::null_mut(),
        ));
    }
    let code = u32::try_from(code).unwrap_or(0);
    Ok((code / 10_000, code / 100 % 100, code % 100))
}

/// Whether NCCL can be loaded (on a machine with the NVIDIA driver): what `AUTO` asks before
/// it picks NCCL.
pub fn available() -> bool {
    libraries::driver_present() && functions().is_ok()
}

/// The 128 bytes that name one NCCL group: made by one rank, sent to the others (over the
/// cluster's authenticated rendezvous between processes), and given by each to
/// [`NcclComm::join`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; 128]);

impl UniqueId {
    /// A new group's identity (NCCL opens the listening socket its ranks will meet on).
    ///
    /// # Errors
    ///
    /// [`CudaError::MissingLibrary`] without NCCL; NCCL's error.
    pub fn new() -> Result<Self, CudaError> {
        let nccl = functions()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes one `ncclUniqueId`.
        let result = unsafe { (nccl.get_unique_id)(&raw mut id) };
        if result != SUCCESS {
            return Err(failure(
                nccl,
                "making a unique id",
                result,
                std::ptr::null_mut(),
            ));
        }
        Ok(Self(id.internal.map(|c| c.to_ne_bytes()[0])))
    }

    /// The bytes to send to the other ranks.
    pub fn to_bytes(self) -> [u8; 128] {
        self.0
    }

    /// An identity received from the rank that made it.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // An address and a random magic: not a secret, but nothing a log needs.
        f.write_str("UniqueId(..)")
    }
}

/// What a communicator asks, while it waits, whether a peer is known to be gone: a side
/// channel (the cluster's TCP connections) that sees a peer process die in seconds, where NCCL
/// would wait for the timeout. `Some((rank, why))` aborts the wait.
pub type PeerCheck = Box<dyn FnMut() -> Option<(usize, String)> + Send>;

/// One rank's handle on an NCCL group, on one device.
pub struct NcclComm {
    comm: ncclComm_t,
    device: CudaDevice,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    peers: Option<PeerCheck>,
    /// Set once aborted: every later call is refused with this error.
    failed: Option<CudaError>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `&mut self`
// on every call gives that.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins group `id` as `rank` of `world_size` on `device`, waiting up to `timeout` for every
    /// other rank to join.
    ///
    /// # Errors
    ///
    /// [`CudaError::MissingLibrary`] without NCCL; [`CudaError::CollectiveTimeout`] when the
    /// group is not complete within `timeout` (the communicator is aborted); NCCL's error.
    pub fn join(
        device: &CudaDevice,
        id: UniqueId,
        rank_of: (usize, usize),
        timeout: Duration,
    ) -> Result<Self, CudaError> {
        Self::join_watched(device, id, rank_of, timeout, None)
    }

    /// As [`NcclComm::join`], asking `peers` while it waits (and every later collective)
    /// whether a peer is known to be gone.
    ///
    /// # Errors
    ///
    /// As [`NcclComm::join`]; [`CudaError::PeerLost`] when `peers` names a peer gone.
    pub fn join_watched(
        device: &CudaDevice,
        id: UniqueId,
        (rank, world_size): (usize, usize),
        timeout: Duration,
        peers: Option<PeerCheck>,
    ) -> Result<Self, CudaError> {
        let nccl = functions()?;
        if rank >= world_size {
            return Err(CudaError::invalid(
                "nccl",
                format!("rank {rank} of a group of {world_size}"),
            ));
        }
        let too_large = |_| CudaError::invalid("nccl", format!("a group of {world_size} ranks"));
        let (nranks, me) = (
            c_int::try_from(world_size).map_err(too_large)?,
            c_int::try_from(rank).map_err(too_large)?,
        );
        device.bind_to_thread()?;
        let mut config = non_blocking_config();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        let id = ncclUniqueId {
            internal: id.0.map(|b| c_char::from_ne_bytes([b])),
        };
        // SAFETY: `comm` and `config` outlive the call; NCCL copies the configuration. The
        // device is current on this thread, as NCCL requires of the rank's device.
        let result =
            unsafe { (nccl.init_rank_config)(&raw mut comm, nranks, id, me, &raw mut config) };
        if result != SUCCESS && result != IN_PROGRESS {
            return Err(failure(nccl, "joining the group", result, comm));
        }
        let mut joined = Self {
            comm,
            device: device.clone(),
            rank,
            world_size,
            timeout,
            peers,
            failed: None,
        };
        joined.settle("joining the group", Instant::now())?;
        tracing::debug!(
            rank,
            world_size,
            ordinal = device.ordinal(),
            "joined an NCCL group"
        );
        Ok(joined)
    }

    /// One communicator per device of this process, ranks in the order given, each joined on a
    /// thread of its own (NCCL needs every rank of a group joining at once).
    ///
    /// # Errors
    ///
    /// As [`NcclComm::join`]; the first rank's error.
    pub fn local_group(devices: &[CudaDevice], timeout: Duration) -> Result<Vec<Self>, CudaError> {
        let id = UniqueId::new()?;
        let world_size = devices.len();
        std::thread::scope(|scope| {
            let joining: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, device)| {
                    scope.spawn(move || Self::join(device, id, (rank, world_size), timeout))
                })
                .collect();
            joining
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(CudaError::invalid(
                            "nccl",
                            "a rank's thread panicked while joining",
                        ))
                    })
                })
                .collect()
        })
    }

    /// Sets the side channel asked, while waiting, whether a peer is gone.
    pub fn set_peer_check(&mut self, peers: PeerCheck) {
        self.peers = Some(peers);
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The device this rank's buffers live on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// How long a collective may wait for the others.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sums `buffer` over every rank, in place, and waits until the sum is in `buffer` (a group
    /// of one rank only queues the call: see [`NcclComm::all_reduce_sum_range`]).
    ///
    /// # Errors
    ///
    /// As [`NcclComm::all_reduce_sum_range`].
    pub fn all_reduce_sum(&mut self, buffer: &mut CudaBuffer) -> Result<(), CudaError> {
        let len = buffer.len();
        self.all_reduce_sum_range(buffer, 0..len)
    }

    /// Sums `buffer[range]` over every rank, in place (one NCCL call), and waits until the sum
    /// is there. A group of one rank does not wait: nothing but its own stream can hold the
    /// call up, and work queued after it on that stream runs after it.
    ///
    /// # Errors
    ///
    /// A buffer on another device or a range outside it; [`CudaError::CollectiveTimeout`] when
    /// the others do not take part within the timeout, [`CudaError::PeerLost`] when the side
    /// channel says a peer is gone (both abort the communicator); NCCL's error.
    pub fn all_reduce_sum_range(
        &mut self,
        buffer: &mut CudaBuffer,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        self.check("all_reduce", buffer, &range)?;
        let nccl = functions()?;
        let started = Instant::now();
        let stream = self.device.stream().clone();
        let (pointer, _record) = buffer.slice_mut().device_ptr_mut(&stream);
        let at = pointer + (range.start * size_of::<f32>()) as u64;
        self.device.bind_to_thread()?;
        // SAFETY: `at .. at + range.len()` f32 values lie inside the buffer (checked above),
        // which stays borrowed until the sum has finished (`settle` and `finish` wait for it);
        // the stream is the buffer's device's.
        let result = unsafe {
            (nccl.all_reduce)(
                at as *const c_void,
                at as *mut c_void,
                range.len(),
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream(),
            )
        };
        self.complete("all_reduce", result, started)
    }

    /// Copies `root`'s `buffer` into every other rank's, and waits until it is there (a group
    /// of one rank only queues the call).
    ///
    /// # Errors
    ///
    /// As [`NcclComm::all_reduce_sum_range`], and a `root` outside the group.
    pub fn broadcast(&mut self, buffer: &mut CudaBuffer, root: usize) -> Result<(), CudaError> {
        let len = buffer.len();
        self.check("broadcast", buffer, &(0..len))?;
        let nccl = functions()?;
        let root = c_int::try_from(root)
            .ok()
            .filter(|&r| (r as usize) < self.world_size)
            .ok_or_else(|| {
                CudaError::invalid(
                    "broadcast",
                    format!("root {root} of {} ranks", self.world_size),
                )
            })?;
        let started = Instant::now();
        let stream = self.device.stream().clone();
        let (pointer, _record) = buffer.slice_mut().device_ptr_mut(&stream);
        self.device.bind_to_thread()?;
        // SAFETY: as in `all_reduce_sum_range`, over the whole buffer.
        let result = unsafe {
            (nccl.broadcast)(
                pointer as *const c_void,
                pointer as *mut c_void,
                len,
                ncclDataType_t::ncclFloat32,
                root,
                self.comm,
                stream.cu_stream(),
            )
        };
        self.complete("broadcast", result, started)
    }

    /// Waits for the collective `op` just queued (NCCL answered `result`) until it has
    /// finished on the device (in a group of more than one rank), or fails it.
    fn complete(
        &mut self,
        op: &'static str,
        result: c_int,
        started: Instant,
    ) -> Result<(), CudaError> {
        if result != SUCCESS && result != IN_PROGRESS {
            let nccl = functions()?;
            return Err(self.fail(failure(nccl, op, result, self.comm)));
        }
        self.settle(op, started)?;
        if self.world_size == 1 {
            // No peer can hold up a group of one: its collective finishes on its own, and the
            // stream orders whatever is queued after it. Not waiting lets the host queue the
            // next step's work while this one's still runs.
            return Ok(());
        }
        self.finish(op, started)
    }

    /// Refuses a call on an aborted communicator, a buffer of another device, a bad range.
    fn check(
        &self,
        op: &'static str,
        buffer: &CudaBuffer,
        range: &Range<usize>,
    ) -> Result<(), CudaError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if buffer.device() != &self.device {
            return Err(CudaError::invalid(
                op,
                format!(
                    "a buffer on device {} for the communicator of device {}",
                    buffer.device().ordinal(),
                    self.device.ordinal()
                ),
            ));
        }
        if range.start > range.end || range.end > buffer.len() {
            return Err(CudaError::invalid(
                op,
                format!("values {range:?} of a buffer of {}", buffer.len()),
            ));
        }
        Ok(())
    }

    /// Waits until NCCL has finished the non-blocking call just made (joining, or queueing a
    /// collective on the stream).
    fn settle(&mut self, op: &'static str, started: Instant) -> Result<(), CudaError> {
        let nccl = functions()?;
        let mut poll = Poll::new();
        loop {
            let mut state: c_int = IN_PROGRESS;
            // SAFETY: a communicator made by `init_rank_config`, not yet aborted.
            let result = unsafe { (nccl.async_error)(self.comm, &raw mut state) };
            if result != SUCCESS {
                return Err(self.fail(failure(nccl, op, result, self.comm)));
            }
            match state {
                SUCCESS => return Ok(()),
                IN_PROGRESS => self.keep_waiting(op, started, &mut poll)?,
                code => return Err(self.fail(failure(nccl, op, code, self.comm))),
            }
        }
    }

    /// Waits until the collective queued last has finished on the device.
    fn finish(&mut self, op: &'static str, started: Instant) -> Result<(), CudaError> {
        let nccl = functions()?;
        let done = self
            .device
            .stream()
            .record_event(None)
            .map_err(CudaError::driver("recording an event after a collective"))?;
        let mut poll = Poll::new();
        loop {
            if done
                .try_is_complete()
                .map_err(CudaError::driver("waiting for a collective"))?
            {
                return Ok(());
            }
            let mut state: c_int = SUCCESS;
            // SAFETY: as in `settle`.
            let result = unsafe { (nccl.async_error)(self.comm, &raw mut state) };
            if result != SUCCESS || (state != SUCCESS && state != IN_PROGRESS) {
                let code = if result == SUCCESS { state } else { result };
                return Err(self.fail(failure(nccl, op, code, self.comm)));
            }
            self.keep_waiting(op, started, &mut poll)?;
        }
    }

    /// One more poll, or the error that ends the wait: the timeout passed, or a peer is gone.
    fn keep_waiting(
        &mut self,
        op: &'static str,
        started: Instant,
        poll: &mut Poll,
    ) -> Result<(), CudaError> {
        if let Some((rank, why)) = self.peers.as_mut().and_then(|check| check()) {
            return Err(self.fail(CudaError::PeerLost {
                op,
                rank: self.rank,
                peer: rank,
                why,
            }));
        }
        let waited = started.elapsed();
        if waited >= self.timeout {
            return Err(self.fail(CudaError::CollectiveTimeout {
                op,
                rank: self.rank,
                world_size: self.world_size,
                waited,
            }));
        }
        poll.pause();
        Ok(())
    }

    /// Aborts the communicator (its kernels stop on the device) and keeps `error` for every
    /// later call.
    fn fail(&mut self, error: CudaError) -> CudaError {
        if self.failed.is_none() {
            if let Ok(nccl) = functions() {
                // SAFETY: a communicator made by `init_rank_config`, aborted once.
                let result = unsafe { (nccl.abort)(self.comm) };
                if result != SUCCESS {
                    tracing::warn!(code = result, "ncclCommAbort failed");
                }
            }
            tracing::error!(rank = self.rank, %error, "NCCL communicator aborted");
            self.failed = Some(error.clone());
        }
        error
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.failed.is_none()
            && let Ok(nccl) = functions()
        {
            if self.world_size == 1 {
                // A group of one queues its calls without waiting: let them finish (they wait
                // for no one) before the communicator goes.
                if let Err(e) = self.device.synchronize() {
                    tracing::warn!(error = %e, "waiting for a one-rank collective before closing its communicator");
                }
            }
            // Abort rather than destroy: it never waits for the other ranks, and frees the same
            // resources; every collective of this rank has finished (each call of a group of
            // several waits; a group of one was waited for above).
            // SAFETY: a communicator made by `init_rank_config`, not aborted before.
            unsafe { (nccl.abort)(self.comm) };
        }
    }
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.device.ordinal())
            .field("failed", &self.failed.is_some())
            .finish_non_exhaustive()
    }
}

/// NCCL 2.28's `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
fn non_blocking_config() -> ncclConfig_t {
    ncclConfig_t {
        size: size_of::<ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: CONFIG_VERSION,
        blocking: 0,
        cgaClusterSize: UNDEFINED,
        minCTAs: UNDEFINED,
        maxCTAs: UNDEFINED,
        netName: std::ptr::null(),
        splitShare: UNDEFINED,
        trafficClass: UNDEFINED,
        commName: std::ptr::null(),
        collnetEnable: UNDEFINED,
        CTAPolicy: UNDEFINED,
        shrinkShare: UNDEFINED,
        nvlsCTAs: UNDEFINED,
        nChannelsPerNetPeer: UNDEFINED,
        nvlinkCentricSched: UNDEFINED,
    }
}

/// How a wait polls: spinning for the first 200 µs (a collective of a training step usually
/// ends within them), then yielding, then sleeping 100 µs between polls.
struct Poll {
    started: Instant,
}

impl Poll {
    fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }

    fn pause(&self) {
        let waited = self.started.elapsed();
        if waited < Duration::from_micros(200) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
