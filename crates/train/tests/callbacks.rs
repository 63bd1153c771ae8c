//! The Keras callbacks: files they write, when they stop training, and their errors.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

mod common;

use std::sync::{Arc, Mutex};

use common::{compiled, digits, mlp};
use lockstep_train::{
    Callback, CsvLogger, EarlyStopping, LearningRateScheduler, Logs, MirroredStrategy, Mode, Model,
    ModelCheckpoint, OneDeviceStrategy, SaveFreq, Straggler, TensorBoard, TrainError,
    TrainingContext,
};

#[test]
fn model_checkpoint_writes_the_weights_each_epoch_under_the_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("w.{epoch:02d}.safetensors");
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model
        .fit(&data)
        .epochs(2)
        .verbose(false)
        .callback(ModelCheckpoint::new(pattern.to_str().unwrap()))
        .run()
        .unwrap();
    assert!(dir.path().join("w.01.safetensors").exists());
    let last = dir.path().join("w.02.safetensors");
    let mut restored = Model::new(OneDeviceStrategy::new(), mlp).unwrap();
    assert_ne!(
        restored.network().parameters(),
        model.network().parameters()
    );
    restored.load_weights(&last).unwrap();
    assert_eq!(
        restored.network().parameters(),
        model.network().parameters()
    );

    let mut other = Model::new(OneDeviceStrategy::new(), || {
        lockstep_nn::models::mnist_cnn(1)
    })
    .unwrap();
    let err = other.load_weights(&last).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}

/// Files `ModelCheckpoint` writes every 5 steps of one epoch (10 steps) with `save_best_only`.
fn best_only(mode: Mode) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("best-{epoch}-{batch}.safetensors");
    let mut model = compiled(1);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model
        .fit(&data)
        .epochs(1)
        .verbose(false)
        .callback(
            ModelCheckpoint::new(pattern.to_str().unwrap())
                .save_freq(SaveFreq::Steps(5))
                .save_best_only("loss", mode),
        )
        .run()
        .unwrap();
    let mut saved: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    saved.sort();
    saved
}

#[test]
fn save_best_only_saves_when_the_monitored_value_improves_only() {
    // The epoch's running loss falls from step 5 to step 10: minimising, both improve;
    // maximising, only the first (which improves on nothing).
    assert_eq!(
        best_only(Mode::Min),
        ["best-1-10.safetensors", "best-1-5.safetensors"]
    );
    assert_eq!(best_only(Mode::Max), ["best-1-5.safetensors"]);
}

#[test]
fn a_checkpoint_path_that_cannot_be_written_stops_training_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // A directory is made when missing, but not inside a file.
    std::fs::write(dir.path().join("a-file"), b"").unwrap();
    let pattern = dir.path().join("a-file/w.safetensors");
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let err = model
        .fit(&data)
        .epochs(2)
        .verbose(false)
        .callback(ModelCheckpoint::new(pattern.to_str().unwrap()))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("a-file"), "{err}");
    let err = model
        .fit(&data)
        .verbose(false)
        .callback(ModelCheckpoint::new("w{epoch"))
        .run()
        .unwrap_err();
    assert!(matches!(err, TrainError::Invalid { .. }), "{err}");
}

#[test]
fn early_stopping_ends_training_after_its_patience_runs_out() {
    let mut model = compiled(1);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    // No epoch improves the loss by 10: the first sets the mark, the next two wait.
    let history = model
        .fit(&data)
        .epochs(10)
        .verbose(false)
        .callback(EarlyStopping::new("loss", 2).min_delta(10.0))
        .run()
        .unwrap();
    assert_eq!(history.epochs, [0, 1, 2]);
}

#[test]
fn csv_logger_writes_a_header_and_a_row_per_epoch_with_validation_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let validation = model.distribute_dataset(digits(), 128).unwrap();
    let history = model
        .fit(&data)
        .epochs(2)
        .verbose(false)
        .validation_data(&validation)
        .callback(CsvLogger::new(&path))
        .run()
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "epoch,accuracy,loss,val_accuracy,val_loss");
    assert_eq!(lines.len(), 3);
    let row: Vec<f64> = lines[2].split(',').map(|v| v.parse().unwrap()).collect();
    assert_eq!(row[0], 1.0);
    assert_eq!(row[2], history.get("loss").unwrap()[1]);
    assert_eq!(row[4], history.get("val_loss").unwrap()[1]);

    let err = model
        .fit(&data)
        .verbose(false)
        .callback(CsvLogger::new(dir.path().join("missing/log.csv")))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn tensorboard_writes_an_event_file_for_training_and_one_for_validation() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = compiled(1);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let validation = model.distribute_dataset(digits(), 128).unwrap();
    model
        .fit(&data)
        .epochs(2)
        .verbose(false)
        .validation_data(&validation)
        .callback(TensorBoard::new(dir.path()).update_freq(5))
        .run()
        .unwrap();
    for sub in ["train", "validation"] {
        let files: Vec<_> = std::fs::read_dir(dir.path().join(sub)).unwrap().collect();
        assert_eq!(files.len(), 1, "{sub}");
        let file = files[0].as_ref().unwrap();
        assert!(
            file.file_name()
                .to_str()
                .unwrap()
                .starts_with("events.out.tfevents.")
        );
        // The version event, then one event per epoch (and per 5 steps in train).
        assert!(file.metadata().unwrap().len() > 100, "{sub}");
    }
    let err = model
        .fit(&data)
        .verbose(false)
        .callback(TensorBoard::new(dir.path()).update_freq(0))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("update_freq"), "{err}");
}

#[test]
fn tensorboard_writes_each_epochs_straggler_report_beside_its_scalars() {
    /// What the chief's context says after each epoch.
    struct Reports(Arc<Mutex<Vec<Option<Straggler>>>>);
    impl Callback for Reports {
        fn on_epoch_end(
            &mut self,
            _epoch: u64,
            _logs: &Logs,
            ctx: &mut TrainingContext<'_>,
        ) -> Result<(), TrainError> {
            self.0.lock().unwrap().push(ctx.straggler().cloned());
            Ok(())
        }
    }
    let tags = |model: &mut Model, dir: &std::path::Path| {
        let data = model.distribute_dataset(digits(), 64).unwrap();
        let reports = Arc::new(Mutex::new(Vec::new()));
        model
            .fit(&data)
            .epochs(2)
            .verbose(false)
            .callback(Reports(Arc::clone(&reports)))
            .callback(TensorBoard::new(dir))
            .run()
            .unwrap();
        let file = std::fs::read_dir(dir.join("train"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let bytes = String::from_utf8_lossy(&std::fs::read(file).unwrap()).into_owned();
        let reports = reports.lock().unwrap().clone();
        (bytes, reports)
    };
    let two = tempfile::tempdir().unwrap();
    let (events, reports) = tags(&mut compiled(2), two.path());
    for tag in [
        "straggler/replica",
        "straggler/wait_ms_per_step",
        "straggler/share_of_step",
    ] {
        assert_eq!(events.matches(tag).count(), 2, "{tag}: one per epoch");
    }
    assert_eq!(reports.len(), 2);
    for report in reports {
        let report = report.expect("two replicas: a report each epoch");
        assert!(report.replica < 2, "{report:?}");
        assert!((0.0..=1.0).contains(&report.share), "{report:?}");
    }
    // One replica waits for nobody: no report, no scalars.
    let one = tempfile::tempdir().unwrap();
    let (events, reports) = tags(&mut compiled(1), one.path());
    assert!(!events.contains("straggler/"));
    assert_eq!(reports, [None, None]);
}

#[test]
fn a_learning_rate_schedule_reaches_every_replica_each_epoch() {
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let mut seen = Vec::new();
    model
        .fit(&data)
        .epochs(3)
        .verbose(false)
        .callback(LearningRateScheduler::new(|epoch, rate| {
            seen.push(rate);
            if epoch == 0 { rate } else { rate * 0.5 }
        }))
        .run()
        .unwrap();
    assert_eq!(seen, [1e-3, 1e-3, 5e-4]);
    assert_eq!(model.optimizer().unwrap().learning_rate(), 2.5e-4);
    let err = model
        .fit(&data)
        .verbose(false)
        .callback(LearningRateScheduler::new(|_, _| f32::NAN))
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("NaN"), "{err}");
}

#[test]
fn model_checkpoint_saves_whole_models_by_default_and_load_takes_the_newest() {
    // The Keras guide: ModelCheckpoint(filepath=checkpoint_dir + "/ckpt-{epoch}"), then
    // make_or_restore_model() loads the newest of them.
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("ckpt-{epoch}");
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64).unwrap();
    model
        .fit(&data)
        .epochs(11)
        .verbose(false)
        .callback(ModelCheckpoint::new(pattern.to_str().unwrap()))
        .run()
        .unwrap();
    for epoch in [1, 2, 10, 11] {
        assert!(
            dir.path().join(format!("ckpt-{epoch}")).is_dir(),
            "ckpt-{epoch}"
        );
    }
    let loaded = Model::load(MirroredStrategy::new(1).unwrap(), dir.path()).unwrap();
    assert_eq!(loaded.network().parameters(), model.network().parameters());
    assert_eq!(
        loaded.optimizer().map(lockstep_nn::Optimizer::iterations),
        Some(110),
        "the newest is ckpt-11, not ckpt-2 (names compared as numbers)"
    );
}
