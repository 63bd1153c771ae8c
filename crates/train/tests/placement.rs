//! Where a multi-worker strategy's replicas run, and when NCCL sums their gradients: what every
//! worker decides alike, checked on the CPU (the GPU cases are in `gpu.rs`).

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

mod common;

use common::{digits, loss, mlp, workers_with};
use lockstep_collective::{CommunicationOptions, Implementation};
use lockstep_nn::Adam;
use lockstep_tensor::Device;
use lockstep_train::{Model, MultiWorkerMirroredStrategy, Strategy};

fn options(implementation: Implementation) -> CommunicationOptions {
    CommunicationOptions {
        implementation,
        ..CommunicationOptions::default()
    }
}

/// Two workers of one replica, each `prepare`d, then placed on the CPU: every worker's
/// error, which must say `expected`.
fn every_worker_refuses(
    implementation: Implementation,
    prepare: fn(MultiWorkerMirroredStrategy) -> MultiWorkerMirroredStrategy,
    expected: &str,
) {
    let errors = workers_with(2, 1, options(implementation), move |strategy| {
        prepare(strategy)
            .on_devices(&[Device::Cpu])
            .err()
            .map(|e| e.to_string())
    });
    for error in errors {
        let error = error.unwrap_or_default();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn nccl_asked_for_replicas_placed_on_the_cpu_is_refused_on_every_worker() {
    every_worker_refuses(
        Implementation::Nccl,
        |s| s,
        "every replica must be on a GPU",
    );
}

#[test]
fn nccl_asked_for_replicas_never_placed_is_refused_when_the_model_is_built() {
    let errors = workers_with(2, 1, options(Implementation::Nccl), |strategy| {
        Model::new(strategy, mlp).err().map(|e| e.to_string())
    });
    for error in errors {
        let error = error.unwrap_or_default();
        assert!(error.contains("on_devices"), "{error}");
    }
}

#[test]
fn auto_with_replicas_on_the_cpu_agrees_on_the_cpus_transports_and_trains() {
    fn train(strategy: MultiWorkerMirroredStrategy) -> Vec<f32> {
        let strategy = strategy.on_devices(&[Device::Cpu, Device::Cpu]).unwrap();
        let mut model = Model::new(strategy, mlp).unwrap();
        model.compile(Adam::default(), loss(), &[]).unwrap();
        let data = model.distribute_dataset(digits(), 64).unwrap();
        model.fit(&data).verbose(false).run().unwrap();
        model.network().parameters().values().to_vec()
    }
    let weights = workers_with(2, 2, options(Implementation::Auto), train);
    assert_eq!(weights[0], weights[1]);
    // The same as without placing them: the CPU's transports either way.
    let unplaced = workers_with(2, 2, options(Implementation::Auto), |strategy| {
        let mut model = Model::new(strategy, mlp).unwrap();
        model.compile(Adam::default(), loss(), &[]).unwrap();
        let data = model.distribute_dataset(digits(), 64).unwrap();
        model.fit(&data).verbose(false).run().unwrap();
        model.network().parameters().values().to_vec()
    });
    assert_eq!(weights[0], unplaced[0]);
}

#[test]
fn nccl_within_workers_needs_every_replica_on_a_gpu_and_leaves_auto_on_the_cpu_alone() {
    every_worker_refuses(
        Implementation::Nccl,
        MultiWorkerMirroredStrategy::nccl_within_workers,
        "every replica must be on a GPU",
    );
    let weights = workers_with(2, 1, options(Implementation::Auto), |strategy| {
        let strategy = strategy
            .nccl_within_workers()
            .on_devices(&[Device::Cpu])
            .unwrap();
        let mut model = Model::new(strategy, mlp).unwrap();
        model.compile(Adam::default(), loss(), &[]).unwrap();
        let data = model.distribute_dataset(digits(), 64).unwrap();
        model.fit(&data).verbose(false).run().unwrap();
        model.network().parameters().values().to_vec()
    });
    assert_eq!(weights[0], weights[1]);
}

#[test]
fn workers_that_disagree_on_nccl_within_workers_all_stop_saying_so() {
    every_worker_refuses(
        Implementation::Auto,
        |strategy| {
            if strategy.task() == "worker:1" {
                strategy.nccl_within_workers()
            } else {
                strategy
            }
        },
        "disagree on nccl_within_workers",
    );
}

#[test]
fn devices_for_another_number_of_replicas_are_refused() {
    let errors = workers_with(1, 2, CommunicationOptions::default(), |strategy| {
        strategy
            .on_devices(&[Device::Cpu])
            .err()
            .map(|e| e.to_string())
    });
    let error = errors[0].clone().unwrap_or_default();
    assert!(error.contains("1 devices for 2 replicas"), "{error}");
}
