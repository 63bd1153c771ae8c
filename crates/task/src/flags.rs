//! The standard flags of a training program, to flatten into its own `clap` parser.

use std::net::IpAddr;
use std::time::Duration;

use lockstep_cluster::{AutoResolver, Cluster, ClusterResolver as _};
use lockstep_collective::{CommunicationOptions, Compression, TcpOptions};

use crate::cpus::CpuList;
use crate::error::TaskError;
use crate::threads::{start_kernel_threads, start_kernel_threads_on};

/// How much a program trains and on how many threads: the flags every training example takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterTrainingArgs {
    /// Passes over the training data.
    #[arg(long, default_value_t = 3)]
    pub epochs: u64,
    /// Examples per worker per step (the global batch is this times the number of workers).
    #[arg(long, default_value_t = 64)]
    pub batch_per_worker: usize,
    /// Examples per step over all workers, instead of `--batch-per-worker` times the number of
    /// workers: the same global batch on any number of workers, so a backup resumes on a
    /// cluster of another size (it must divide evenly among the workers).
    #[arg(long, value_name = "N")]
    pub global_batch: Option<usize>,
    /// Seed of the initial weights and of the shuffle (the same on every worker).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// How many kernel threads, and on which cores.
    #[command(flatten)]
    pub kernels: KernelThreadArgs,
}

impl ClusterTrainingArgs {
    /// Starts the kernel threads as [`KernelThreadArgs::start`] does.
    ///
    /// # Errors
    ///
    /// As that function.
    pub fn start_kernel_threads(&self, sharers: usize) -> Result<usize, TaskError> {
        self.kernels.start(sharers)
    }

    /// Examples per step over `workers` workers.
    pub fn global_batch(&self, workers: usize) -> usize {
        self.global_batch.unwrap_or(self.batch_per_worker * workers)
    }
}

/// The kernel threads' flags, `--threads` and `--kernel-cpus`: part of [`ClusterTrainingArgs`],
/// and on their own in a program that takes none of its other flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KernelThreadArgs {
    /// Threads for the kernels; 0 = this host's cores shared out among the workers the
    /// cluster spec places on it, or the replicas of a program alone on its host.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Cores to pin the kernel threads to, one each in turn, as `taskset -c` lists them
    /// (`0-3`, `0,2,4`; Linux): the step's communication runs on them too. With `--threads 0`,
    /// one thread a core. Give each worker that shares a host cores of its own.
    #[arg(long, value_name = "LIST")]
    pub kernel_cpus: Option<CpuList>,
}

impl KernelThreadArgs {
    /// Starts the kernel threads: `--threads` of them, pinned to `--kernel-cpus` when given
    /// ([`start_kernel_threads_on`]), else [`start_kernel_threads`] sharing this host's cores
    /// among `sharers`. Returns how many.
    ///
    /// # Errors
    ///
    /// As those functions.
    pub fn start(&self, sharers: usize) -> Result<usize, TaskError> {
        match &self.kernel_cpus {
            Some(cpus) => start_kernel_threads_on(cpus, self.threads),
            None => start_kernel_threads(self.threads, sharers),
        }
    }
}

/// How a step's gradients travel: the flags of `CommunicationOptions` a training program
/// offers.
#[derive(Debug, Clone, clap::Args)]
pub struct CommunicationArgs {
    /// Reduce the gradients in packs of this many bytes (whole variables, the last layers'
    /// first), each as soon as the backward pass has finished it; 0 = one pack.
    #[arg(long, default_value_t = CommunicationOptions::default().bytes_per_pack, value_name = "BYTES")]
    pub bytes_per_pack: usize,
    /// The type gradients travel in: `none` (f32), `bf16` or `fp16`.
    #[arg(long, default_value = "none", value_parser = compression)]
    pub compression: Compression,
    /// With `--compression`, carry each replica's rounding error into its next step's
    /// gradients (error feedback).
    #[arg(long)]
    pub error_feedback: bool,
    /// With packs, apply each pack's update as the next step's forward pass reaches its
    /// layers, so that the packs' sums overlap that pass too (the same updates, bit for bit).
    #[arg(long)]
    pub overlap_update: bool,
}

impl CommunicationArgs {
    /// The options these flags give, the rest at their defaults.
    pub fn options(&self) -> CommunicationOptions {
        CommunicationOptions {
            bytes_per_pack: self.bytes_per_pack,
            compression: self.compression,
            error_feedback: self.error_feedback,
            overlap_update: self.overlap_update,
            ..CommunicationOptions::default()
        }
    }
}

fn compression(name: &str) -> Result<Compression, String> {
    match name {
        "none" => Ok(Compression::None),
        "bf16" => Ok(Compression::Bf16),
        "fp16" => Ok(Compression::Fp16),
        other => Err(format!(
            "unknown compression {other:?}: use none, bf16 or fp16"
        )),
    }
}

/// How a task finds its cluster and where it listens.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Listen on this interface only (an IP address). By default a task listens on all
    /// interfaces at the port of its cluster-spec address, as TensorFlow's servers do: the
    /// spec's host is how peers reach the task (on Kubernetes a service name) and need not be
    /// an address of this machine.
    #[arg(long, value_name = "IP", env = "LOCKSTEP_BIND_ADDRESS")]
    pub bind_address: Option<IpAddr>,
    /// How long to wait at start-up for every peer of the group before failing, naming the
    /// tasks that never came.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub rendezvous_timeout_secs: u64,
}

impl ClusterArgs {
    /// The cluster from the first of `TF_CONFIG`, SLURM and Kubernetes whose variables are
    /// set (a single local worker when none is), logging which.
    ///
    /// # Errors
    ///
    /// When the chosen source's variables are malformed; the error names the variable.
    pub fn resolve(&self) -> Result<Cluster, TaskError> {
        let resolver = AutoResolver::from_env().map_err(|error| TaskError::Cluster {
            source_name: "the environment".into(),
            error,
        })?;
        let source = resolver.source();
        let cluster = resolver.resolve().map_err(|error| TaskError::Cluster {
            source_name: source.to_string(),
            error,
        })?;
        tracing::info!(%source, task = %cluster.task(), workers = cluster.world_size(), "cluster resolved");
        Ok(cluster)
    }

    /// The transport's options: the interface to listen on and the rendezvous timeout.
    pub fn transport(&self) -> TcpOptions {
        TcpOptions {
            bind: self.bind_address,
            rendezvous_timeout: self.rendezvous_timeout(),
            ..TcpOptions::default()
        }
    }

    /// [`ClusterArgs::rendezvous_timeout_secs`] as a duration.
    pub fn rendezvous_timeout(&self) -> Duration {
        Duration::from_secs(self.rendezvous_timeout_secs)
    }
}
