//! Why a task could not start.

use std::path::PathBuf;

/// Why a task could not start, naming the cause.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The cluster's environment is malformed; the error names the variable.
    #[error("resolving the cluster from {source_name}: {error}")]
    Cluster {
        /// Where the cluster was read from (`TF_CONFIG`, SLURM, Kubernetes).
        source_name: String,
        /// What was wrong with it.
        error: lockstep_cluster::ClusterError,
    },
    /// The private state directory could not be made or read.
    #[error("{what} {}: {error}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The directory.
        path: PathBuf,
        /// The system's error.
        error: std::io::Error,
    },
    /// A directory of the private state directory's name is not this user's alone.
    #[error(
        "{} is not a directory of this user's alone (owner {owner}, mode {mode:o}): another local user may have made it to plant state; remove it, or name the directory with the program's flag",
        path.display()
    )]
    NotPrivate {
        /// The directory.
        path: PathBuf,
        /// Its owner's user id.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// The kernel threads' cores cannot be had.
    #[error("pinning the kernel threads to cores {cpus}: {why}")]
    Cpus {
        /// The cores asked for.
        cpus: String,
        /// Why not.
        why: String,
    },
    /// The kernel threads could not start (they were started already).
    #[error("starting the kernel threads: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
}
