//! Single-process training on the MNIST subset: the Keras guide's MLP and the multi-worker
//! tutorial's CNN reach the accuracy TensorFlow reaches with the same settings.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use lockstep_data::Dataset;
use lockstep_data::mnist::{Mnist, MnistSplit};
use lockstep_nn::{
    Activation, ActivationLayer, Adam, Conv2D, Dense, Flatten, ForwardContext, Layer, MaxPooling2D,
    Metric, Optimizer, Reduction, Sequential, SparseCategoricalAccuracy,
    SparseCategoricalCrossentropy, models,
};
use lockstep_tensor::{Device, Tensor};
use lockstep_testenv::{Need, available, skip};

fn mlp(seed: u64) -> Sequential {
    models::mnist_mlp(seed).unwrap()
}

fn cnn(seed: u64) -> Sequential {
    models::mnist_cnn(seed).unwrap()
}

/// [`cnn`] with biases away from zero, for comparing a GPU's gradients with the CPU's.
///
/// With Keras' zero biases, a convolution over a patch of zeros (MNIST's background) is exactly
/// 0 in a direct or im2col convolution (the GPU's, PyTorch's), where relu's gradient is 0. The
/// CPU's Winograd convolution (the second layer's) leaves rounding residues of about 1e-9
/// there instead, and a positive residue passes the gradient: the bias's gradient at the
/// first step then differs by up to a quarter (seen on an H200; float64 PyTorch agrees with
/// the GPU). Both are subgradients at relu's kink. With biases of ±0.005 to ±0.035 no output sits on the
/// kink and the CPU agrees with float64 PyTorch to 1e-8.
fn cnn_off_the_kink(seed: u64) -> Sequential {
    let mut model = cnn(seed);
    let biases: Vec<std::ops::Range<usize>> = model
        .parameters()
        .specs()
        .iter()
        .filter(|spec| spec.name.ends_with("/bias"))
        .map(|spec| spec.offset..spec.offset + spec.len())
        .collect();
    for range in biases {
        for (i, b) in model.parameters_mut().values_mut()[range]
            .iter_mut()
            .enumerate()
        {
            *b = 0.01 * ((i % 7) as f32 - 3.5);
        }
    }
    model
}

/// A batch as the model's input tensor and labels; `flat` gives `[batch, 784]`.
fn to_tensor(images: ndarray::Array4<f32>, flat: bool) -> Tensor {
    let shape = images.shape().to_vec();
    let shape = if flat { vec![shape[0], 784] } else { shape };
    Tensor::from_vec(images.into_raw_vec_and_offset().0, &shape).unwrap()
}

/// The shuffle seed of the training tests. Accuracy depends on data order as much as on the
/// initial weights. Sweeps over model seeds 0–5 with data seeds 100–105:
/// - MLP, batch 32, 2 epochs: 0.922–0.941, mean 0.932 (TensorFlow 2.21: 0.933 [0.932–0.937]);
/// - CNN, 3 epochs: batch 64 0.954–0.961 (mean 0.958); batch 32, Keras' default, 0.958–0.970
///   (mean 0.964, seeds 0–3).
///
/// These tests use the first pair, model seed 0 with data seed 100.
///
/// The CNN at batch 32 over model seeds 0–3 × data seeds 100–102 (12 CPU runs, 2026-11):
/// 0.9581–0.9691, mean 0.965; the lowest, 0.9581, at model seed 3, data seed 101.
const DATA_SEED: u64 = 100;

/// The accuracy bar of the CNN trained on a GPU. Its sums add in other orders than the CPU's
/// (cuBLAS, the loss), so its run is a new draw from the seed-to-seed spread above rather than
/// a copy of the CPU's run: the bar sits below every CPU run tried (0.9581). The CPU's own
/// test keeps 0.96: its run (0.9661) is the same on every machine.
const GPU_CNN_ACCURACY_BAR: f64 = 0.95;

/// Trains with Adam in a [`lockstep_nn::TrainingSession`] (on the model's device) and returns
/// the test accuracy.
fn train(
    model: &mut Sequential,
    split: &MnistSplit,
    test: &MnistSplit,
    epochs: u64,
    batch: usize,
    flat: bool,
) -> f64 {
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let mut adam = Adam::default();
    let mut session = model.training(&mut adam).unwrap();
    let data = split
        .dataset()
        .unwrap()
        .map(|(x, y)| (lockstep_data::mnist::scale(&x).into_shared(), y))
        .cache()
        .shuffle(10_000, DATA_SEED, true)
        .batch(batch, false);
    let mut step = 0;
    for epoch in 0..epochs {
        for item in data.iter_epoch(epoch).unwrap() {
            let (x, y) = item.unwrap();
            let labels: Vec<usize> = y.iter().map(|&l| usize::from(l)).collect();
            let ctx = ForwardContext::training(step, 0);
            session
                .step(&to_tensor(x.into_owned(), flat), ctx, |logits| {
                    loss_fn.call(logits, &labels)
                })
                .unwrap();
            step += 1;
        }
    }
    session.finish().unwrap();
    evaluate(model, test, flat)
}

fn evaluate(model: &Sequential, test: &MnistSplit, flat: bool) -> f64 {
    let mut accuracy = SparseCategoricalAccuracy::default();
    let data = test
        .dataset()
        .unwrap()
        .map(|(x, y)| (lockstep_data::mnist::scale(&x), y))
        .batch(500, false);
    for item in data.iter().unwrap() {
        let (x, y) = item.unwrap();
        let labels: Vec<usize> = y.iter().map(|&l| usize::from(l)).collect();
        accuracy
            .update(&model.predict(&to_tensor(x, flat)).unwrap(), &labels)
            .unwrap();
    }
    accuracy.result()
}

#[test]
fn the_keras_guide_mlp_reaches_92_percent_in_two_epochs() {
    let mnist = Mnist::embedded().unwrap();
    let mut model = mlp(0);
    assert_eq!(model.parameters().len(), 269_322);
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 2, 32, true);
    assert!(accuracy >= 0.92, "test accuracy {accuracy}");
}

#[test]
fn the_tutorial_cnn_reaches_96_percent_in_three_epochs() {
    let mnist = Mnist::embedded().unwrap();
    let mut model = cnn(0);
    assert_eq!(model.parameters().len(), 225_034);
    // Keras' default batch size: see DATA_SEED for batch 64.
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 3, 32, false);
    assert!(accuracy >= 0.96, "test accuracy {accuracy}");
}

/// The model on the first GPU, or `None` after a skip that the log shows where there is none;
/// `LOCKSTEP_REQUIRE_GPU=1` (set by `cargo xtask gpu-check`'s runner) makes that a failure.
#[track_caller]
fn on_gpu(model: Sequential) -> Option<Sequential> {
    available(
        Need::Gpu,
        model.to_device(Device::Cuda(0)).map_err(|(_, e)| e),
    )
}

#[test]
fn the_tutorial_cnn_trained_on_a_gpu_reaches_the_cpus_accuracy() {
    let Some(mut model) = on_gpu(cnn(0)) else {
        return;
    };
    let mnist = Mnist::embedded().unwrap();
    let accuracy = train(&mut model, &mnist.train, &mnist.test, 3, 32, false);
    assert!(
        accuracy >= GPU_CNN_ACCURACY_BAR,
        "test accuracy {accuracy} below {GPU_CNN_ACCURACY_BAR}"
    );
}

#[test]
fn a_step_on_a_gpu_gives_the_cpus_loss_and_gradients() {
    let Some(gpu) = on_gpu(cnn_off_the_kink(3)) else {
        return;
    };
    let cpu = cnn_off_the_kink(3);
    let (x, labels) = first_batch(64);
    let step = |model: &Sequential| {
        let forward = model.forward(&x, ForwardContext::default()).unwrap();
        assert_eq!(forward.output.device(), model.device());
        let loss = LOSS.call(&forward.output, &labels).unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        (loss.item().unwrap(), grads)
    };
    let ((cpu_loss, cpu_grads), (gpu_loss, gpu_grads)) = (step(&cpu), step(&gpu));
    assert!(
        (cpu_loss - gpu_loss).abs() <= 1e-4 * cpu_loss.abs(),
        "{cpu_loss} vs {gpu_loss}"
    );
    let scale = cpu_grads.iter().fold(1e-3_f32, |m, v| m.max(v.abs()));
    for (i, (c, g)) in cpu_grads.iter().zip(&gpu_grads).enumerate() {
        assert!(
            (c - g).abs() <= 1e-3 * scale,
            "gradient {i}: cpu {c} vs gpu {g}"
        );
    }
}

#[test]
fn moving_a_model_to_a_missing_gpu_hands_it_back_with_the_reason() {
    match cnn(0).to_device(Device::Cuda(0)) {
        Ok(model) => assert_eq!(model.device(), Device::Cuda(0)),
        Err((model, e)) => {
            assert_eq!(model.device(), Device::Cpu);
            assert!(e.to_string().contains("cuda:0"), "{e}");
        }
    }
}

#[test]
fn the_same_seed_gives_bit_identical_weights_after_training() {
    let mnist = Mnist::embedded().unwrap();
    let small = MnistSplit {
        images: mnist
            .train
            .images
            .slice(ndarray::s![..512, .., .., ..])
            .to_owned(),
        labels: mnist.train.labels.slice(ndarray::s![..512]).to_owned(),
    };
    let run = || {
        let mut model = cnn(3);
        train(&mut model, &small, &small, 1, 64, false);
        model.parameters().values().to_vec()
    };
    assert_eq!(run(), run());
    assert_ne!(cnn(3).parameters().values(), cnn(4).parameters().values());
}

#[test]
fn the_summary_lists_layers_shapes_and_counts_like_keras() {
    let summary = cnn(0).summary();
    for expected in [
        "conv2d (Conv2D)",
        "(None, 26, 26, 32)",
        "max_pooling2d_1 (MaxPooling2D)",
        "(None, 5, 5, 64)",
        "flatten (Flatten)",
        "(None, 1600)",
        "dense_1 (Dense)",
        "204928",
        "Total params: 225034",
    ] {
        assert!(
            summary.contains(expected),
            "missing {expected:?} in\n{summary}"
        );
    }
}

#[test]
fn a_batch_of_the_wrong_shape_is_an_error_naming_the_expected_shape() {
    let model = cnn(0);
    let err = model
        .predict(&Tensor::zeros(&[2, 28, 28]).unwrap())
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "model input: expected shape (None, 28, 28, 1), got [2, 28, 28]"
    );
    let too_small = Sequential::new(&[2, 2, 1], vec![Box::new(Conv2D::new(4, (3, 3)))], 0);
    assert!(
        too_small
            .err()
            .unwrap()
            .to_string()
            .contains("cannot apply to a 2×2 input")
    );
    assert!(Sequential::new(&[4], vec![Box::new(Dense::new(0))], 0).is_err());
}

#[test]
fn a_convolution_and_the_pooling_after_it_run_fused_with_the_results_of_running_apart() {
    // An activation layer between the two keeps them apart; its layer has no variables, so the
    // same seed gives both models the same weights.
    let fused = cnn(5);
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Conv2D::new(32, (3, 3))),
        Box::new(ActivationLayer(Activation::Relu)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Conv2D::new(64, (3, 3)).activation(Activation::Relu)),
        Box::new(ActivationLayer(Activation::Linear)),
        Box::new(MaxPooling2D::new((2, 2))),
        Box::new(Flatten),
        Box::new(Dense::new(128).activation(Activation::Relu)),
        Box::new(Dense::new(10)),
    ];
    let apart = Sequential::new(&[28, 28, 1], layers, 5).unwrap();
    assert_eq!(fused.parameters().values(), apart.parameters().values());
    let mnist = Mnist::embedded().unwrap();
    let images = mnist.train.images_f32();
    let x = to_tensor(
        images.slice(ndarray::s![..16, .., .., ..]).to_owned(),
        false,
    );
    let labels: Vec<usize> = mnist
        .train
        .labels
        .iter()
        .take(16)
        .map(|&l| usize::from(l))
        .collect();
    let loss_fn = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::SumOverBatchSize,
    };
    let outputs_and_gradients = |model: &Sequential| {
        let forward = model.forward(&x, ForwardContext::default()).unwrap();
        let loss = loss_fn.call(&forward.output, &labels).unwrap();
        let mut grads = vec![0.0; model.parameters().len()];
        model
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        (forward.output.to_vec().unwrap(), grads)
    };
    let (fused_out, fused_grads) = outputs_and_gradients(&fused);
    let (apart_out, apart_grads) = outputs_and_gradients(&apart);
    let scale = |v: &[f32]| v.iter().fold(1e-3_f32, |m, x| m.max(x.abs()));
    for (what, f, a) in [
        ("outputs", &fused_out, &apart_out),
        ("gradients", &fused_grads, &apart_grads),
    ] {
        let tolerance = 1e-4 * scale(a);
        for (i, (f, a)) in f.iter().zip(a.iter()).enumerate() {
            assert!(
                (f - a).abs() <= tolerance,
                "{what}[{i}]: fused {f} vs apart {a}"
            );
        }
    }
}

/// The first `n` training images as a batch, with their labels.
fn first_batch(n: usize) -> (Tensor, Vec<usize>) {
    let mnist = Mnist::embedded().unwrap();
    let images = mnist.train.images_f32();
    let x = to_tensor(images.slice(ndarray::s![..n, .., .., ..]).to_owned(), false);
    let labels = mnist
        .train
        .labels
        .iter()
        .take(n)
        .map(|&l| usize::from(l))
        .collect();
    (x, labels)
}

const LOSS: SparseCategoricalCrossentropy = SparseCategoricalCrossentropy {
    from_logits: true,
    reduction: Reduction::SumOverBatchSize,
};

/// `steps` training steps of `model` with `optimizer` in a session on the model's device, on
/// one batch; returns the losses.
fn session_steps(
    model: &mut Sequential,
    optimizer: &mut dyn Optimizer,
    (x, labels): &(Tensor, Vec<usize>),
    steps: u64,
) -> Vec<f32> {
    let mut session = model.training(optimizer).unwrap();
    let losses = (0..steps)
        .map(|step| {
            let ctx = ForwardContext::training(step, 0);
            let loss = session
                .step(x, ctx, |logits| LOSS.call(logits, labels))
                .unwrap();
            loss.item().unwrap()
        })
        .collect();
    session.finish().unwrap();
    losses
}

#[test]
fn a_session_on_the_cpu_trains_bit_for_bit_as_the_hand_written_loop() {
    let batch = first_batch(32);
    let (mut by_session, mut by_hand) = (cnn(5), cnn(5));
    let (mut adam_session, mut adam_hand) = (Adam::default(), Adam::default());
    let losses = session_steps(&mut by_session, &mut adam_session, &batch, 3);
    let mut grads = vec![0.0; by_hand.parameters().len()];
    for (step, session_loss) in losses.iter().enumerate() {
        let ctx = ForwardContext::training(step as u64, 0);
        let forward = by_hand.forward(&batch.0, ctx).unwrap();
        let loss = LOSS.call(&forward.output, &batch.1).unwrap();
        by_hand
            .gradients(&forward, &loss.backward().unwrap(), &mut grads)
            .unwrap();
        adam_hand
            .apply(by_hand.parameters_mut().values_mut(), &grads)
            .unwrap();
        assert_eq!(loss.item().unwrap().to_bits(), session_loss.to_bits());
    }
    assert!(losses[2] < losses[0], "{losses:?}");
    assert_eq!(by_session.parameters(), by_hand.parameters());
    assert_eq!(adam_session.iterations(), 3);
    assert_eq!(adam_session.slots(), adam_hand.slots());
}

/// The model on the GPU when there is one, else on the CPU: what holds on every device.
/// The model `build` makes, on the CPU and then, where there is one, on the first GPU (the GPU's
/// part a skip that the log shows where there is none, a failure under `LOCKSTEP_REQUIRE_GPU=1`).
#[track_caller]
fn on_every_device(build: impl Fn() -> Sequential) -> Vec<Sequential> {
    std::iter::once(build()).chain(on_gpu(build())).collect()
}

#[test]
fn a_session_dropped_unfinished_still_writes_its_steps_back_on_every_device() {
    let batch = first_batch(16);
    for mut model in on_every_device(|| cnn(6)) {
        let before = model.parameters().clone();
        let mut adam = Adam::default();
        {
            let mut session = model.training(&mut adam).unwrap();
            session
                .step(&batch.0, ForwardContext::default(), |logits| {
                    LOSS.call(logits, &batch.1)
                })
                .unwrap();
        }
        assert_eq!(adam.iterations(), 1, "{}", model.device());
        assert_ne!(model.parameters(), &before, "{}", model.device());
        assert_eq!(model.parameters().len(), before.len());
    }
}

#[test]
fn a_session_predicts_with_its_latest_parameters_on_every_device() {
    let batch = first_batch(16);
    for mut model in on_every_device(|| cnn(7)) {
        let device = model.device();
        let mut sgd = lockstep_nn::Sgd::new(0.1);
        let mut session = model.training(&mut sgd).unwrap();
        let before = session.predict(&batch.0).unwrap().to_vec().unwrap();
        session
            .step(&batch.0, ForwardContext::default(), |logits| {
                LOSS.call(logits, &batch.1)
            })
            .unwrap();
        let during = session.predict(&batch.0).unwrap().to_vec().unwrap();
        session.finish().unwrap();
        let after = model.predict(&batch.0).unwrap().to_vec().unwrap();
        assert_ne!(before, during, "{device}");
        for (d, a) in during.iter().zip(&after) {
            assert!(
                (d - a).abs() <= 1e-5 * a.abs().max(1.0),
                "{device}: {d} vs {a}"
            );
        }
    }
}

#[test]
fn a_session_on_a_gpu_reads_back_nothing_but_the_loss_it_is_asked_for() {
    let Some(mut model) = on_gpu(cnn(8)) else {
        return;
    };
    let (x, labels) = first_batch(64);
    let mut adam = Adam::default();
    let mut session = model.training(&mut adam).unwrap();
    for step in 0..3 {
        let ctx = ForwardContext::training(step, 0);
        let before = lockstep_cuda::Transfers::on_this_thread();
        let loss = session
            .step(&x, ctx, |logits| LOSS.call(logits, &labels))
            .unwrap();
        let during = lockstep_cuda::Transfers::on_this_thread() - before;
        // In: the batch and its labels. Out: nothing.
        assert_eq!(
            during,
            lockstep_cuda::Transfers {
                to_device: 2,
                to_host: 0
            }
        );
        assert!(loss.item().unwrap().is_finite());
        let read = lockstep_cuda::Transfers::on_this_thread() - before;
        assert_eq!(read.to_host, 1);
    }
    session.finish().unwrap();
    assert_eq!(adam.iterations(), 3);
}

#[test]
fn a_session_on_a_gpu_follows_the_cpu_with_sgd_momentum_and_with_adam() {
    let Some(mut gpu) = on_gpu(cnn_off_the_kink(9)) else {
        return;
    };
    let mut cpu = cnn_off_the_kink(9);
    let batch = first_batch(64);
    let steps = 4;
    let nesterov = || lockstep_nn::Sgd::with_momentum(0.05, 0.9, true);
    let (mut on_cpu, mut on_gpu_) = (nesterov(), nesterov());
    let cpu_losses = session_steps(&mut cpu, &mut on_cpu, &batch, steps);
    let gpu_losses = session_steps(&mut gpu, &mut on_gpu_, &batch, steps);
    for (c, g) in cpu_losses.iter().zip(&gpu_losses) {
        assert!(
            (c - g).abs() <= 1e-3 * c.abs(),
            "losses {cpu_losses:?} vs {gpu_losses:?}"
        );
    }
    // Linear in the gradients: the parameters stay as close as the gradients are.
    let scale = cpu
        .parameters()
        .values()
        .iter()
        .fold(1e-3_f32, |m, v| m.max(v.abs()));
    let close = |a: &[f32], b: &[f32], tolerance: f32| {
        a.iter().zip(b).all(|(a, b)| (a - b).abs() <= tolerance)
    };
    assert!(close(
        cpu.parameters().values(),
        gpu.parameters().values(),
        1e-4 * scale
    ));
    assert!(close(
        on_cpu.slots()[0].1,
        on_gpu_.slots()[0].1,
        1e-4 * scale
    ));

    // Adam moves each value by about its learning rate whatever the gradient's size, so a
    // gradient near zero may move the two apart by up to twice that per step: most values
    // agree closely, every value within that bound.
    let (mut cpu, mut gpu) = (cnn_off_the_kink(9), on_gpu(cnn_off_the_kink(9)).unwrap());
    let (mut on_cpu, mut on_gpu_) = (Adam::default(), Adam::default());
    session_steps(&mut cpu, &mut on_cpu, &batch, steps);
    session_steps(&mut gpu, &mut on_gpu_, &batch, steps);
    assert_eq!(on_gpu_.iterations(), steps);
    let (a, b) = (cpu.parameters().values(), gpu.parameters().values());
    let bound = 2.0 * on_cpu.learning_rate() * steps as f32;
    assert!(close(a, b, bound));
    let apart = a
        .iter()
        .zip(b)
        .filter(|(a, b)| (*a - *b).abs() > 1e-5)
        .count();
    assert!(
        apart * 100 <= a.len(),
        "{apart} of {} values differ by more than 1e-5",
        a.len()
    );
    for ((name, c), (_, g)) in on_cpu.slots().iter().zip(on_gpu_.slots()) {
        assert_eq!(c.len(), g.len(), "slot {name}");
    }
}

/// NCCL's group of every GPU here, or `None` after a skip that the log shows without a GPU with
/// NCCL (a failure under `LOCKSTEP_REQUIRE_GPU=1`).
fn nccl_group() -> Option<Vec<lockstep_cuda::nccl::NcclComm>> {
    let devices = lockstep_cuda::device_count().and_then(|count| {
        (0..count)
            .map(lockstep_cuda::CudaDevice::open)
            .collect::<Result<Vec<_>, _>>()
    });
    let group = devices.and_then(|d| {
        lockstep_cuda::nccl::NcclComm::local_group(&d, std::time::Duration::from_mins(1))
    });
    available(
        Need::Gpu,
        group.map_err(|e| format!("no GPU with NCCL: {e}")),
    )
}

#[test]
fn a_session_all_reduced_by_nccl_over_one_gpu_trains_as_one_without() {
    let Some(mut comms) = nccl_group() else {
        return;
    };
    let comm = &mut comms[0];
    let Some(mut plain) = on_gpu(cnn_off_the_kink(5)) else {
        return;
    };
    let mut reduced = on_gpu(cnn_off_the_kink(5)).unwrap();
    let batch = first_batch(64);
    let plain_losses = session_steps(&mut plain, &mut Adam::default(), &batch, 3);
    let mut adam = Adam::default();
    let mut session = reduced.training(&mut adam).unwrap();
    let mut reduced_losses = Vec::new();
    for step in 0..3 {
        let ctx = ForwardContext::training(step, 0);
        let before = lockstep_cuda::Transfers::on_this_thread();
        let loss = session
            .step_all_reduced(&batch.0, ctx, |logits| LOSS.call(logits, &batch.1), comm)
            .unwrap();
        // In: the batch and its labels. Out: nothing, the all-reduce included.
        let during = lockstep_cuda::Transfers::on_this_thread() - before;
        assert_eq!(during.to_host, 0);
        reduced_losses.push(loss.item().unwrap());
    }
    session.finish().unwrap();
    if comm.world_size() == 1 {
        // A sum over one rank is the rank's own gradient: the same bits.
        assert_eq!(plain_losses, reduced_losses);
        assert_eq!(plain.parameters().values(), reduced.parameters().values());
    }
}

#[test]
fn replicas_on_every_gpu_all_reduced_by_nccl_stay_identical() {
    let Some(mut comms) = nccl_group() else {
        return;
    };
    if comms.len() < 2 {
        skip(Need::TwoGpus, format!("this machine has {}", comms.len()));
        return;
    }
    let batch = first_batch(64);
    // Each replica its own half of the batch, as a strategy shards it.
    let weights: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                let batch = &batch;
                scope.spawn(move || {
                    let ordinal = comm.device().ordinal();
                    let Ok(mut model) = cnn_off_the_kink(5).to_device(Device::Cuda(ordinal)) else {
                        panic!("moving the model to GPU {ordinal}");
                    };
                    let mut adam = Adam::default();
                    let mut session = model.training(&mut adam).unwrap();
                    for step in 0..3 {
                        let ctx = ForwardContext::training(step, comm.rank());
                        session
                            .step_all_reduced(
                                &batch.0,
                                ctx,
                                |logits| LOSS.call(logits, &batch.1),
                                comm,
                            )
                            .unwrap();
                    }
                    session.finish().unwrap();
                    model.parameters().values().to_vec()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for w in &weights {
        assert_eq!(w, &weights[0], "replicas diverged");
    }
}
