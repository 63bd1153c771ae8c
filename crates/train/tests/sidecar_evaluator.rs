//! The `SidecarEvaluator`: evaluating each weights checkpoint that `fit` writes, beside it.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{compiled, digits, event_steps, loss, mlp};
use lockstep_checkpoint::write_tensors;
use lockstep_nn::Adam;
use lockstep_train::{Model, ModelCheckpoint, OneDeviceStrategy, SidecarEvaluator};

/// An evaluator's model: one replica, other initial weights than the trained one's.
fn evaluator_model() -> Model {
    let mut model = Model::new(OneDeviceStrategy::new(), || {
        lockstep_nn::models::mnist_mlp(99)
    })
    .unwrap();
    model
        .compile(Adam::default(), loss(), &["accuracy"])
        .unwrap();
    model
}

fn event_files(dir: &Path) -> Vec<Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect()
}

#[test]
fn the_sidecar_evaluates_each_checkpoint_once_while_fit_writes_them_and_ends_at_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let logs = dir.path().join("logs");
    let mut trained = compiled(2);
    let mut evaluator = evaluator_model();
    let train = trained.distribute_dataset(digits(), 64).unwrap();
    let test = evaluator.distribute_dataset(digits(), 64).unwrap();

    let evaluations = std::thread::scope(|scope| {
        let fit = scope.spawn(|| {
            trained
                .fit(&train)
                .epochs(3)
                .verbose(false)
                .callback(
                    ModelCheckpoint::new(checkpoints.join("ckpt-{epoch}").to_str().unwrap())
                        .save_weights_only(true),
                )
                .run()
                .unwrap();
        });
        let evaluations = SidecarEvaluator::new(&mut evaluator, &test, &checkpoints)
            .max_evaluations(3)
            .log_dir(&logs)
            .poll_interval(Duration::from_millis(5))
            .timeout(Duration::from_mins(1))
            .start()
            .unwrap();
        fit.join().unwrap();
        evaluations
    });

    // Each at most once, in order; the last is the last epoch's, at the last step.
    let numbers: Vec<u64> = evaluations.iter().map(|e| e.number).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    let last = evaluations.last().unwrap();
    assert_eq!(last.number, 3);
    assert_eq!(last.iterations, 3 * 10); // 640 digits in batches of 64, 3 epochs
    assert_eq!(last.checkpoint, checkpoints.join("ckpt-3"));

    // Its figures are an evaluate of the final checkpoint's weights.
    let mut fresh = evaluator_model();
    fresh.load_weights(checkpoints.join("ckpt-3")).unwrap();
    let data = fresh.distribute_dataset(digits(), 64).unwrap();
    assert_eq!(fresh.evaluate(&data).unwrap(), last.logs);

    // One event file, with a scalar per metric per evaluation under Keras' tags, each at the
    // training step of the checkpoint evaluated.
    let iterations: Vec<u64> = evaluations.iter().map(|e| e.iterations).collect();
    assert_eq!(event_steps(&logs.join("validation")), iterations);
    let files = event_files(&logs.join("validation"));
    assert_eq!(files.len(), 1);
    let text = String::from_utf8_lossy(&files[0]);
    assert_eq!(
        text.matches("evaluation_loss_vs_iterations").count(),
        evaluations.len()
    );
    assert_eq!(
        text.matches("evaluation_accuracy_vs_iterations").count(),
        evaluations.len()
    );
}

#[test]
fn hidden_and_damaged_files_are_never_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let trained = compiled(1);
    trained.save_weights(dir.path().join("ckpt-1")).unwrap();
    // A writer's temporary file and a file that is not a checkpoint, both of higher number.
    std::fs::write(dir.path().join(".ckpt-5.tmp-77"), b"half").unwrap();
    std::fs::write(dir.path().join("notes-9.txt"), b"not safetensors").unwrap();
    write_tensors(&dir.path().join("README"), &[]).unwrap();

    let mut evaluator = evaluator_model();
    let test = evaluator.distribute_dataset(digits(), 64).unwrap();
    let evaluations = SidecarEvaluator::new(&mut evaluator, &test, dir.path())
        .poll_interval(Duration::from_millis(5))
        .timeout(Duration::from_millis(100))
        .start()
        .unwrap();
    let numbers: Vec<u64> = evaluations.iter().map(|e| e.number).collect();
    assert_eq!(
        numbers,
        [1],
        "notes-9.txt is damaged, so skipped; the rest are no checkpoints"
    );
}

#[test]
fn a_chief_that_stops_writing_is_an_error_naming_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    compiled(1).save_weights(dir.path().join("ckpt-1")).unwrap();
    let mut evaluator = evaluator_model();
    let test = evaluator.distribute_dataset(digits(), 64).unwrap();
    let err = SidecarEvaluator::new(&mut evaluator, &test, dir.path())
        .max_evaluations(3)
        .poll_interval(Duration::from_millis(5))
        .timeout(Duration::from_millis(50))
        .start()
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("no new checkpoint"), "{message}");
    assert!(
        message.contains("the last one evaluated was 1"),
        "{message}"
    );
}

#[test]
fn another_models_weights_or_an_uncompiled_model_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cnn = Model::new(OneDeviceStrategy::new(), || {
        lockstep_nn::models::mnist_cnn(1)
    })
    .unwrap();
    cnn.compile(Adam::default(), loss(), &["accuracy"]).unwrap();
    cnn.save_weights(dir.path().join("ckpt-1")).unwrap();
    let mut evaluator = evaluator_model();
    let test = evaluator.distribute_dataset(digits(), 64).unwrap();
    let err = SidecarEvaluator::new(&mut evaluator, &test, dir.path())
        .max_evaluations(1)
        .start()
        .unwrap_err();
    assert!(
        err.to_string().contains("conv2d") || err.to_string().contains("dense"),
        "{err}"
    );

    let mut uncompiled = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    let err = SidecarEvaluator::new(&mut uncompiled, &test, dir.path())
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("compile"), "{err}");
}
