//! Kernel threads pinned to cores. A test binary of its own: it builds the process's global
//! pool.

#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "a test that meets an error must fail loudly"
)]

use clap::Parser;
use lockstep_task::{
    ClusterTrainingArgs, CpuList, KernelThreadArgs, MAX_CPUS, TaskError, start_kernel_threads_on,
};
use rustix::thread::{CpuSet, sched_getaffinity};

/// The cores this process may run on.
fn allowed() -> Vec<usize> {
    let set = sched_getaffinity(None).unwrap();
    (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}

#[test]
fn each_kernel_thread_runs_on_its_core_in_turn() {
    let cores = allowed();
    let listed: Vec<String> = cores.iter().take(2).map(ToString::to_string).collect();
    let cpus: CpuList = listed.join(",").parse().unwrap();
    // Three threads on one or two cores: the list is taken in turn.
    assert_eq!(start_kernel_threads_on(&cpus, 3).unwrap(), 3);
    let mut each = rayon::broadcast(|ctx| (ctx.index(), sched_getaffinity(None).unwrap()));
    each.sort_by_key(|(i, _)| *i);
    assert_eq!(each.len(), 3);
    for (i, set) in each {
        let core = cpus.cpus()[i % cpus.cpus().len()];
        assert_eq!(set.count(), 1, "thread {i}");
        assert!(set.is_set(core), "thread {i} on core {core}");
    }
    // The calling thread keeps every core it had.
    assert_eq!(allowed(), cores);
}

#[test]
fn a_core_the_process_may_not_run_on_is_refused_by_number() {
    let outside = (0..MAX_CPUS)
        .rev()
        .find(|c| !allowed().contains(c))
        .unwrap();
    let cpus: CpuList = outside.to_string().parse().unwrap();
    let error = start_kernel_threads_on(&cpus, 0).unwrap_err();
    assert!(matches!(error, TaskError::Cpus { .. }), "{error}");
    assert!(
        error.to_string().contains(&format!(
            "core {outside} is not one this process may run on"
        )),
        "{error}"
    );
}

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    training: ClusterTrainingArgs,
}

#[test]
fn the_flag_reads_a_core_list_and_refuses_a_malformed_one() {
    let args = Args::try_parse_from(["train", "--kernel-cpus", "0-2,5"]).unwrap();
    assert_eq!(
        args.training.kernels.kernel_cpus.unwrap().cpus(),
        [0, 1, 2, 5].as_slice()
    );
    let plain = Args::try_parse_from(["train"]).unwrap();
    assert!(plain.training.kernels.kernel_cpus.is_none());
    let error = Args::try_parse_from(["train", "--kernel-cpus", "2-1"])
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("the range 2-1 runs backwards"), "{error}");
}

#[derive(Parser)]
struct KernelsAlone {
    #[command(flatten)]
    kernels: KernelThreadArgs,
}

#[test]
fn a_program_with_no_other_training_flag_takes_the_kernel_flags_alone() {
    let args =
        KernelsAlone::try_parse_from(["mirrored", "--threads", "3", "--kernel-cpus", "1"]).unwrap();
    assert_eq!(args.kernels.threads, 3);
    assert_eq!(args.kernels.kernel_cpus.unwrap().cpus(), [1].as_slice());
    let plain = KernelsAlone::try_parse_from(["mirrored"]).unwrap();
    assert_eq!(plain.kernels.threads, 0);
    assert!(plain.kernels.kernel_cpus.is_none());
    assert!(KernelsAlone::try_parse_from(["mirrored", "--epochs", "1"]).is_err());
}
