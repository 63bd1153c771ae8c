//! The kernels' threads.

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

use crate::cpus::CpuList;
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

/// Starts the kernel threads as [`start_kernel_threads`] does, each pinned to one core of
/// `cpus` in turn (thread `i` to the `i`-th, modulo their number), and returns how many:
/// `requested` when non-zero, else one a core. A step's own kernel threads take the same
/// cores (`lockstep-train` copies them from this pool), and so does the thread that sums its
/// gradients while the backward pass runs: workers that share a host, each given cores of its
/// own, then never run their kernels on one core while another idles, and a worker's
/// communication takes the core from its own kernels, not from another worker's. The parallel
/// parts of an input pipeline's `map` run on this pool too; its prefetch threads and the rest
/// stay where the process may run. More threads than cores share them (said in the log), and
/// every step waits for the slowest. Linux only.
///
/// # Errors
///
/// When a core is not one this process may run on (`taskset`, a cgroup's `cpuset`, a
/// container's CPUs), or the pool cannot start (it was started already).
pub fn start_kernel_threads_on(cpus: &CpuList, requested: usize) -> Result<usize, TaskError> {
    let allowed = sched_getaffinity(None).map_err(|e| TaskError::Cpus {
        cpus: cpus.to_string(),
        why: format!("this process's cores could not be read: {e}"),
    })?;
    if let Some(&cpu) = cpus.cpus().iter().find(|&&cpu| !allowed.is_set(cpu)) {
        return Err(TaskError::Cpus {
            cpus: cpus.to_string(),
            why: format!(
                "core {cpu} is not one this process may run on ({})",
                CpuList::of_set(&allowed)
            ),
        });
    }
    let list = cpus.cpus().to_vec();
    let threads = if requested > 0 { requested } else { list.len() };
    if threads > list.len() {
        tracing::warn!(
            threads,
            cores = %cpus,
            "more kernel threads than cores to pin them to: some share a core, and every step waits for them"
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |i| {
            let Some(&cpu) = list.get(i % list.len().max(1)) else {
                return;
            };
            let mut one = CpuSet::new();
            one.set(cpu);
            if let Err(e) = sched_setaffinity(None, &one) {
                tracing::warn!(thread = i, cpu, error = %e, "a kernel thread could not be pinned to its core");
            }
        })
        .build_global()?;
    Ok(threads)
}
