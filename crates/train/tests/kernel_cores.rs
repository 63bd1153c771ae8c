//! A step's own kernel threads, and the thread that sums its gradients, run on the cores that
//! rayon's global pool was pinned to (`lockstep_task::start_kernel_threads_on`). A test binary
//! of its own: it builds the process's global pool.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use common::{digits, loss, mlp};
use lockstep_collective::CommunicationOptions;
use lockstep_nn::Adam;
use lockstep_train::{MirroredStrategy, Model};
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// Every thread of this process whose name starts with `prefix`, with the cores it may run
/// on, as `/proc` lists them (`0-1`, `3`).
fn threads_named(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        let Ok(name) = std::fs::read_to_string(task.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        let cores = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_owned();
        found.push(cores);
    }
    found
}

#[test]
fn a_steps_threads_run_on_the_cores_rayons_threads_were_pinned_to() {
    let allowed = sched_getaffinity(None).unwrap();
    let core = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c)).unwrap();
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .start_handler(move |_| {
            let mut one = CpuSet::new();
            one.set(core);
            sched_setaffinity(None, &one).unwrap();
        })
        .build_global()
        .unwrap();
    // One replica (whose step runs on the model's own kernel threads), packs of 4 KiB with
    // the update in flight (summed on the communication thread).
    let options = CommunicationOptions {
        bytes_per_pack: 4 * 1024,
        overlap_update: true,
        ..CommunicationOptions::default()
    };
    let mut model = Model::new(MirroredStrategy::with_options(1, options).unwrap(), mlp).unwrap();
    model.compile(Adam::default(), loss(), &[]).unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model.fit(&data).verbose(false).run().unwrap();

    let kernels = threads_named("lockstep-kernel");
    assert_eq!(kernels.len(), 2, "one a global pool's thread: {kernels:?}");
    let packs = threads_named("lockstep-packs");
    assert_eq!(packs.len(), 1, "the communication thread: {packs:?}");
    for cores in kernels.iter().chain(&packs) {
        assert_eq!(*cores, core.to_string());
    }
    // The rest of the process may still run on every core it could.
    let here = sched_getaffinity(None).unwrap();
    assert_eq!(here, allowed);
    drop(model); // joins its communication thread

    // Two replicas run their steps on threads of their own; their communication threads
    // take the pinned cores all the same.
    let mut model = Model::new(MirroredStrategy::with_options(2, options).unwrap(), mlp).unwrap();
    model.compile(Adam::default(), loss(), &[]).unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model.fit(&data).verbose(false).run().unwrap();
    let packs = threads_named("lockstep-packs");
    assert_eq!(
        packs.len(),
        2,
        "a communication thread a replica: {packs:?}"
    );
    for cores in &packs {
        assert_eq!(*cores, core.to_string());
    }
}
