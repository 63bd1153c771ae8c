//! Strategies: how many replicas train in sync, where they run, and how their gradients meet.
//!
//! Every strategy gives each replica on this process one handle on a two-level group
//! ([`HierarchicalCommunicator`]): the process's replicas reduce in shared memory, and the
//! first of them all-reduces with the other processes. One process and one replica is the
//! degenerate case, so the training loop has one shape for all three strategies.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lockstep_cluster::Cluster;
use lockstep_collective::{
    CollectiveError, CommunicationOptions, Communicator, Element, HierarchicalCommunicator,
    Implementation, LocalTransport, ReduceOp, TcpOptions, TcpTransport,
};
use lockstep_cuda::nccl::{self, NcclComm, UniqueId};
use lockstep_data::InputContext;
use lockstep_tensor::Device;
use lockstep_tensor::ops::AllReduceSum;

use crate::error::TrainError;
use crate::peer_watch::PeerWatch;

/// What a strategy hands a model: one [`ReplicaLink`] per replica on this process, and where
/// this process stands in the cluster.
pub trait Strategy: Send {
    /// Replicas across all processes that train in lockstep.
    fn num_replicas_in_sync(&self) -> usize;

    /// This process's part of the input, as `tf.distribute.InputContext`.
    fn input_context(&self) -> InputContext;

    /// Whether this process writes checkpoints and logs (the chief; worker 0 without one).
    fn is_chief(&self) -> bool;

    /// This process's task, for logs and per-task temporary files: `worker:1`.
    fn task(&self) -> String;

    /// The collective handles of this process's replicas, taken once by the model built under
    /// the strategy.
    ///
    /// # Errors
    ///
    /// When they were taken already.
    fn take_replicas(&mut self) -> Result<Vec<ReplicaLink>, TrainError>;
}

impl<S: Strategy + ?Sized> Strategy for Box<S> {
    fn num_replicas_in_sync(&self) -> usize {
        (**self).num_replicas_in_sync()
    }

    fn input_context(&self) -> InputContext {
        (**self).input_context()
    }

    fn is_chief(&self) -> bool {
        (**self).is_chief()
    }

    fn task(&self) -> String {
        (**self).task()
    }

    fn take_replicas(&mut self) -> Result<Vec<ReplicaLink>, TrainError> {
        (**self).take_replicas()
    }
}

/// One replica's handle on all replicas of all processes, and the device it runs on.
pub struct ReplicaLink {
    link: Arc<Mutex<Link>>,
    rank: usize,
    device: Device,
    /// This replica's NCCL communicator, when its gradients are summed on the GPUs.
    nccl: Option<NcclComm>,
    /// Whether that communicator reaches only this process's replicas while other processes
    /// train too: their sums then come over the link, from the process's first replica.
    nccl_within_process: bool,
    /// What this process's replicas know of the others, where NCCL waits on them.
    watch: Option<Arc<PeerWatch>>,
}

enum Link {
    InProcess(HierarchicalCommunicator<LocalTransport>),
    Cluster(HierarchicalCommunicator<TcpTransport>),
}

impl Link {
    fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        match self {
            Link::InProcess(c) => c.all_reduce(data, op),
            Link::Cluster(c) => c.all_reduce(data, op),
        }
    }
}

/// A look at one replica's connections to the other processes, from a thread that is not the
/// replica's own: what a wait outside the link (NCCL's) asks to learn that a worker died.
pub(crate) struct LinkProbe(Arc<Mutex<Link>>);

impl LinkProbe {
    /// The other process found gone, if any: its rank among processes and the error that
    /// names it. Reads what has arrived without waiting; while the replica's own thread is in a
    /// collective on the link (it holds the lock) there is nothing to look at, and `None`.
    pub(crate) fn lost_process(&self) -> Option<CollectiveError> {
        let mut link = match self.0.try_lock() {
            Ok(link) => link,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let checked = match &mut *link {
            Link::InProcess(c) => c.check_peers(),
            Link::Cluster(c) => c.check_peers(),
        };
        checked.err()
    }
}

/// A replica's link as the sum layers reduce with inside a pass (a synchronised batch
/// normalization's statistics).
struct SumAcross(Arc<Mutex<Link>>);

impl AllReduceSum for SumAcross {
    fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .all_reduce(values, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    }
}

/// A replica's link as a thread that outlives a step holds it: the thread that sums a step's
/// packs while the next step's forward pass goes on.
pub(crate) struct PackLink(Arc<Mutex<Link>>);

impl PackLink {
    pub(crate) fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .all_reduce(data, op)
    }
}

impl ReplicaLink {
    /// A handle on this link for [`PackLink`]'s thread.
    pub(crate) fn pack_link(&self) -> PackLink {
        PackLink(Arc::clone(&self.link))
    }

    fn new(link: Link) -> Self {
        let rank = match &link {
            Link::InProcess(c) => c.rank(),
            Link::Cluster(c) => c.rank(),
        };
        Self {
            link: Arc::new(Mutex::new(link)),
            rank,
            device: Device::Cpu,
            nccl: None,
            nccl_within_process: false,
            watch: None,
        }
    }

    /// The NCCL communicator that sums this replica's gradients on its GPU, if any.
    pub(crate) fn nccl_mut(&mut self) -> Option<&mut NcclComm> {
        self.nccl.as_mut()
    }

    /// Whether this replica's gradients are summed by NCCL.
    pub fn uses_nccl(&self) -> bool {
        self.nccl.is_some()
    }

    /// Whether NCCL sums only this process's replicas, and other processes' sums come over the
    /// cluster's connections (NCCL within each worker, the TCP ring between workers).
    pub fn nccl_within_process(&self) -> bool {
        self.nccl_within_process
    }

    /// Tells the process's other replicas, waiting in NCCL for this one, that it failed with
    /// `error` (a lost peer process is named as such).
    pub(crate) fn tell_process_failed(&self, error: &TrainError) {
        if let Some(watch) = &self.watch {
            watch.fail(self.rank, error);
        }
    }

    /// Whether this replica is its process's first, the one that talks to other processes.
    pub(crate) fn is_process_first(&self) -> bool {
        match &*self.lock() {
            Link::InProcess(c) => c.talks_to_processes(),
            Link::Cluster(c) => c.talks_to_processes(),
        }
    }

    /// The device this replica's model runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    fn lock(&self) -> MutexGuard<'_, Link> {
        // A replica whose thread panicked mid-collective fails the step; its link's state is
        // the collective's to judge, not the lock's.
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This replica's index among all replicas in sync.
    pub fn replica_id(&self) -> usize {
        self.rank
    }

    /// The handle a forward pass reduces across replicas with
    /// ([`lockstep_nn::ForwardContext::with_replicas`]).
    pub(crate) fn sum_across(&self) -> Arc<dyn AllReduceSum> {
        Arc::new(SumAcross(Arc::clone(&self.link)))
    }

    pub(crate) fn all_reduce<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.lock().all_reduce(data, op)
    }

    /// A handle that looks at this replica's connections to other processes from any thread
    /// ([`LinkProbe::lost_process`]).
    pub(crate) fn probe(&self) -> LinkProbe {
        LinkProbe(Arc::clone(&self.link))
    }

    /// The options this replica's collectives run with.
    pub(crate) fn options(&self) -> CommunicationOptions {
        match &*self.lock() {
            Link::InProcess(c) => *c.options(),
            Link::Cluster(c) => *c.options(),
        }
    }

    /// Whether this replica's collectives may spin while they wait.
    pub(crate) fn set_spinning(&mut self, spinning: bool) {
        match &mut *self.lock() {
            Link::InProcess(c) => c.set_spinning(spinning),
            Link::Cluster(c) => c.set_spinning(spinning),
        }
    }

    /// The number of processes the replicas are in.
    pub(crate) fn processes(&self) -> usize {
        match &*self.lock() {
            Link::InProcess(c) => c.processes(),
            Link::Cluster(c) => c.processes(),
        }
    }

    /// The number of replicas in sync, over every process.
    pub(crate) fn world_size(&self) -> usize {
        match &*self.lock() {
            Link::InProcess(c) => c.world_size(),
            Link::Cluster(c) => c.world_size(),
        }
    }

    pub(crate) fn broadcast<E: Element>(&mut self, data: &mut [E]) -> Result<(), CollectiveError> {
        match &mut *self.lock() {
            Link::InProcess(c) => c.broadcast(data),
            Link::Cluster(c) => c.broadcast(data),
        }
    }

    /// An all-reduce among processes, from this process's first replica only.
    pub(crate) fn all_reduce_processes<E: Element>(
        &mut self,
        data: &mut [E],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        match &mut *self.lock() {
            Link::InProcess(c) => c.all_reduce_processes(data, op),
            Link::Cluster(c) => c.all_reduce_processes(data, op),
        }
    }
}

fn in_process(replicas: usize, options: CommunicationOptions) -> Vec<ReplicaLink> {
    let cross = LocalTransport::group(1).pop();
    cross
        .map(|cross| {
            HierarchicalCommunicator::group(replicas, cross, options)
                .into_iter()
                .map(|c| ReplicaLink::new(Link::InProcess(c)))
                .collect()
        })
        .unwrap_or_default()
}

fn taken() -> TrainError {
    TrainError::invalid(
        "strategy",
        "its replicas belong to a model built before; build one model per strategy",
    )
}

/// `k` replicas in this process, one thread each, whose gradients are all-reduced in place
/// in shared memory, as `tf.distribute.MirroredStrategy` over `k` devices.
///
/// [`MirroredStrategy::new`] places `k` replicas on the CPU; [`MirroredStrategy::all_devices`]
/// one on each GPU this process sees (the CPU when it sees none), as TensorFlow's
/// `MirroredStrategy()`; [`MirroredStrategy::with_devices`] on the devices named.
pub struct MirroredStrategy {
    count: usize,
    replicas: Option<Vec<ReplicaLink>>,
}

/// Every GPU this process sees (`CUDA_VISIBLE_DEVICES` limits them, as the driver applies
/// it), or the CPU alone when it sees none; says which in the log, as TensorFlow does.
pub fn visible_devices() -> Vec<Device> {
    match lockstep_cuda::device_count() {
        Ok(count) if count > 0 => {
            let devices: Vec<Device> = (0..count).map(Device::Cuda).collect();
            let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
            tracing::info!(devices = %names.join(", "), "replicas on every visible GPU");
            devices
        }
        Ok(_) => {
            tracing::info!("no GPU visible: one replica on the CPU");
            vec![Device::Cpu]
        }
        Err(e) => {
            tracing::info!(reason = %e, "no GPU usable: one replica on the CPU");
            vec![Device::Cpu]
        }
    }
}

/// Checks that every device in `devices` can be used and none is named twice.
fn check_devices(strategy: &'static str, devices: &[Device]) -> Result<(), TrainError> {
    if devices.is_empty() {
        return Err(TrainError::invalid(strategy, "needs at least one device"));
    }
    for (i, device) in devices.iter().enumerate() {
        if *device != Device::Cpu && devices[..i].contains(device) {
            return Err(TrainError::invalid(
                strategy,
                format!("{device} is named twice: one replica per GPU"),
            ));
        }
        if let Err(e) = lockstep_tensor::Tensor::scalar(0.0).to_device(*device) {
            return Err(TrainError::invalid(
                strategy,
                format!("{device} cannot be used: {e}"),
            ));
        }
    }
    Ok(())
}

/// Puts replica `i` of `links` on `devices[i]`.
fn place(mut links: Vec<ReplicaLink>, devices: &[Device]) -> Vec<ReplicaLink> {
    for (link, device) in links.iter_mut().zip(devices) {
        link.device = *device;
    }
    links
}

/// The options of the host's collectives (the step's totals, the chief's broadcast), which run
/// on the CPU's transports whatever sums the gradients: `options` with NCCL's place taken by
/// `Auto`.
fn host_options(options: CommunicationOptions) -> CommunicationOptions {
    CommunicationOptions {
        implementation: match options.implementation {
            Implementation::Nccl => Implementation::Auto,
            other => other,
        },
        ..options
    }
}

/// The CUDA ordinal of each of `devices`, or `None` when one is not a GPU.
fn gpu_ordinals(devices: &[Device]) -> Option<Vec<usize>> {
    devices
        .iter()
        .map(|d| {
            if let Device::Cuda(ordinal) = d {
                Some(*ordinal)
            } else {
                None
            }
        })
        .collect()
}

/// One NCCL group of this process's GPUs `ordinals`, a communicator each, in their order;
/// errors name `strategy`.
fn local_nccl_group(
    strategy: &'static str,
    ordinals: &[usize],
    timeout: Duration,
) -> Result<Vec<NcclComm>, TrainError> {
    let gpus = ordinals
        .iter()
        .map(|&o| lockstep_cuda::CudaDevice::open(o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TrainError::invalid(strategy, e.to_string()))?;
    NcclComm::local_group(&gpus, timeout)
        .map_err(|e| TrainError::invalid(strategy, format!("NCCL: {e}")))
}

/// Gives each replica of `links` (on `devices`) an NCCL communicator where `options` ask for
/// NCCL, or leave the choice to Lockstep (`Auto`) and every replica is on a GPU and NCCL can be
/// loaded, as TensorFlow's `MirroredStrategy` picks `NcclAllReduce` on GPUs.
fn with_nccl(
    mut links: Vec<ReplicaLink>,
    devices: &[Device],
    options: CommunicationOptions,
) -> Result<Vec<ReplicaLink>, TrainError> {
    let ordinals = gpu_ordinals(devices);
    let wanted = match options.implementation {
        Implementation::Nccl => true,
        Implementation::Auto => ordinals.is_some() && nccl::available(),
        Implementation::Ring | Implementation::Tree => false,
    };
    if !wanted {
        return Ok(links);
    }
    let Some(ordinals) = ordinals else {
        return Err(TrainError::invalid(
            "MirroredStrategy",
            "NCCL sums buffers on GPUs: every replica must be on a GPU",
        ));
    };
    let comms = local_nccl_group("MirroredStrategy", &ordinals, options.timeout)?;
    tracing::info!(
        replicas = comms.len(),
        "gradients summed on the GPUs by NCCL"
    );
    for (link, comm) in links.iter_mut().zip(comms) {
        link.nccl = Some(comm);
    }
    Ok(links)
}

impl MirroredStrategy {
    /// One replica on each GPU this process sees, or one on the CPU when it sees none (the log
    /// says which), as TensorFlow's `MirroredStrategy()` with no devices named; the GPUs'
    /// gradients are summed by NCCL where it can be loaded, else over the CPU.
    ///
    /// # Errors
    ///
    /// When NCCL is there but its group cannot be made.
    pub fn all_devices() -> Result<Self, TrainError> {
        Self::with_devices(&visible_devices(), CommunicationOptions::default())
    }

    /// One replica on each of `devices` (`Device::Cpu` may be named several times: several
    /// replicas on the CPU), whose collectives run with `options`: with
    /// `Implementation::Nccl`, or `Auto` when every replica is on a GPU and NCCL can be loaded,
    /// the gradients are summed on the GPUs by NCCL (the loss and metric totals over the CPU);
    /// else over the CPU's transports.
    ///
    /// # Errors
    ///
    /// When `devices` is empty, names a GPU twice, or names one this process cannot use (the
    /// error says why); NCCL asked for with a replica on the CPU, or NCCL that cannot be loaded
    /// or cannot make its group.
    pub fn with_devices(
        devices: &[Device],
        options: CommunicationOptions,
    ) -> Result<Self, TrainError> {
        check_devices("MirroredStrategy", devices)?;
        let links = place(in_process(devices.len(), host_options(options)), devices);
        Ok(Self {
            count: devices.len(),
            replicas: Some(with_nccl(links, devices, options)?),
        })
    }

    /// `replicas` replicas on this process's CPU.
    ///
    /// # Errors
    ///
    /// When `replicas` is 0.
    pub fn new(replicas: usize) -> Result<Self, TrainError> {
        Self::with_options(replicas, CommunicationOptions::default())
    }

    /// `replicas` replicas whose collectives run with `options` (the timeout, the pack size,
    /// gradient [`Compression`](lockstep_collective::Compression)).
    ///
    /// # Errors
    ///
    /// When `replicas` is 0, or NCCL is asked for.
    pub fn with_options(
        replicas: usize,
        options: CommunicationOptions,
    ) -> Result<Self, TrainError> {
        if options.implementation == Implementation::Nccl {
            return Err(nccl_refused());
        }
        if replicas == 0 {
            return Err(TrainError::invalid(
                "MirroredStrategy",
                "needs at least one replica",
            ));
        }
        Ok(Self {
            count: replicas,
            replicas: Some(in_process(replicas, options)),
        })
    }
}

impl Strategy for MirroredStrategy {
    fn num_replicas_in_sync(&self) -> usize {
        self.count
    }
    fn input_context(&self) -> InputContext {
        InputContext {
            num_input_pipelines: 1,
            input_pipeline_id: 0,
            num_replicas_in_sync: self.count,
        }
    }
    fn is_chief(&self) -> bool {
        true
    }
    fn task(&self) -> String {
        "local".into()
    }
    fn take_replicas(&mut self) -> Result<Vec<ReplicaLink>, TrainError> {
        self.replicas.take().ok_or_else(taken)
    }
}

/// One replica on this process's CPU, as `tf.distribute.OneDeviceStrategy`: a
/// [`MirroredStrategy`] of one.
pub struct OneDeviceStrategy(MirroredStrategy);

impl OneDeviceStrategy {
    /// The strategy, on the CPU.
    pub fn new() -> Self {
        Self(MirroredStrategy {
            count: 1,
            replicas: Some(in_process(1, CommunicationOptions::default())),
        })
    }

    /// The strategy on `device`, as `tf.distribute.OneDeviceStrategy("/gpu:0")`.
    ///
    /// # Errors
    ///
    /// When this process cannot use `device` (the error says why).
    pub fn on(device: Device) -> Result<Self, TrainError> {
        check_devices("OneDeviceStrategy", &[device])?;
        Ok(Self(MirroredStrategy {
            count: 1,
            replicas: Some(place(
                in_process(1, CommunicationOptions::default()),
                &[device],
            )),
        }))
    }
}

impl Default for OneDeviceStrategy {
    fn default() -> Self {
        Self::new()
    }
}

impl Strategy for OneDeviceStrategy {
    fn num_replicas_in_sync(&self) -> usize {
        self.0.num_replicas_in_sync()
    }
    fn input_context(&self) -> InputContext {
        self.0.input_context()
    }
    fn is_chief(&self) -> bool {
        self.0.is_chief()
    }
    fn task(&self) -> String {
        self.0.task()
    }
    fn take_replicas(&mut self) -> Result<Vec<ReplicaLink>, TrainError> {
        self.0.take_replicas()
    }
}

/// Replicas on every worker of a cluster, as `tf.distribute.MultiWorkerMirroredStrategy`: one
/// collective group across all replicas of all workers, hierarchical when a worker has
/// several. With one worker it behaves as [`MirroredStrategy`].
pub struct MultiWorkerMirroredStrategy {
    task: String,
    chief: bool,
    context: InputContext,
    replicas: Option<Vec<ReplicaLink>>,
    /// The options the strategy was made with (NCCL's choice is made when the replicas are
    /// placed: [`MultiWorkerMirroredStrategy::on_devices`]).
    options: CommunicationOptions,
    /// Whether an NCCL group spans only one worker's replicas
    /// ([`MultiWorkerMirroredStrategy::nccl_within_workers`]).
    nccl_within_workers: bool,
}

impl MultiWorkerMirroredStrategy {
    /// Joins the collective group of `cluster` with `local_replicas` replicas on this worker
    /// (the same number on every worker), waiting up to `rendezvous` for the others.
    ///
    /// # Errors
    ///
    /// When this task is not in the collective group (a `ps` or `evaluator` task trains
    /// nothing), `local_replicas` is 0, or the peers cannot be reached. NCCL
    /// (`Implementation::Nccl`, or `Auto` where every worker's replicas are on GPUs and NCCL
    /// loads) is set up when the replicas are placed ([`MultiWorkerMirroredStrategy::on_devices`]);
    /// a model built with NCCL asked for and the replicas left on the CPU is refused.
    pub fn new(
        cluster: &Cluster,
        options: CommunicationOptions,
        local_replicas: usize,
        rendezvous: Duration,
    ) -> Result<Self, TrainError> {
        let transport = TcpOptions {
            rendezvous_timeout: rendezvous,
            ..TcpOptions::default()
        };
        Self::with_transport_options(cluster, options, local_replicas, &transport)
    }

    /// As [`MultiWorkerMirroredStrategy::new`], with the transport's options: the interface
    /// to listen on ([`TcpOptions::bind`]), how to reach peers on this host, and the
    /// rendezvous timeout.
    ///
    /// # Errors
    ///
    /// As [`MultiWorkerMirroredStrategy::new`].
    pub fn with_transport_options(
        cluster: &Cluster,
        options: CommunicationOptions,
        local_replicas: usize,
        transport: &TcpOptions,
    ) -> Result<Self, TrainError> {
        check(cluster, local_replicas)?;
        let comm: Communicator<TcpTransport> =
            Communicator::from_cluster_with(cluster, host_options(options), transport)?;
        Self::from_transport(cluster, comm.into_transport(), options, local_replicas)
    }

    /// As [`MultiWorkerMirroredStrategy::new`] over a transport connected already (with
    /// settings of the caller's, or on a listener bound beforehand).
    ///
    /// # Errors
    ///
    /// As [`MultiWorkerMirroredStrategy::new`], or when the transport's group is not the
    /// cluster's.
    pub fn from_transport(
        cluster: &Cluster,
        transport: TcpTransport,
        options: CommunicationOptions,
        local_replicas: usize,
    ) -> Result<Self, TrainError> {
        use lockstep_collective::Transport as _;
        let rank = check(cluster, local_replicas)?;
        let workers = cluster.world_size().max(1);
        if (transport.rank(), transport.world_size()) != (rank, workers) {
            return Err(TrainError::invalid(
                "MultiWorkerMirroredStrategy",
                format!(
                    "the transport is rank {} of {}, the cluster says task {} is rank {rank} of {workers}",
                    transport.rank(),
                    transport.world_size(),
                    cluster.task()
                ),
            ));
        }
        let links =
            HierarchicalCommunicator::group(local_replicas, transport, host_options(options))
                .into_iter()
                .map(|c| ReplicaLink::new(Link::Cluster(c)))
                .collect();
        Ok(Self {
            task: cluster.task().to_string(),
            chief: cluster.is_chief(),
            context: InputContext::new(workers, rank, workers * local_replicas)?,
            replicas: Some(links),
            options,
            nccl_within_workers: false,
        })
    }
}

impl MultiWorkerMirroredStrategy {
    /// Where NCCL sums the gradients, it sums each worker's replicas only, and the workers' sums
    /// meet over the cluster's TCP ring: the hierarchical all-reduce, for GPUs that NCCL cannot
    /// reach across hosts (no network transport NCCL can use between them, ports closed to it).
    /// Each step, NCCL sums a worker's GPUs, its first replica carries that sum over the ring
    /// (in `f32`, in one all-reduce: `compression` and `bytes_per_pack` do not apply to it)
    /// and NCCL hands the total to the others. Every worker must say the same before
    /// [`MultiWorkerMirroredStrategy::on_devices`], as with any collective setting: workers
    /// that disagree stop there with an error saying so.
    #[must_use]
    pub fn nccl_within_workers(mut self) -> Self {
        self.nccl_within_workers = true;
        self
    }

    /// Places this worker's replicas on `devices`, one each (as many as `local_replicas`):
    /// every worker places its own, as each TensorFlow worker uses its own GPUs. Every worker
    /// calls it at the same point: with `Implementation::Nccl`, or `Auto` when every replica of
    /// every worker is on a GPU and NCCL loads everywhere (all are asked, in one collective),
    /// the replicas of all workers join one NCCL group, whose unique id the chief's first
    /// replica makes and sends over the cluster's connections, and NCCL sums the gradients.
    ///
    /// # Errors
    ///
    /// When `devices` does not name one device per local replica, names a GPU twice, or names
    /// one this process cannot use; NCCL asked for and a replica of some worker on the CPU or
    /// without NCCL; a peer gone, or the group not formed within the collective timeout.
    pub fn on_devices(mut self, devices: &[Device]) -> Result<Self, TrainError> {
        let links = self.replicas.take().ok_or_else(taken)?;
        if devices.len() != links.len() {
            return Err(TrainError::invalid(
                "MultiWorkerMirroredStrategy",
                format!(
                    "{} devices for {} replicas on this worker",
                    devices.len(),
                    links.len()
                ),
            ));
        }
        check_devices("MultiWorkerMirroredStrategy", devices)?;
        let mut links = place(links, devices);
        let scope = if self.nccl_within_workers {
            NcclScope::EachWorker
        } else {
            NcclScope::AllWorkers
        };
        join_nccl_across_workers(&mut links, devices, self.options, scope)?;
        self.replicas = Some(links);
        Ok(self)
    }
}

/// Which replicas one NCCL group spans under [`MultiWorkerMirroredStrategy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NcclScope {
    /// Every replica of every worker.
    AllWorkers,
    /// Each worker's own; the workers' sums meet over the TCP ring.
    EachWorker,
}

/// Whether NCCL sums the gradients of every replica of every worker, asked of all of them at
/// once (a worker without NCCL, or with a replica on the CPU, says no for all); if so, one NCCL
/// group of all replicas: the chief's first replica makes its unique id, which reaches the
/// others over the cluster's own connections (authenticated where the cluster has a secret),
/// and every replica joins as its rank among all replicas. With [`NcclScope::EachWorker`],
/// a group of each worker's replicas instead.
fn join_nccl_across_workers(
    links: &mut [ReplicaLink],
    devices: &[Device],
    options: CommunicationOptions,
    scope: NcclScope,
) -> Result<(), TrainError> {
    const STRATEGY: &str = "MultiWorkerMirroredStrategy";
    let ordinals = gpu_ordinals(devices);
    let asked = options.implementation == Implementation::Nccl;
    if !asked && options.implementation != Implementation::Auto {
        return Ok(());
    }
    if asked && ordinals.is_none() {
        return Err(TrainError::invalid(
            STRATEGY,
            "NCCL sums buffers on GPUs: every replica must be on a GPU",
        ));
    }
    let able = ordinals.is_some() && nccl::available();
    let watch = PeerWatch::of(links);
    let checks: Vec<_> = links
        .iter()
        .map(|_| watch.as_ref().map(PeerWatch::check))
        .collect();
    let joined: Vec<Result<Joined, TrainError>> = std::thread::scope(|threads| {
        let handles: Vec<_> = links
            .iter_mut()
            .zip(devices)
            .zip(checks)
            .map(|((link, device), check)| {
                let device = *device;
                let join = Join {
                    able,
                    timeout: options.timeout,
                    scope,
                };
                threads.spawn(move || join_nccl(link, device, join, check))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(TrainError::invalid(
                        STRATEGY,
                        "a replica's thread panicked joining NCCL",
                    ))
                })
            })
            .collect()
    });
    let joined = joined.into_iter().collect::<Result<Vec<_>, _>>()?;
    let refused = || {
        Err(TrainError::invalid(
            STRATEGY,
            "NCCL was asked for, but some worker has a replica on the CPU or cannot load NCCL",
        ))
    };
    if joined.is_empty() || joined.iter().any(|j| matches!(j, Joined::Without)) {
        return if asked { refused() } else { Ok(()) };
    }
    if joined.iter().all(|j| matches!(j, Joined::Group(_))) {
        tracing::info!(
            replicas = joined.len(),
            "gradients summed by NCCL across the workers"
        );
        for (link, joined) in links.iter_mut().zip(joined) {
            if let Joined::Group(comm) = joined {
                link.nccl = Some(comm);
                link.watch.clone_from(&watch);
            }
        }
        return Ok(());
    }
    // Every replica voted for NCCL within its worker: one group of this worker's GPUs.
    let Some(ordinals) = ordinals else {
        return refused();
    };
    let comms = local_nccl_group(STRATEGY, &ordinals, options.timeout)?;
    let others = links.first().is_some_and(|l| l.world_size() > links.len());
    tracing::info!(
        replicas = comms.len(),
        "gradients summed by NCCL within this worker, and over the TCP ring between workers"
    );
    for (link, mut comm) in links.iter_mut().zip(comms) {
        if let Some(watch) = &watch {
            comm.set_peer_check(watch.check());
        }
        link.nccl = Some(comm);
        link.nccl_within_process = others;
        link.watch.clone_from(&watch);
    }
    Ok(())
}

/// What one replica knows when it joins NCCL under [`MultiWorkerMirroredStrategy`].
#[derive(Clone, Copy)]
struct Join {
    /// Whether this worker can: its replicas all on GPUs, NCCL loaded.
    able: bool,
    timeout: Duration,
    scope: NcclScope,
}

/// How one replica came out of [`join_nccl`].
enum Joined {
    /// Some worker cannot use NCCL (or this replica is on the CPU): the CPU's transports.
    Without,
    /// A member of the group of every replica of every worker.
    Group(NcclComm),
    /// Every worker can, and each makes a group of its own replicas.
    WithinWorker,
}

/// One replica's part of [`join_nccl_across_workers`]: the vote, the unique id, the join,
/// watched (and every later collective) by `peers`, the cluster's connections.
fn join_nccl(
    link: &mut ReplicaLink,
    device: Device,
    join: Join,
    peers: Option<nccl::PeerCheck>,
) -> Result<Joined, TrainError> {
    const STRATEGY: &str = "MultiWorkerMirroredStrategy";
    // One all-reduce of three minimums: whether every worker can, and the least and (negated)
    // the greatest scope asked for, which differ when workers disagree.
    let scope = match join.scope {
        NcclScope::AllWorkers => 0.0_f32,
        NcclScope::EachWorker => 1.0,
    };
    let mut vote = [if join.able { 1.0_f32 } else { 0.0 }, scope, -scope];
    link.all_reduce(&mut vote, ReduceOp::Min)?;
    if vote[1] != -vote[2] {
        return Err(TrainError::invalid(
            STRATEGY,
            "the workers disagree on nccl_within_workers: every worker must say the same",
        ));
    }
    let Device::Cuda(ordinal) = device else {
        return Ok(Joined::Without);
    };
    if vote[0] != 1.0 {
        return Ok(Joined::Without);
    }
    if join.scope == NcclScope::EachWorker {
        return Ok(Joined::WithinWorker);
    }
    // The first value says whether the chief could make the id; the others are its bytes.
    let mut message = [0.0_f32; 129];
    if link.replica_id() == 0 {
        match UniqueId::new() {
            Ok(id) => {
                message[0] = 1.0;
                for (value, byte) in message[1..].iter_mut().zip(id.to_bytes()) {
                    *value = f32::from(byte);
                }
            }
            Err(e) => tracing::error!(error = %e, "NCCL could not make a unique id"),
        }
    }
    link.broadcast(&mut message)?;
    if message[0] != 1.0 {
        return Err(TrainError::invalid(
            STRATEGY,
            "the chief could not make NCCL's unique id (its log says why)",
        ));
    }
    let mut bytes = [0_u8; 128];
    for (byte, value) in bytes.iter_mut().zip(&message[1..]) {
        // Bytes travel exactly as f32 values 0..=255.
        *byte = u8::try_from(*value as u32).unwrap_or(0);
    }
    let gpu = lockstep_cuda::CudaDevice::open(ordinal)
        .map_err(|e| TrainError::invalid(STRATEGY, e.to_string()))?;
    let rank = (link.replica_id(), link.world_size());
    NcclComm::join_watched(&gpu, UniqueId::from_bytes(bytes), rank, join.timeout, peers)
        .map(Joined::Group)
        .map_err(|e| TrainError::invalid(STRATEGY, format!("joining NCCL: {e}")))
}

/// What every way of joining a cluster checks first; returns this task's rank.
fn check(cluster: &Cluster, local_replicas: usize) -> Result<usize, TrainError> {
    if local_replicas == 0 {
        return Err(TrainError::invalid(
            "MultiWorkerMirroredStrategy",
            "needs at least one replica per worker",
        ));
    }
    cluster.rank().ok_or_else(|| {
        TrainError::invalid(
            "MultiWorkerMirroredStrategy",
            format!(
                "task {} is not a worker or the chief and trains nothing (ps and evaluator tasks do not join the collective group)",
                cluster.task()
            ),
        )
    })
}

impl Strategy for MultiWorkerMirroredStrategy {
    fn num_replicas_in_sync(&self) -> usize {
        self.context.num_replicas_in_sync
    }
    fn input_context(&self) -> InputContext {
        self.context
    }
    fn is_chief(&self) -> bool {
        self.chief
    }
    fn task(&self) -> String {
        self.task.clone()
    }
    fn take_replicas(&mut self) -> Result<Vec<ReplicaLink>, TrainError> {
        let links = self.replicas.take().ok_or_else(taken)?;
        if self.options.implementation == Implementation::Nccl
            && !links.iter().all(ReplicaLink::uses_nccl)
        {
            return Err(TrainError::invalid(
                "MultiWorkerMirroredStrategy",
                "NCCL was asked for, but the replicas are on the CPU: place them on GPUs with on_devices",
            ));
        }
        Ok(links)
    }
}

fn nccl_refused() -> TrainError {
    TrainError::invalid(
        "CommunicationOptions",
        "NCCL sums gradients on GPUs, and these replicas are on the CPU: place them with \
         MirroredStrategy::with_devices or all_devices, or use Ring or Auto",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_collectives_never_ask_for_nccl() {
        for implementation in [
            Implementation::Auto,
            Implementation::Ring,
            Implementation::Tree,
            Implementation::Nccl,
        ] {
            let options = CommunicationOptions {
                implementation,
                timeout: Duration::from_secs(7),
                ..CommunicationOptions::default()
            };
            let host = host_options(options);
            assert_ne!(host.implementation, Implementation::Nccl);
            assert_eq!(host.timeout, options.timeout);
            if implementation != Implementation::Nccl {
                assert_eq!(host.implementation, implementation);
            }
        }
    }

    #[test]
    fn nccl_for_a_replica_on_the_cpu_is_refused() {
        let options = CommunicationOptions {
            implementation: Implementation::Nccl,
            ..CommunicationOptions::default()
        };
        let err = MirroredStrategy::with_devices(&[Device::Cpu], options)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("every replica must be on a GPU"), "{err}");
        // Auto on the CPU picks the CPU's transports.
        let auto = MirroredStrategy::with_devices(
            &[Device::Cpu, Device::Cpu],
            CommunicationOptions::default(),
        );
        let links = auto
            .ok()
            .and_then(|mut s| s.take_replicas().ok())
            .unwrap_or_default();
        assert_eq!(links.len(), 2);
        assert!(
            links
                .iter()
                .all(|l| !l.uses_nccl() && l.device() == Device::Cpu)
        );
    }
}
