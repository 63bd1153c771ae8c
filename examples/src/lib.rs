//! What the example binaries share: how they log, and how many kernel threads they start.
//!
//! Each binary is a thin `main` over the library crates; these are the pieces of set-up they
//! have in common.

use std::io::IsTerminal as _;

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
    /// Seed of the initial weights and of the shuffle (the same on every worker).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Threads for the kernels; 0 = this host's cores shared out among the workers the
    /// cluster spec places on it (all of them for a worker alone on its host).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}
