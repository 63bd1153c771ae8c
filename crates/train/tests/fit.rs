//! `fit` under each strategy: the same mathematics whatever the layout, bit-identical
//! repeats, exact resume from a backup, and clear errors.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::time::Duration;

mod common;

use common::{
    CrashAt, EXAMPLES, crash_and_resume, crash_and_resume_at, digits, loss, mlp, train, workers,
    workers_with,
};
use lockstep_cluster::{Cluster, TfConfig};
use lockstep_collective::{CommunicationOptions, Compression, Implementation};
use lockstep_data::{AutoShardPolicy, Dataset, DatasetOptions};
use lockstep_nn::{Adam, AdamW, LearningRateSchedule, Sgd, models};
use lockstep_train::{
    BackupAndRestore, Callback, History, MirroredStrategy, Model, MultiWorkerMirroredStrategy,
    OneDeviceStrategy, SaveFreq, Strategy, TrainError,
};
use ndarray::{Array1, Array2};

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn two_mirrored_replicas_train_as_one_device_with_the_same_global_batch() {
    let (one, one_history) = train(OneDeviceStrategy::new(), 64, 2, Vec::new()).unwrap();
    let (two, two_history) = train(MirroredStrategy::new(2).unwrap(), 64, 2, Vec::new()).unwrap();
    assert!(
        max_difference(&one, &two) < 1e-4,
        "{}",
        max_difference(&one, &two)
    );
    let (a, b) = (
        one_history.get("loss").unwrap(),
        two_history.get("loss").unwrap(),
    );
    assert!((a[1] - b[1]).abs() < 1e-3, "{a:?} vs {b:?}");
    assert!(a[1] < a[0], "the loss falls: {a:?}");
    assert_eq!(one_history.epochs, [0, 1]);
}

#[test]
fn a_short_last_batch_is_weighted_exactly_whichever_replicas_it_reaches() {
    // 640 examples in global batches of 96: six whole ones and 64 left, which reach the
    // first replica whole and the second in part (two replicas), or only the first worker
    // (two workers of 48).
    let (one, one_history) = train(OneDeviceStrategy::new(), 96, 2, Vec::new()).unwrap();
    let (two, two_history) = train(MirroredStrategy::new(2).unwrap(), 96, 2, Vec::new()).unwrap();
    assert!(
        max_difference(&one, &two) < 1e-4,
        "{}",
        max_difference(&one, &two)
    );
    let results = workers(2, 1, |strategy| train(strategy, 96, 2, Vec::new()).unwrap());
    assert_eq!(results[0].0, results[1].0);
    assert_eq!(results[0].1.history, results[1].1.history);
    // Each worker counts what it trained on: the 64 left over split 48 and 16, each epoch.
    let here = [results[0].1.local_examples, results[1].1.local_examples];
    assert_eq!(here[0] + here[1], results[0].1.examples, "{here:?}");
    assert_eq!(here[0].abs_diff(here[1]), 2 * 32, "{here:?}");
    assert!(max_difference(&one, &results[0].0) < 1e-4);
    let (a, b) = (
        one_history.get("accuracy").unwrap(),
        two_history.get("accuracy").unwrap(),
    );
    assert!(
        (a[1] - b[1]).abs() < 1e-9,
        "every example counted once: {a:?} vs {b:?}"
    );
}

#[test]
fn repeated_runs_give_bit_identical_weights() {
    let (a, _) = train(MirroredStrategy::new(2).unwrap(), 64, 1, Vec::new()).unwrap();
    let (b, _) = train(MirroredStrategy::new(2).unwrap(), 64, 1, Vec::new()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn compressed_gradients_train_near_the_uncompressed_run_and_repeat_bit_for_bit() {
    let (plain, plain_history) =
        train(MirroredStrategy::new(2).unwrap(), 64, 1, Vec::new()).unwrap();
    for compression in [Compression::Bf16, Compression::Fp16] {
        let options = CommunicationOptions {
            compression,
            ..CommunicationOptions::default()
        };
        let run = || {
            let strategy = MirroredStrategy::with_options(2, options).unwrap();
            train(strategy, 64, 1, Vec::new()).unwrap()
        };
        let ((once, history), (again, _)) = (run(), run());
        assert_eq!(once, again, "{compression:?} repeats bit for bit");
        // Rounded on the wire: near the uncompressed weights, not equal to them.
        let difference = max_difference(&once, &plain);
        assert!(
            difference > 0.0 && difference < 0.05,
            "{compression:?}: {difference}"
        );
        // The totals travel in f32: the examples are counted exactly, so the losses differ
        // only as the weights do.
        let (loss, plain_loss) = (
            history.get("loss").unwrap(),
            plain_history.get("loss").unwrap(),
        );
        assert!(
            (loss[0] - plain_loss[0]).abs() < 0.05,
            "{loss:?} vs {plain_loss:?}"
        );
    }
}

#[test]
fn error_feedback_carries_the_rounding_into_later_steps_alike_with_or_without_packs() {
    let (plain, _) = train(MirroredStrategy::new(2).unwrap(), 64, 1, Vec::new()).unwrap();
    let run = |error_feedback: bool, bytes_per_pack: usize| {
        let options = CommunicationOptions {
            compression: Compression::Bf16,
            error_feedback,
            bytes_per_pack,
            ..CommunicationOptions::default()
        };
        let strategy = MirroredStrategy::with_options(2, options).unwrap();
        train(strategy, 64, 1, Vec::new()).unwrap().0
    };
    let whole = CommunicationOptions::default().bytes_per_pack;
    let (without, with) = (run(false, whole), run(true, whole));
    assert_ne!(with, without, "the residuals change what is sent");
    assert_eq!(with, run(true, whole), "repeats bit for bit");
    // Packs reduced during the backward pass keep each value's residual as one pack after it.
    assert_eq!(with, run(true, 4 * 1024), "packed during the pass");
    // What was dropped is sent later: the weights end nearer the uncompressed run's.
    let distance = |a: &[f32]| -> f32 {
        a.iter()
            .zip(&plain)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f32>()
            .sqrt()
    };
    let (off, on) = (distance(&without), distance(&with));
    assert!(
        on < off,
        "nearer the uncompressed weights: {on} against {off}"
    );
}

/// Packs of 4 KiB: the MLP's gradients go as two collectives (its last layer's, started
/// while the backward pass goes on with the first layer, then the first layer's).
fn small_packs() -> CommunicationOptions {
    CommunicationOptions {
        bytes_per_pack: 4 * 1024,
        ..CommunicationOptions::default()
    }
}

#[test]
fn gradients_reduced_in_packs_during_the_backward_pass_train_to_the_same_bits() {
    // Two workers over TCP (a sum of two values does not depend on its order) and three
    // replicas in shared memory (which sum each value in rank order): the packs change only
    // when each value is reduced, not what it is reduced to.
    let packed = workers_with(2, 1, small_packs(), |strategy| {
        train(strategy, 64, 1, Vec::new()).unwrap()
    });
    let whole = workers(2, 1, |strategy| train(strategy, 64, 1, Vec::new()).unwrap());
    assert_eq!(packed[0].0, packed[1].0);
    assert_eq!(packed[0].0, whole[0].0, "over TCP");
    assert_eq!(packed[0].1.history, whole[0].1.history);
    let mirrored = |options| {
        let strategy = MirroredStrategy::with_options(3, options).unwrap();
        train(strategy, 60, 1, Vec::new()).unwrap().0
    };
    assert_eq!(
        mirrored(small_packs()),
        mirrored(CommunicationOptions::default()),
        "in shared memory"
    );
}

/// Packs of 4 KiB with each step's update left in flight into the next forward pass.
fn overlapped_update() -> CommunicationOptions {
    CommunicationOptions {
        overlap_update: true,
        ..small_packs()
    }
}

#[test]
fn an_update_left_in_flight_into_the_next_forward_pass_trains_to_the_same_bits() {
    // Two epochs: the update in flight lands at each epoch's end and when `fit` returns.
    let overlapped = workers_with(2, 1, overlapped_update(), |strategy| {
        train(strategy, 64, 2, Vec::new()).unwrap()
    });
    let whole = workers(2, 1, |strategy| train(strategy, 64, 2, Vec::new()).unwrap());
    assert_eq!(overlapped[0].0, overlapped[1].0);
    assert_eq!(overlapped[0].0, whole[0].0, "over TCP");
    assert_eq!(overlapped[0].1.history, whole[0].1.history);
    // On one kernel thread the backward pass hands the first layer's kernel (784 × 256, four
    // blocks of rows) over block by block, and its pieces go as soon as their blocks are in.
    let one_thread = workers_with(2, 1, overlapped_update(), |strategy| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| train(strategy, 64, 2, Vec::new()).unwrap())
    });
    assert_eq!(one_thread[0].0, whole[0].0, "on one thread");
    // Three replicas in shared memory, global batches of 96: the last step's 64 examples leave
    // the third replica without data, which lands the update and applies the next whole.
    let mirrored = |options| {
        let strategy = MirroredStrategy::with_options(3, options).unwrap();
        train(strategy, 96, 2, Vec::new()).unwrap().0
    };
    assert_eq!(
        mirrored(overlapped_update()),
        mirrored(CommunicationOptions::default()),
        "in shared memory"
    );
}

#[test]
fn an_update_left_in_flight_among_three_processes_trains_to_the_bits_of_the_same_packs_after_it() {
    // Among three processes a ring sums each value in an order that depends on where its
    // collective cuts the buffer: the packs go whole there, as in the step without overlap.
    let run = |options| {
        workers_with(3, 1, options, |strategy| {
            train(strategy, 96, 2, Vec::new()).unwrap()
        })
    };
    let (overlapped, packed) = (run(overlapped_update()), run(small_packs()));
    assert_eq!(overlapped[0].0, overlapped[2].0);
    assert_eq!(overlapped[0].0, packed[0].0);
    assert_eq!(overlapped[0].1.history, packed[0].1.history);
}

/// Sets a new learning rate after every batch, as a user's schedule in a callback may.
struct RateEveryBatch;

impl Callback for RateEveryBatch {
    fn on_train_batch_end(
        &mut self,
        batch: u64,
        _logs: &lockstep_train::Logs,
        ctx: &mut lockstep_train::TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        ctx.set_learning_rate(1e-3 / (batch + 1) as f32);
        Ok(())
    }
}

#[test]
fn an_update_in_flight_lands_with_the_rate_it_was_computed_under() {
    let run = |options| {
        let strategy = MirroredStrategy::with_options(2, options).unwrap();
        train(strategy, 64, 1, vec![Box::new(RateEveryBatch)])
            .unwrap()
            .0
    };
    assert_eq!(
        run(overlapped_update()),
        run(CommunicationOptions::default())
    );
}

#[test]
fn an_update_in_flight_keeps_error_feedback_and_resumes_bit_identical() {
    let feedback = |overlap_update| CommunicationOptions {
        compression: Compression::Bf16,
        error_feedback: true,
        overlap_update,
        ..small_packs()
    };
    let strategy = |options| MirroredStrategy::with_options(2, options).unwrap();
    let (uninterrupted, _) = train(strategy(feedback(true)), 64, 3, Vec::new()).unwrap();
    let (packed, _) = train(strategy(feedback(false)), 64, 3, Vec::new()).unwrap();
    assert_eq!(uninterrupted, packed, "each value's residual as without it");
    let dir = tempfile::tempdir().unwrap();
    let backup = || BackupAndRestore::new(dir.path().join("backup")).save_freq(SaveFreq::Steps(4));
    let err = train(
        strategy(feedback(true)),
        64,
        3,
        vec![Box::new(backup()), Box::new(CrashAt(17))],
    )
    .unwrap_err();
    assert!(err.to_string().contains("crashed on purpose"));
    let (resumed, _) = train(strategy(feedback(true)), 64, 3, vec![Box::new(backup())]).unwrap();
    assert_eq!(resumed, uninterrupted);
}

#[test]
fn two_workers_over_tcp_train_as_one_device_with_the_same_global_batch() {
    let results = workers(2, 1, |strategy| train(strategy, 64, 2, Vec::new()).unwrap());
    let (one, _) = train(OneDeviceStrategy::new(), 64, 2, Vec::new()).unwrap();
    assert_eq!(
        results[0].0, results[1].0,
        "the workers' weights are bit-identical"
    );
    assert_eq!(
        results[0].1.history, results[1].1.history,
        "both log the same figures"
    );
    assert!(max_difference(&one, &results[0].0) < 1e-4);
}

#[test]
fn two_workers_with_two_replicas_each_train_as_four_mirrored_replicas() {
    let results = workers(2, 2, |strategy| {
        train(strategy, 64, 1, Vec::new()).unwrap().0
    });
    let (four, _) = train(MirroredStrategy::new(4).unwrap(), 64, 1, Vec::new()).unwrap();
    assert_eq!(results[0], results[1]);
    assert!(max_difference(&four, &results[0]) < 1e-4);
}

#[test]
fn a_run_resumed_from_its_backup_ends_bit_identical_to_an_uninterrupted_one() {
    let (uninterrupted, history) =
        train(MirroredStrategy::new(2).unwrap(), 64, 3, Vec::new()).unwrap();
    for freq in [SaveFreq::Steps(4), SaveFreq::Epoch] {
        let dir = tempfile::tempdir().unwrap();
        let backup = || BackupAndRestore::new(dir.path().join("backup")).save_freq(freq);
        // Step 17: mid-epoch (10 steps per epoch), after the backup of step 16 or epoch 1.
        let err = train(
            MirroredStrategy::new(2).unwrap(),
            64,
            3,
            vec![Box::new(backup()), Box::new(CrashAt(17))],
        )
        .unwrap_err();
        assert!(err.to_string().contains("crashed on purpose"));
        assert!(
            dir.path().join("backup").exists(),
            "the backup survives a failed run"
        );
        let (resumed, resumed_history) = train(
            MirroredStrategy::new(2).unwrap(),
            64,
            3,
            vec![Box::new(backup())],
        )
        .unwrap();
        assert_eq!(resumed, uninterrupted, "{freq:?}");
        let last = |h: &History| h.get("loss").unwrap().last().copied();
        assert_eq!(last(&resumed_history), last(&history), "{freq:?}");
        assert!(
            !dir.path().join("backup").exists(),
            "deleted after a successful run"
        );
    }
}

#[test]
fn a_run_with_error_feedback_resumed_from_its_backup_ends_bit_identical() {
    let options = CommunicationOptions {
        compression: Compression::Bf16,
        error_feedback: true,
        ..CommunicationOptions::default()
    };
    let strategy = || MirroredStrategy::with_options(2, options).unwrap();
    let (uninterrupted, _) = train(strategy(), 64, 3, Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The backup of step 16 holds both replicas' residuals; step 17 crashes.
    let (resumed, _) = crash_and_resume(strategy, dir.path());
    assert_eq!(resumed, uninterrupted);
    // The backup of step 20, the second epoch's last (10 steps an epoch): the resumed run
    // ends that epoch without a step, as the uninterrupted one did, and keeps the residuals.
    let last_of_epoch = tempfile::tempdir().unwrap();
    let (resumed, _) = crash_and_resume_at(strategy, last_of_epoch.path(), 5, 21);
    assert_eq!(resumed, uninterrupted);

    // Two workers over TCP: the chief's backup gathers the other worker's residuals too.
    let path = dir.path().join("workers");
    let run = move |crash: bool| {
        let path = path.clone();
        workers_with(2, 1, options, move |strategy| {
            let backup = BackupAndRestore::new(path.clone()).save_freq(SaveFreq::Steps(4));
            let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(backup)];
            if crash {
                callbacks.push(Box::new(CrashAt(17)));
            }
            train(strategy, 64, 3, callbacks).map(|(weights, _)| weights)
        })
    };
    let uninterrupted = workers_with(2, 1, options, |strategy| {
        train(strategy, 64, 3, Vec::new()).unwrap().0
    });
    assert!(run(true).iter().all(Result::is_err));
    let resumed = run(false);
    assert_eq!(resumed[0].as_ref().unwrap(), &uninterrupted[0]);
    assert_eq!(resumed[1].as_ref().unwrap(), &uninterrupted[1]);
}

#[test]
fn a_backup_of_another_model_is_refused_naming_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let backup = || BackupAndRestore::new(dir.path()).delete_checkpoint(false);
    train(OneDeviceStrategy::new(), 64, 1, vec![Box::new(backup())]).unwrap();
    let mut other = Model::new(OneDeviceStrategy::new(), || models::mnist_cnn(3)).unwrap();
    other.compile(Adam::default(), loss(), &[]).unwrap();
    let data = other.distribute_dataset(digits(), 64).unwrap();
    let err = other
        .fit(&data)
        .verbose(false)
        .callback(backup())
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    let mut sgd = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    sgd.compile(Sgd::new(0.1), loss(), &[]).unwrap();
    let err = sgd
        .fit(&data_for(&sgd))
        .verbose(false)
        .callback(backup())
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("optimizer"), "{err}");
}

fn data_for(model: &Model) -> impl Dataset<Item = Vec<(Array2<f32>, Array1<u8>)>> {
    model.distribute_dataset(digits(), 64).unwrap()
}

#[test]
fn bad_settings_are_clear_errors() {
    assert!(MirroredStrategy::new(0).is_err());
    let mut model = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    let err = model.compile(Adam::default(), loss(), &["f1"]).unwrap_err();
    assert!(err.to_string().contains("unknown metric"), "{err}");
    let data = data_for(&model);
    let err = model.fit(&data).run().unwrap_err();
    assert!(err.to_string().contains("compile"), "{err}");
    let err = model.distribute_dataset(digits(), 0).err().unwrap();
    assert!(err.to_string().contains("batch"), "{err}");

    let json = r#"{"cluster": {"worker": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]}, "task": {"type": "evaluator", "index": 0}}"#;
    let evaluator = Cluster::new(TfConfig::parse(json).unwrap()).unwrap();
    let err = MultiWorkerMirroredStrategy::new(
        &evaluator,
        CommunicationOptions::default(),
        1,
        Duration::from_secs(1),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("trains nothing"), "{err}");
    let nccl = CommunicationOptions {
        implementation: Implementation::Nccl,
        ..CommunicationOptions::default()
    };
    let worker = Cluster::new(
        TfConfig::parse(&json.replace("evaluator\", \"index", "worker\", \"index")).unwrap(),
    )
    .unwrap();
    // NCCL is for replicas placed on GPUs: left on the CPU, the model is refused.
    let strategy =
        MultiWorkerMirroredStrategy::new(&worker, nccl, 1, Duration::from_secs(1)).unwrap();
    let err = Model::new(strategy, mlp).err().unwrap();
    assert!(
        err.to_string().contains("NCCL") && err.to_string().contains("on_devices"),
        "{err}"
    );
}

#[test]
fn evaluation_counts_every_example_once_on_every_layout() {
    let mut one = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    one.compile(Adam::default(), loss(), &["accuracy"]).unwrap();
    let data = one.distribute_dataset(digits(), 64).unwrap();
    let a = one.evaluate(&data).unwrap();
    let mut two = Model::new(MirroredStrategy::new(2).unwrap(), mlp).unwrap();
    two.compile(Adam::default(), loss(), &["accuracy"]).unwrap();
    let data = two.distribute_dataset(digits(), 64).unwrap();
    let b = two.evaluate(&data).unwrap();
    assert!((a.get("loss").unwrap() - b.get("loss").unwrap()).abs() < 1e-5);
    assert_eq!(a.get("accuracy"), b.get("accuracy"));
    let accuracy = a.get("accuracy").unwrap();
    assert!((0.0..=1.0).contains(&accuracy));
    assert_eq!(
        (accuracy * EXAMPLES as f64).fract(),
        0.0,
        "whole examples counted"
    );
}

#[test]
fn workers_whose_models_differ_only_in_shapes_fail_together_when_the_model_is_made() {
    // 4 × 6 + 6 and 5 × 5 + 5: the same number of values under the same names, so a
    // broadcast of the weights alone would not notice.
    let errors = workers(2, 1, |strategy| {
        let first = strategy.input_context().input_pipeline_id == 0;
        let (inputs, units) = if first { (4, 6) } else { (5, 5) };
        Model::new(strategy, move || {
            lockstep_nn::Sequential::new(
                &[inputs],
                vec![Box::new(lockstep_nn::Dense::new(units))],
                0,
            )
        })
        .err()
        .map(|e| e.to_string())
    });
    for error in errors {
        let error = error.unwrap();
        assert!(
            error.contains("the workers built different models"),
            "{error}"
        );
    }
}

#[test]
fn a_run_with_a_per_step_schedule_and_clipping_resumes_bit_identical() {
    let schedule = LearningRateSchedule::CosineDecay {
        initial_learning_rate: 1e-4,
        decay_steps: 25,
        alpha: 0.1,
        warmup_target: Some(2e-3),
        warmup_steps: 5,
    };
    let run = |callbacks: Vec<Box<dyn Callback>>| -> Result<(Vec<f32>, History), TrainError> {
        let mut model = Model::new(MirroredStrategy::new(2).unwrap(), mlp)?;
        let optimizer = AdamW::default()
            .with_schedule(schedule.clone())
            .global_clipnorm(1.0);
        model.compile(
            optimizer,
            loss(),
            &["accuracy", "sparse_categorical_accuracy"],
        )?;
        let data = model.distribute_dataset(digits(), 64)?;
        let mut fit = model.fit(&data).epochs(3).verbose(false);
        for callback in callbacks {
            fit = fit.callback(callback);
        }
        let history = fit.run()?;
        Ok((model.network().parameters().values().to_vec(), history))
    };
    let (uninterrupted, history) = run(Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backup = || BackupAndRestore::new(dir.path().join("backup")).save_freq(SaveFreq::Steps(4));
    let err = run(vec![Box::new(backup()), Box::new(CrashAt(13))]).unwrap_err();
    assert!(err.to_string().contains("crashed on purpose"));
    let (resumed, resumed_history) = run(vec![Box::new(backup())]).unwrap();
    assert_eq!(resumed, uninterrupted);
    // The interrupted epoch's metrics resume from the backup's states too.
    assert_eq!(resumed_history.epochs, [1, 2]);
    for name in ["loss", "accuracy", "sparse_categorical_accuracy"] {
        let (all, tail) = (
            history.get(name).unwrap(),
            resumed_history.get(name).unwrap(),
        );
        assert_eq!(tail, &all[1..], "{name}");
    }
}

#[test]
fn steps_per_epoch_continue_one_pass_over_the_data_across_epochs_as_keras_does() {
    // 640 examples in global batches of 64: ten steps in one pass.
    let run = |epochs: u64, steps: u64| {
        let mut model = Model::new(MirroredStrategy::new(2).unwrap(), mlp).unwrap();
        model
            .compile(Adam::default(), loss(), &["accuracy"])
            .unwrap();
        let data = model.distribute_dataset(digits(), 64).unwrap();
        let history = model
            .fit(&data)
            .epochs(epochs)
            .steps_per_epoch(steps)
            .verbose(false)
            .run()
            .unwrap();
        (model.network().parameters().values().to_vec(), history)
    };
    // Two epochs of four steps read the first eight steps of the pass: one epoch of eight.
    let (two_of_four, history) = run(2, 4);
    let (one_of_eight, _) = run(1, 8);
    assert_eq!(two_of_four, one_of_eight);
    assert_eq!(history.steps, 8);
    // Four epochs of four ask for sixteen steps of ten: the third epoch gets two, then the
    // input has run out and training stops.
    let (_, history) = run(4, 4);
    assert_eq!(history.epochs, [0, 1, 2]);
    assert_eq!(history.steps, 10);
}

#[test]
fn a_run_with_steps_per_epoch_resumes_where_the_one_iterator_stood() {
    let run = |callbacks: Vec<Box<dyn Callback>>| -> Result<Vec<f32>, TrainError> {
        let mut model = Model::new(MirroredStrategy::new(2).unwrap(), mlp)?;
        model.compile(Adam::default(), loss(), &["accuracy"])?;
        let data = model.distribute_dataset(digits(), 64)?;
        let mut fit = model.fit(&data).epochs(2).steps_per_epoch(4).verbose(false);
        for callback in callbacks {
            fit = fit.callback(callback);
        }
        fit.run()?;
        Ok(model.network().parameters().values().to_vec())
    };
    let uninterrupted = run(Vec::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backup = || BackupAndRestore::new(dir.path().join("backup")).save_freq(SaveFreq::Steps(3));
    // Step 7: in the second epoch, after the backup of step 6.
    assert!(run(vec![Box::new(backup()), Box::new(CrashAt(7))]).is_err());
    assert_eq!(run(vec![Box::new(backup())]).unwrap(), uninterrupted);
}

#[test]
fn an_auto_shard_policy_set_with_options_reaches_the_distributed_dataset() {
    // Off: every worker reads every example (each counted once per worker); the default
    // divides them.
    let examples = |policy: Option<AutoShardPolicy>| {
        let results = match policy {
            None => workers(2, 1, |strategy| {
                let mut model = Model::new(strategy, mlp).unwrap();
                model
                    .compile(Adam::default(), loss(), &["accuracy"])
                    .unwrap();
                let data = model.distribute_dataset(digits(), 64).unwrap();
                model.fit(&data).verbose(false).run().unwrap().examples
            }),
            Some(_) => workers(2, 1, |strategy| {
                let mut model = Model::new(strategy, mlp).unwrap();
                model
                    .compile(Adam::default(), loss(), &["accuracy"])
                    .unwrap();
                let off = DatasetOptions::auto_shard_policy(AutoShardPolicy::Off);
                let data = model
                    .distribute_dataset(digits().with_options(off), 64)
                    .unwrap();
                model.fit(&data).verbose(false).run().unwrap().examples
            }),
        };
        results[0]
    };
    assert_eq!(examples(None), EXAMPLES as u64);
    assert_eq!(examples(Some(AutoShardPolicy::Off)), 2 * EXAMPLES as u64);
}
