//! A step's own kernel threads. A kernel called from inside a rayon pool forks its parallel
//! parts onto the pool's queues and runs one itself; called from outside, every kernel hands
//! its whole job in and sleeps until a pool thread has woken and finished it, a round trip
//! through the scheduler that cost more than the arithmetic of a small model's step. So a step
//! runs on a thread of a pool, and the pool is its own, not rayon's global one: a step blocks
//! its thread in collectives or on the network, and a global pool's thread blocked so may be
//! the one another step needs (a deadlock).

use std::sync::Arc;

/// A pool of as many kernel threads as rayon's global pool has (`--threads`), or `None` when
/// they cannot start (said in the log): steps then run on the calling thread.
pub(crate) fn own_pool() -> Option<Arc<rayon::ThreadPool>> {
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("lockstep-kernels-{i}"))
        .build();
    match built {
        Ok(pool) => Some(Arc::new(pool)),
        Err(e) => {
            tracing::warn!(%e, "could not start a step's kernel threads; its steps run on the calling thread");
            None
        }
    }
}
