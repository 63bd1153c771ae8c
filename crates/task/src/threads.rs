//! The kernels' threads.

use crate::error::TaskError;

/// Starts the kernel threads (rayon's global pool) and returns how many: `requested` when
/// non-zero, else this host's cores shared out among `sharers` (the cluster's tasks on this
/// host, or one process's replicas), at least one. Oversubscribed kernel threads would make
/// every step wait for the slowest of them.
///
/// # Errors
///
/// When the pool cannot start (it was started already).
pub fn start_kernel_threads(requested: usize, sharers: usize) -> Result<usize, TaskError> {
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
