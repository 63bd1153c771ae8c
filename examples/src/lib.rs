//! What the example binaries share: how they log, and how many kernel threads they start.
//!
//! Each binary is a thin `main` over the library crates; these are the pieces of set-up they
//! have in common.

use std::io::IsTerminal as _;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use lockstep_cluster::{AutoResolver, Cluster, ClusterResolver as _};
use lockstep_collective::TcpOptions;

/// Whether log lines on stderr may carry ANSI colour codes: never under `NO_COLOR`, always under
/// `CLICOLOR_FORCE` (set by `cargo xtask run-cluster` when its own stderr is a terminal, since
/// a task's stderr is a pipe to the launcher), else only when stderr is a terminal. A log
/// redirected to a file (`cargo xtask run-cluster 2> log`) holds plain text.
pub fn colour_logs() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
    if set("NO_COLOR") {
        false
    } else {
        set("CLICOLOR_FORCE") || std::io::stderr().is_terminal()
    }
}

/// Logs `tracing` events at INFO and above to stderr, coloured only where [`colour_logs`]
/// says so.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(colour_logs())
        .init();
}

/// Starts the kernel threads (rayon's global pool) and returns how many: `requested` when
/// non-zero, else this host's cores shared out among `sharers` (the cluster's tasks on this
/// host, or one process's replicas), at least one. Oversubscribed kernel threads would make
/// every step wait for the slowest of them.
///
/// # Errors
///
/// When the pool cannot start (it was started already).
pub fn start_kernel_threads(
    requested: usize,
    sharers: usize,
) -> Result<usize, rayon::ThreadPoolBuildError> {
    let threads = if requested > 0 {
        requested
    } else {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores / sharers.max(1)).max(1)
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    Ok(threads)
}

/// A directory for this user's default example state (backups, checkpoints, model
/// directories) under the system's temporary directory: `lockstep-<uid>`, made readable and
/// writable by this user only when missing. The names inside stay predictable, so a restarted
/// task finds its backup, but no other local user can plant a checkpoint there: a directory of
/// that name that is a link, belongs to another user, or is open to others is refused.
///
/// # Errors
///
/// When the directory cannot be made, or is not this user's alone.
pub fn private_state_dir() -> anyhow::Result<std::path::PathBuf> {
    private_dir_in(&std::env::temp_dir())
}

/// [`private_state_dir`] under `base`.
fn private_dir_in(base: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let uid = nix::unistd::geteuid().as_raw();
    let dir = base.join(format!("lockstep-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("making {}", dir.display())),
    }
    let metadata =
        std::fs::symlink_metadata(&dir).with_context(|| format!("checking {}", dir.display()))?;
    if !metadata.is_dir() || metadata.uid() != uid || metadata.mode() & 0o077 != 0 {
        anyhow::bail!(
            "{} is not a directory of this user's alone (owner {}, mode {:o}): another local user may have made it to plant state; remove it, or name the directory with the example's flag",
            dir.display(),
            metadata.uid(),
            metadata.mode() & 0o7777
        );
    }
    Ok(dir)
}

/// `mi_option_purge_delay` in mimalloc's option enum (the same in its versions 2 and 3).
const MIMALLOC_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps the memory mimalloc (the examples' allocator) takes from the OS mapped after it is
/// freed, instead of returning it after a delay. A training step frees and allocates the same
/// multi-megabyte activations every few milliseconds; returned, each one came back as fresh
/// pages that the kernel faults in and zeroes (about a tenth of the CPU time of a step of the
/// CNN with batch normalization, and 16,000 page faults an epoch, against 400 kept). Memory
/// stays at the process's peak, which is what a training process holds anyway.
pub fn keep_freed_memory_mapped() {
    #[allow(unsafe_code)]
    // SAFETY: `mi_option_set` stores an integer in mimalloc's table of options; it accepts any
    // option and value, from any thread, at any time.
    unsafe {
        libmimalloc_sys::mi_option_set(MIMALLOC_PURGE_DELAY, -1);
    }
}

/// The options of the examples that train the tutorial CNN across a cluster (flattened into
/// each one's own arguments).
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
    /// Threads for the kernels; 0 = this host's cores shared out among the workers the
    /// cluster spec places on it (all of them for a worker alone on its host).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl ClusterTrainingArgs {
    /// Examples per step over `workers` workers.
    pub fn global_batch(&self, workers: usize) -> usize {
        self.global_batch.unwrap_or(self.batch_per_worker * workers)
    }
}

/// How a task finds its cluster and where it listens (flattened into each example's
/// arguments).
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
    pub fn resolve(&self) -> anyhow::Result<Cluster> {
        let resolver = AutoResolver::from_env().context("reading the cluster's environment")?;
        let source = resolver.source();
        let cluster = resolver
            .resolve()
            .with_context(|| format!("resolving the cluster from {source}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn purge_delay() -> std::ffi::c_long {
        #[allow(unsafe_code)]
        // SAFETY: `mi_option_get` reads an integer from mimalloc's table of options.
        unsafe {
            libmimalloc_sys::mi_option_get(MIMALLOC_PURGE_DELAY)
        }
    }

    #[test]
    fn the_private_state_dir_is_this_users_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let dir = private_dir_in(base.path()).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        // Opened to others (as a planted directory would be), it is refused, naming it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir_in(base.path()).unwrap_err().to_string();
        assert!(
            err.contains("not a directory of this user's alone"),
            "{err}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(private_dir_in(base.path()).unwrap(), dir);
        // A link in its place is refused too.
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(base.path(), &dir).unwrap();
        assert!(private_dir_in(base.path()).is_err());
    }

    #[test]
    fn freed_memory_stays_mapped_once_asked() {
        // mimalloc 3's default purge delay is 1,000 ms (its `options.c`): the option named
        // here is that one.
        assert_eq!(purge_delay(), 1000);
        keep_freed_memory_mapped();
        assert_eq!(purge_delay(), -1);
    }
}

/// When the steps of a `fit` ended: the first (from `started`, the process's start) and the
/// last, so a run can report its steady speed as the references of `benches/` measure theirs
/// (examples of steps 2..N over the time from the end of step 1 to the end of step N).
#[derive(Debug)]
pub struct StepClock {
    started: std::time::Instant,
    first: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
}

impl StepClock {
    /// A clock whose first-step time counts from `started`.
    pub fn new(started: std::time::Instant) -> Self {
        Self {
            started,
            first: None,
            last: None,
        }
    }

    /// Seconds from `started` to the end of the first step (NaN before any step).
    pub fn first_step_s(&self) -> f64 {
        self.first
            .map_or(f64::NAN, |t| t.duration_since(self.started).as_secs_f64())
    }

    /// Examples per second of the steps after the first: `examples` trained in all, of which
    /// `first_step_examples` in the first step (NaN with fewer than two steps).
    pub fn loop_examples_per_s(&self, examples: u64, first_step_examples: u64) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) if last > first => {
                examples.saturating_sub(first_step_examples) as f64
                    / last.duration_since(first).as_secs_f64()
            }
            _ => f64::NAN,
        }
    }
}

impl lockstep_train::Callback for &mut StepClock {
    fn on_train_batch_end(
        &mut self,
        _batch: u64,
        _logs: &lockstep_train::Logs,
        _ctx: &mut lockstep_train::TrainingContext<'_>,
    ) -> Result<(), lockstep_train::TrainError> {
        let now = std::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        Ok(())
    }
}
