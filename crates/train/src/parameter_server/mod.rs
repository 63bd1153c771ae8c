//! TensorFlow's `ParameterServerStrategy`: asynchronous training in which the model's
//! variables live on the `ps` tasks, the chief coordinates and the workers run steps.
//!
//! Every task runs the same program and asks [`ParameterServerStrategy::role`] what to do:
//! - a `ps` task serves its shards ([`ParameterServerStrategy::serve_parameters`]);
//! - a worker serves steps ([`serve_steps`]): it builds the model as the chief does, makes
//!   its dataset from the dataset function and its [`InputContext`], and runs each step the
//!   coordinator sends: pull the variables, one batch forward and backward, push the gradients
//!   (each `ps` applies the optimizer to its shards). Of an embedding table that reads its ids
//!   from the model's input, only the rows the batch names are pulled and pushed (sparse
//!   updates, TensorFlow's `IndexedSlices`);
//! - the chief trains ([`ParameterServerModel`]): it creates the shards from its model's
//!   values, schedules `steps_per_epoch` steps an epoch on whichever workers are free
//!   (`lockstep_ps::ClusterCoordinator`: a lost worker's step runs on another), and reads the
//!   trained values back.
//!
//! A step is asynchronous: a worker's gradient may come from values that others have moved
//! since it pulled them, as in TensorFlow.

mod checkpoint;
mod model;
mod variables;
mod worker;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_cluster::{CHIEF, Cluster, EVALUATOR, PS, WORKER};
use lockstep_collective::{ClusterSecret, task_listener};
use lockstep_nn::{Network, NnError};
use lockstep_ps::{Partitioner, PsClient, PsServer};

use self::variables::ShardedVariables;

use crate::error::TrainError;
use crate::kill_switch::KillSwitch;

pub use model::ParameterServerModel;
pub use worker::{TRAIN_STEP, serve_steps};

/// What this task does under the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsRole {
    /// The chief: it coordinates training.
    Coordinator,
    /// Worker `n`: it runs steps.
    Worker(usize),
    /// Parameter server `n`: it holds shards.
    ParameterServer(usize),
    /// The evaluator: it evaluates checkpoints beside training.
    Evaluator,
}

/// TensorFlow's `ParameterServerStrategy` over a cluster with `ps` tasks, workers and a chief.
#[derive(Clone)]
pub struct ParameterServerStrategy {
    cluster: Cluster,
    secret: Option<ClusterSecret>,
    partitioner: Option<Arc<dyn Partitioner>>,
    timeout: Duration,
}

impl std::fmt::Debug for ParameterServerStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParameterServerStrategy")
            .field("task", self.cluster.task())
            .field("partitioner", &self.partitioner)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ParameterServerStrategy {
    /// The strategy of `cluster`, whose connections prove `secret` (none: a cluster without
    /// one). Variables are not partitioned (each on one `ps` task, round-robin) until
    /// [`ParameterServerStrategy::with_partitioner`] says otherwise, as TensorFlow's default.
    ///
    /// # Errors
    ///
    /// A cluster without a `ps` task, a worker, or a chief.
    pub fn new(cluster: Cluster, secret: Option<ClusterSecret>) -> Result<Self, TrainError> {
        for job in [PS, WORKER, CHIEF] {
            if cluster.spec().num_tasks(job) == 0 {
                return Err(TrainError::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "the cluster has no {job} task: it needs a chief, workers and ps tasks"
                    ),
                ));
            }
        }
        Ok(Self {
            cluster,
            secret,
            partitioner: None,
            timeout: Duration::from_mins(1),
        })
    }

    /// Cuts each variable into shards as `partitioner` says (TensorFlow's
    /// `variable_partitioner`).
    #[must_use]
    pub fn with_partitioner(mut self, partitioner: impl Partitioner + 'static) -> Self {
        self.partitioner = Some(Arc::new(partitioner));
        self
    }

    /// How long a task waits for another to come up or answer (60 s by default).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What this task does.
    ///
    /// # Errors
    ///
    /// A task of a job the strategy has no part for.
    pub fn role(&self) -> Result<PsRole, TrainError> {
        let task = self.cluster.task();
        match task.job.as_str() {
            CHIEF => Ok(PsRole::Coordinator),
            WORKER => Ok(PsRole::Worker(task.index)),
            PS => Ok(PsRole::ParameterServer(task.index)),
            EVALUATOR => Ok(PsRole::Evaluator),
            other => Err(TrainError::invalid(
                "ParameterServerStrategy",
                format!("a task of job {other:?} has no part in parameter-server training"),
            )),
        }
    }

    /// The workers.
    pub fn num_workers(&self) -> usize {
        self.cluster.spec().num_tasks(WORKER)
    }

    /// The `ps` tasks.
    pub fn num_ps(&self) -> usize {
        self.cluster.spec().num_tasks(PS)
    }

    /// The cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub(crate) fn secret(&self) -> Option<&ClusterSecret> {
        self.secret.as_ref()
    }

    pub(crate) fn partitioner(&self) -> Option<&dyn Partitioner> {
        self.partitioner.as_deref()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The addresses of `job`'s tasks, resolved.
    pub(crate) fn addresses(&self, job: &str) -> Result<Vec<SocketAddr>, TrainError> {
        self.cluster
            .spec()
            .addresses(job)
            .iter()
            .map(|address| {
                address
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut found| found.next())
                    .ok_or_else(|| {
                        TrainError::invalid(
                            "ParameterServerStrategy",
                            format!("the {job} address {address} does not resolve"),
                        )
                    })
            })
            .collect()
    }

    /// The model `build` makes (the same on every task), its variables' shards on the `ps`
    /// tasks, and a connection to each `ps` task: what the chief and every worker start from.
    pub(crate) fn build_sharded<N: Into<Network>>(
        &self,
        build: impl Fn() -> Result<N, NnError>,
    ) -> Result<(Network, ShardedVariables, Vec<PsClient>), TrainError> {
        let net: Network = build()?.into();
        let variables =
            ShardedVariables::lay_out(net.parameters().specs(), self.num_ps(), self.partitioner())?;
        let clients = self.connect_ps()?;
        Ok((net, variables, clients))
    }

    /// Connections to every `ps` task, in order, each tried until it answers or the timeout
    /// passes (a `ps` task may start after this one).
    pub(crate) fn connect_ps(&self) -> Result<Vec<PsClient>, TrainError> {
        self.addresses(PS)?
            .into_iter()
            .map(|address| self.connect_within_timeout(address))
            .collect()
    }

    fn connect_within_timeout(&self, address: SocketAddr) -> Result<PsClient, TrainError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match PsClient::connect(address, self.secret(), self.timeout) {
                Ok(client) => return Ok(client),
                Err(e) if Instant::now() >= deadline => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(%address, error = %e, "parameter server not up yet");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Serves this `ps` task's shards on its address until the chief says training is over
    /// ([`ParameterServerModel::shutdown_cluster`]); returns how many shard updates it applied
    /// (a step's push to this task is applied once however often the step ran; it updates
    /// each shard it carries, which for a table read by rows is each shard the batch named).
    ///
    /// # Errors
    ///
    /// When this task is not a `ps` task or its address cannot be listened on.
    pub fn serve_parameters(&self) -> Result<u64, TrainError> {
        let PsRole::ParameterServer(index) = self.role()? else {
            return Err(TrainError::invalid(
                "serve_parameters",
                "only a ps task serves parameters",
            ));
        };
        let address = self.own_address()?;
        let listener = task_listener(&address)?;
        tracing::info!(index, %address, "serving parameters");
        let running = PsServer::new(self.secret.clone()).spawn(listener)?;
        if let Some(at) = KillSwitch::from_env()?.kill_at_updates() {
            // `--kill ps:N@COUNT`: a crash once this task has applied COUNT gradients.
            let store = std::sync::Arc::clone(running.store());
            std::thread::spawn(move || {
                loop {
                    let updates = store.updates();
                    if updates >= at {
                        KillSwitch::kill_now(updates);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
        }
        running.wait_for_shutdown();
        let updates = running.store().updates();
        tracing::info!(index, updates, "the chief ended training");
        Ok(updates)
    }

    pub(crate) fn own_address(&self) -> Result<String, TrainError> {
        let task = self.cluster.task();
        self.cluster
            .spec()
            .address(task)
            .map(str::to_owned)
            .ok_or_else(|| {
                TrainError::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "this task ({}:{}) has no address in the cluster",
                        task.job, task.index
                    ),
                )
            })
    }
}
