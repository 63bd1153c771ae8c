//! What the example binaries share: the set-up every training program does, from
//! `lockstep-task` (logs, kernel threads, the cluster and its flags, a private state
//! directory) and `lockstep-train`'s step clock, the examples' own allocator setting, and the
//! lines several examples print alike.
//!
//! Each binary is a thin `main` over the library crates.

pub use lockstep_task::{
    ClusterArgs, ClusterTrainingArgs, CommunicationArgs, KernelThreadArgs, colour_logs,
    init_logging, private_state_dir,
};
pub use lockstep_train::StepClock;

/// The start of a program under `ParameterServerStrategy`: its flags checked (a step is one
/// worker's batch, so `--global-batch` has no meaning), the cluster resolved, kernel threads
/// started, and the strategy with the cluster's secret and the rendezvous timeout.
///
/// # Errors
///
/// A batch of 0, `--global-batch`, or a cluster, thread pool or secret that cannot be had.
pub fn parameter_server_strategy(
    training: &ClusterTrainingArgs,
    cluster: &ClusterArgs,
) -> anyhow::Result<lockstep_train::ParameterServerStrategy> {
    if training.batch_per_worker == 0 {
        anyhow::bail!("--batch-per-worker must be at least 1");
    }
    if training.global_batch.is_some() {
        anyhow::bail!(
            "under ParameterServerStrategy each step is one worker's batch: use --batch-per-worker"
        );
    }
    let resolved = cluster.resolve()?;
    training.start_kernel_threads(resolved.spec().tasks().count())?;
    let secret = lockstep_collective::ClusterSecret::from_env()?;
    Ok(
        lockstep_train::ParameterServerStrategy::new(resolved, secret)?
            .with_timeout(cluster.rendezvous_timeout()),
    )
}

/// A `ps` task's part: serve its shards until the chief ends training, then print how many
/// updates it applied (`updates_applied=N`).
///
/// # Errors
///
/// As [`lockstep_train::ParameterServerStrategy::serve_parameters`].
pub fn serve_parameters(strategy: &lockstep_train::ParameterServerStrategy) -> anyhow::Result<()> {
    let updates = strategy.serve_parameters()?;
    println!("updates_applied={updates}");
    Ok(())
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

/// The line an evaluator task prints when it is done: how many checkpoints it evaluated, and
/// the last one's name, step and test figures; `None` when it evaluated none.
pub fn evaluation_summary(evaluations: &[lockstep_train::Evaluation]) -> Option<String> {
    let last = evaluations.last()?;
    Some(format!(
        "evaluated={} last_checkpoint={} iterations={} test_accuracy={:.4} test_loss={:.4}",
        evaluations.len(),
        last.checkpoint
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        last.iterations,
        last.logs.get("accuracy").unwrap_or(f64::NAN),
        last.logs.get("loss").unwrap_or(f64::NAN),
    ))
}

/// This process's peak resident memory in MiB (`VmHWM`), when the system tells.
pub fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// FNV-1a over `words`: a checksum that is the same in every process and on every run.
pub fn fnv1a(words: impl Iterator<Item = u64>) -> u64 {
    words.fold(0xcbf2_9ce4_8422_2325, |h, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
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
    fn freed_memory_stays_mapped_once_asked() {
        // mimalloc 3's default purge delay is 1,000 ms (its `options.c`): the option named
        // here is that one.
        assert_eq!(purge_delay(), 1000);
        keep_freed_memory_mapped();
        assert_eq!(purge_delay(), -1);
    }
}
