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
use lockstep_data::InputContext;
use lockstep_tensor::ops::AllReduceSum;

use crate::error::TrainError;

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

/// One replica's handle on all replicas of all processes.
pub struct ReplicaLink {
    link: Arc<Mutex<Link>>,
    rank: usize,
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

impl ReplicaLink {
    fn new(link: Link) -> Self {
        let rank = match &link {
            Link::InProcess(c) => c.rank(),
            Link::Cluster(c) => c.rank(),
        };
        Self {
            link: Arc::new(Mutex::new(link)),
            rank,
        }
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
pub struct MirroredStrategy {
    count: usize,
    replicas: Option<Vec<ReplicaLink>>,
}

impl MirroredStrategy {
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
    /// The strategy.
    pub fn new() -> Self {
        Self(MirroredStrategy {
            count: 1,
            replicas: Some(in_process(1, CommunicationOptions::default())),
        })
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
}

impl MultiWorkerMirroredStrategy {
    /// Joins the collective group of `cluster` with `local_replicas` replicas on this worker
    /// (the same number on every worker), waiting up to `rendezvous` for the others.
    ///
    /// # Errors
    ///
    /// When this task is not in the collective group (a `ps` or `evaluator` task trains
    /// nothing), NCCL is asked for (it needs the GPU backend, which is not built yet),
    /// `local_replicas` is 0, or the peers cannot be reached.
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
        check(cluster, options, local_replicas)?;
        let comm: Communicator<TcpTransport> =
            Communicator::from_cluster_with(cluster, options, transport)?;
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
        let rank = check(cluster, options, local_replicas)?;
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
        let links = HierarchicalCommunicator::group(local_replicas, transport, options)
            .into_iter()
            .map(|c| ReplicaLink::new(Link::Cluster(c)))
            .collect();
        Ok(Self {
            task: cluster.task().to_string(),
            chief: cluster.is_chief(),
            context: InputContext::new(workers, rank, workers * local_replicas)?,
            replicas: Some(links),
        })
    }
}

/// What every way of joining a cluster checks first; returns this task's rank.
fn check(
    cluster: &Cluster,
    options: CommunicationOptions,
    local_replicas: usize,
) -> Result<usize, TrainError> {
    if options.implementation == Implementation::Nccl {
        return Err(nccl_refused());
    }
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
        self.replicas.take().ok_or_else(taken)
    }
}

fn nccl_refused() -> TrainError {
    TrainError::invalid(
        "CommunicationOptions",
        "NCCL all-reduces GPU buffers, and Lockstep has no GPU backend yet; use Ring or Auto",
    )
}
