//! Replicas on a GPU under the strategies: `fit`, a backup's resume and `Model::load` there.
//!
//! Each test is a skip that the log shows on a machine without a GPU (`LOCKSTEP_REQUIRE_GPU=1`
//! makes that a failure); `cargo xtask gpu-check` runs them where there is one.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

mod common;

use common::{crash_and_resume, digits, gpu, loss, mlp, train, two_gpus, workers_with};
use lockstep_collective::{CommunicationOptions, Compression, Implementation};
use lockstep_nn::Adam;
use lockstep_tensor::{Device, Tensor};
use lockstep_train::{
    History, MirroredStrategy, Model, MultiWorkerMirroredStrategy, OneDeviceStrategy, Strategy,
};

/// Weights trained with Adam on a GPU and on the CPU: their sums round differently, and Adam
/// moves each value by about its learning rate whatever its gradient's size, so a gradient near
/// zero can part the two by twice that a step. Every value lies within that bound over the
/// `steps`, and all but 1% within 1e-4.
fn assert_adam_close(gpu: &[f32], cpu: &[f32], steps: u64) {
    assert_eq!(gpu.len(), cpu.len());
    let bound = 2.0 * 1e-3 * steps as f32;
    let differences: Vec<f32> = gpu.iter().zip(cpu).map(|(a, b)| (a - b).abs()).collect();
    let largest = differences.iter().copied().fold(0.0, f32::max);
    assert!(
        largest <= bound,
        "largest difference {largest} above {bound}"
    );
    let apart = differences.iter().filter(|&&d| d > 1e-4).count();
    assert!(
        apart * 100 <= gpu.len(),
        "{apart} of {} values differ by more than 1e-4",
        gpu.len()
    );
}

/// Steps in [`train`]'s epochs: 640 examples in batches of 64.
const STEPS_PER_EPOCH: u64 = 10;

#[test]
fn mirrored_strategy_on_one_gpu_trains_as_one_device_strategy_on_that_gpu() {
    let Some(gpu) = gpu() else { return };
    let mirrored = MirroredStrategy::with_devices(&[gpu], CommunicationOptions::default()).unwrap();
    let (a, a_history) = train(mirrored, 64, 2, Vec::new()).unwrap();
    let (b, b_history) = train(OneDeviceStrategy::on(gpu).unwrap(), 64, 2, Vec::new()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a_history.history, b_history.history);
    // The same run on the CPU, within the GPU's rounding.
    let (cpu, _) = train(OneDeviceStrategy::new(), 64, 2, Vec::new()).unwrap();
    assert_adam_close(&a, &cpu, 2 * STEPS_PER_EPOCH);
}

#[test]
fn gradients_summed_by_nccl_train_as_those_summed_over_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let with = |implementation| {
        let options = CommunicationOptions {
            implementation,
            ..CommunicationOptions::default()
        };
        let strategy = MirroredStrategy::with_devices(&[gpu], options).unwrap();
        train(strategy, 64, 2, Vec::new()).unwrap()
    };
    let (nccl, nccl_history) = with(Implementation::Nccl);
    let (ring, ring_history) = with(Implementation::Ring);
    // One GPU: NCCL's sum of one rank is the rank's own gradients, as the ring's is.
    assert_eq!(nccl, ring);
    assert_eq!(nccl_history.history, ring_history.history);
    // NCCL is refused for a replica on the CPU.
    let options = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let mixed = MirroredStrategy::with_devices(&[gpu, Device::Cpu], options);
    assert!(
        mixed
            .err()
            .unwrap()
            .to_string()
            .contains("every replica must be on a GPU")
    );
}

#[test]
fn a_replica_on_a_gpu_beside_one_on_the_cpu_trains_as_two_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mixed =
        MirroredStrategy::with_devices(&[gpu, Device::Cpu], CommunicationOptions::default())
            .unwrap();
    let (mixed, _) = train(mixed, 64, 2, Vec::new()).unwrap();
    let (cpu, _) = train(MirroredStrategy::new(2).unwrap(), 64, 2, Vec::new()).unwrap();
    assert_adam_close(&mixed, &cpu, 2 * STEPS_PER_EPOCH);
}

#[test]
fn a_gpu_run_resumed_from_its_backup_ends_bit_identical_to_an_uninterrupted_one() {
    let Some(gpu) = gpu() else { return };
    let strategy = || OneDeviceStrategy::on(gpu).unwrap();
    let (uninterrupted, history) = train(strategy(), 64, 3, Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (resumed, resumed_history) = crash_and_resume(strategy, dir.path());
    assert_eq!(resumed, uninterrupted);
    let last = |h: &History| h.get("loss").unwrap().last().copied();
    assert_eq!(last(&resumed_history), last(&history));
}

#[test]
fn error_feedback_with_a_replica_on_a_gpu_resumes_from_its_backup_bit_identical() {
    let Some(gpu) = gpu() else { return };
    // The GPU replica's gradients are read back, rounded to bf16 with its residuals beside the
    // CPU replica's, and the backup holds both replicas' residuals.
    let options = CommunicationOptions {
        compression: Compression::Bf16,
        error_feedback: true,
        ..CommunicationOptions::default()
    };
    let strategy = || MirroredStrategy::with_devices(&[gpu, Device::Cpu], options).unwrap();
    let (uninterrupted, _) = train(strategy(), 64, 3, Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (resumed, _) = crash_and_resume(strategy, dir.path());
    assert_eq!(resumed, uninterrupted);
}

#[test]
fn a_model_saved_on_a_gpu_loads_onto_a_gpu_and_predicts_the_same() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::new(OneDeviceStrategy::on(gpu).unwrap(), mlp).unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model.fit(&data).verbose(false).run().unwrap();
    model.save(dir.path()).unwrap();
    let loaded = Model::load(OneDeviceStrategy::on(gpu).unwrap(), dir.path()).unwrap();
    assert_eq!(loaded.network().device(), gpu);
    assert_eq!(loaded.network().parameters(), model.network().parameters());
    let x = Tensor::full(&[4, 784], 0.5).unwrap();
    let (a, b) = (model.predict(&x).unwrap(), loaded.predict(&x).unwrap());
    assert_eq!(a.device(), Device::Cpu, "predict hands back host values");
    assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap());
}

#[test]
fn replicas_on_two_gpus_summed_by_nccl_train_as_two_on_the_cpu() {
    if !two_gpus() {
        return;
    }
    let devices = [Device::Cuda(0), Device::Cuda(1)];
    let options = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let (gpus, gpu_history) = train(
        MirroredStrategy::with_devices(&devices, options).unwrap(),
        64,
        2,
        Vec::new(),
    )
    .unwrap();
    let (cpus, cpu_history) = train(MirroredStrategy::new(2).unwrap(), 64, 2, Vec::new()).unwrap();
    assert_adam_close(&gpus, &cpus, 2 * STEPS_PER_EPOCH);
    let last = |h: &History| h.get("loss").unwrap().last().copied().unwrap();
    assert!((last(&gpu_history) - last(&cpu_history)).abs() < 1e-3);
}

#[test]
fn two_workers_on_a_gpu_each_summed_by_one_nccl_group_train_as_two_cpu_replicas() {
    if !two_gpus() {
        return;
    }
    let options = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let results = workers_with(2, 1, options, |strategy| {
        // worker:0 on GPU 0, worker:1 on GPU 1; the NCCL group's id travels over TCP.
        let index: usize = strategy
            .task()
            .trim_start_matches("worker:")
            .parse()
            .unwrap();
        let strategy = strategy.on_devices(&[Device::Cuda(index)]).unwrap();
        train(strategy, 64, 2, Vec::new()).unwrap().0
    });
    assert_eq!(results[0], results[1], "the workers' weights differ");
    let (cpus, _) = train(MirroredStrategy::new(2).unwrap(), 64, 2, Vec::new()).unwrap();
    assert_adam_close(&results[0], &cpus, 2 * STEPS_PER_EPOCH);
}

#[test]
fn workers_each_summing_its_gpus_with_nccl_and_meeting_over_tcp_train_as_over_the_ring() {
    // Both workers on GPU 0 (threads of this process): each has an NCCL group of its own, so
    // one GPU is enough; the workers' sums meet over TCP.
    fn within(strategy: MultiWorkerMirroredStrategy) -> (Vec<f32>, History) {
        let strategy = strategy
            .nccl_within_workers()
            .on_devices(&[Device::Cuda(0)])
            .unwrap();
        train(strategy, 64, 2, Vec::new()).unwrap()
    }
    fn ring(strategy: MultiWorkerMirroredStrategy) -> (Vec<f32>, History) {
        let strategy = strategy.on_devices(&[Device::Cuda(0)]).unwrap();
        train(strategy, 64, 2, Vec::new()).unwrap()
    }
    let Some(_) = gpu() else { return };
    let nccl = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let ring_options = CommunicationOptions {
        implementation: Implementation::Ring,
        ..CommunicationOptions::default()
    };
    let hierarchical = workers_with(2, 1, nccl, within);
    let over_the_ring = workers_with(2, 1, ring_options, ring);
    assert_eq!(hierarchical[0].0, hierarchical[1].0, "the workers differ");
    // Two workers: every sum is a + b whichever way it travels.
    assert_eq!(hierarchical[0].0, over_the_ring[0].0);
    assert_eq!(hierarchical[0].1.history, over_the_ring[0].1.history);
}

#[test]
fn two_workers_of_two_gpus_each_summed_within_by_nccl_train_as_four_cpu_replicas() {
    // Each worker's two replicas on GPUs 0 and 1, in an NCCL group of that worker's own: NCCL
    // sums them, the first carries the sum over TCP, NCCL broadcasts the total back.
    fn within(strategy: MultiWorkerMirroredStrategy) -> Vec<f32> {
        let strategy = strategy
            .nccl_within_workers()
            .on_devices(&[Device::Cuda(0), Device::Cuda(1)])
            .unwrap();
        train(strategy, 64, 2, Vec::new()).unwrap().0
    }
    if !two_gpus() {
        return;
    }
    let nccl = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let results = workers_with(2, 2, nccl, within);
    assert_eq!(results[0], results[1], "the workers' weights differ");
    let (cpus, _) = train(MirroredStrategy::new(4).unwrap(), 64, 2, Vec::new()).unwrap();
    assert_adam_close(&results[0], &cpus, 2 * STEPS_PER_EPOCH);
}

#[test]
fn evaluate_on_a_gpu_gives_the_figures_of_the_weights_it_trained() {
    let Some(gpu) = gpu() else { return };
    let mut model = Model::new(OneDeviceStrategy::on(gpu).unwrap(), mlp).unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let history = model
        .fit(&data)
        .validation_data(&data)
        .verbose(false)
        .run()
        .unwrap();
    // Validation at the epoch's end saw the epoch's last weights, as `evaluate` after `fit` does.
    let validated = history.get("val_loss").unwrap()[0];
    let evaluated = model.evaluate(&data).unwrap();
    assert_eq!(evaluated.get("loss"), Some(validated));
    // The same weights on the CPU give the same figures, within the GPU's rounding.
    let mut on_cpu = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    on_cpu
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    let path = tempfile::tempdir().unwrap();
    model
        .save_weights(path.path().join("w.safetensors"))
        .unwrap();
    on_cpu
        .load_weights(path.path().join("w.safetensors"))
        .unwrap();
    let cpu = on_cpu.evaluate(&data).unwrap();
    let (a, b) = (evaluated.get("loss").unwrap(), cpu.get("loss").unwrap());
    assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
}

#[test]
fn a_gpu_this_process_cannot_use_is_refused_naming_it() {
    let missing = Device::Cuda(64);
    let err = MirroredStrategy::with_devices(&[missing], CommunicationOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("cuda:64"), "{err}");
    assert!(OneDeviceStrategy::on(missing).is_err());
    if let Some(gpu) = gpu() {
        let twice = MirroredStrategy::with_devices(&[gpu, gpu], CommunicationOptions::default());
        assert!(twice.err().unwrap().to_string().contains("named twice"));
    }
    // With no devices named: every visible GPU, or the CPU.
    let all = MirroredStrategy::all_devices().unwrap();
    let visible = lockstep_train::visible_devices();
    assert_eq!(
        lockstep_train::Strategy::num_replicas_in_sync(&all),
        visible.len()
    );
}
