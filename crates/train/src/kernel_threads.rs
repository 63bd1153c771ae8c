//! A step's own kernel threads. A kernel called from inside a rayon pool forks its parallel
//! parts onto the pool's queues and runs one itself; called from outside, every kernel hands
//! its whole job in and sleeps until a pool thread has woken and finished it, a round trip
//! through the scheduler that cost more than the arithmetic of a small model's step. So a step
//! runs on a thread of a pool, and the pool is its own, not rayon's global one: a step blocks
//! its thread in collectives or on the network, and a global pool's thread blocked so may be
//! the one another step needs (a deadlock).
//!
//! The pool takes the cores of rayon's global pool: where that pool's threads were pinned to
//! cores (`lockstep_task::start_kernel_threads_on`), thread `i` here is pinned as thread `i`
//! there, and the thread that sums a step's gradients runs on any of their cores (also where
//! a process's several replicas run their steps on threads of their own).

use std::sync::Arc;

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// A step's kernel threads, and the cores they were pinned to, if any.
pub(crate) struct KernelThreads {
    pub(crate) pool: Arc<rayon::ThreadPool>,
    /// Every core of the pool's threads, where they were pinned: the cores the thread that
    /// sums a step's gradients runs on ([`keep_to_cores`]).
    cores: Option<CpuSet>,
}

/// Keeps the calling thread (a step's communication thread) to its kernels' `cores`, where
/// they have any of their own (said in the log if that fails: the thread then runs where it
/// was).
pub(crate) fn keep_to_cores(cores: Option<&CpuSet>) {
    if let Some(cores) = cores
        && let Err(e) = sched_setaffinity(None, cores)
    {
        tracing::warn!(error = %e, "a step's communication thread could not be kept to its kernels' cores");
    }
}

impl KernelThreads {
    /// The cores of the pool's threads, where they were pinned.
    pub(crate) fn cores(&self) -> Option<&CpuSet> {
        self.cores.as_ref()
    }
}

/// A pool of as many kernel threads as rayon's global pool has (`--threads`), on the same
/// cores, or `None` when they cannot start (said in the log): steps then run on the calling
/// thread.
pub(crate) fn own_pool() -> Option<KernelThreads> {
    let pinned = global_pool_cores();
    let mut builder = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("lockstep-kernels-{i}"));
    let mut cores = None;
    if let Some(each) = pinned {
        cores = Some(union(&each));
        builder = builder.start_handler(move |i| {
            if let Some(set) = each.get(i)
                && let Err(e) = sched_setaffinity(None, set)
            {
                tracing::warn!(thread = i, error = %e, "a step's kernel thread could not be pinned as rayon's are");
            }
        });
    }
    match builder.build() {
        Ok(pool) => Some(KernelThreads {
            pool: Arc::new(pool),
            cores,
        }),
        Err(e) => {
            tracing::warn!(%e, "could not start a step's kernel threads; its steps run on the calling thread");
            None
        }
    }
}

/// Every core of rayon's global pool's threads, where they were pinned: where a step's
/// communication thread runs when its replica has no kernel threads of its own.
pub(crate) fn pinned_cores() -> Option<CpuSet> {
    global_pool_cores().map(|each| union(&each))
}

/// The cores in any of `sets`.
fn union(sets: &[CpuSet]) -> CpuSet {
    let mut all = CpuSet::new();
    for set in sets {
        for cpu in (0..CpuSet::MAX_CPU).filter(|&cpu| set.is_set(cpu)) {
            all.set(cpu);
        }
    }
    all
}

/// The cores of each of rayon's global pool's threads, in the pool's order, where some
/// thread's differ from the calling thread's (the pool was pinned); `None` otherwise, or
/// where they cannot be read.
fn global_pool_cores() -> Option<Vec<CpuSet>> {
    let here = sched_getaffinity(None).ok()?;
    let each: Option<Vec<CpuSet>> = rayon::broadcast(|_| sched_getaffinity(None).ok())
        .into_iter()
        .collect();
    each.filter(|each| each.iter().any(|set| *set != here))
}
