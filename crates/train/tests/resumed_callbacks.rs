//! Callbacks that carry state from epoch to epoch go on after a resume from a backup as they
//! would have in the uninterrupted run: the backup holds their state.

#![allow(
    clippy::unwrap_used,
    reason = "a test that meets an error must fail loudly"
)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;

use common::{CrashAt, compiled, digits, workers};
use lockstep_nn::Adam;
use lockstep_train::{
    BackupAndRestore, Callback, EarlyStopping, History, LearningRateScheduler, Mode, Model,
    ModelCheckpoint, MultiWorkerMirroredStrategy, TrainError, TrainingContext,
};

/// Trains the MLP on 2 mirrored replicas (10 steps an epoch) for up to `epochs`, with the
/// callbacks in the order given; returns the weights and the history.
fn run(epochs: u64, callbacks: Vec<Box<dyn Callback>>) -> Result<(Vec<f32>, History), TrainError> {
    let mut model = compiled(2);
    let data = model.distribute_dataset(digits(), 64)?;
    let mut fit = model.fit(&data).epochs(epochs).verbose(false);
    for callback in callbacks {
        fit = fit.callback(callback);
    }
    let history = fit.run()?;
    Ok((model.network().parameters().values().to_vec(), history))
}

fn backup(dir: &Path) -> Box<dyn Callback> {
    Box::new(BackupAndRestore::new(dir.join("backup")))
}

fn crashed(result: Result<(Vec<f32>, History), TrainError>) {
    let err = result.unwrap_err();
    assert!(err.to_string().contains("crashed on purpose"), "{err}");
}

#[test]
fn early_stopping_resumed_from_a_backup_stops_after_the_epoch_the_uninterrupted_run_did() {
    // No epoch improves the loss by 10: epoch 0 sets the mark, epochs 1 and 2 wait, and
    // training stops after epoch 2. A fresh patience would run on to epoch 4.
    let patience = || Box::new(EarlyStopping::new("loss", 2).min_delta(10.0));
    let (uninterrupted, history) = run(10, vec![patience()]).unwrap();
    assert_eq!(history.epochs, [0, 1, 2]);
    let dir = tempfile::tempdir().unwrap();
    // The backup is added first: it still saves after EarlyStopping has seen the epoch.
    crashed(run(
        10,
        vec![backup(dir.path()), patience(), Box::new(CrashAt(25))],
    ));
    let (resumed, history) = run(10, vec![backup(dir.path()), patience()]).unwrap();
    assert_eq!(history.epochs, [2]);
    assert!(resumed == uninterrupted, "the resumed weights differ");
}

/// The files a `save_best_only` checkpoint left in `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("best"))
        .collect();
    names.sort();
    names
}

#[test]
fn save_best_only_resumed_from_a_backup_does_not_overwrite_the_best_model_with_a_worse_one() {
    // Maximising the loss, which falls: epoch 1's model is the best, and no later one is.
    let best = |dir: &Path| {
        let pattern = dir.join("best-{epoch}.safetensors");
        Box::new(ModelCheckpoint::new(pattern.to_str().unwrap()).save_best_only("loss", Mode::Max))
    };
    let first = tempfile::tempdir().unwrap();
    run(3, vec![best(first.path())]).unwrap();
    assert_eq!(files(first.path()), ["best-1.safetensors"]);
    let dir = tempfile::tempdir().unwrap();
    crashed(run(
        3,
        vec![backup(dir.path()), best(dir.path()), Box::new(CrashAt(15))],
    ));
    run(3, vec![best(dir.path()), backup(dir.path())]).unwrap();
    assert_eq!(files(dir.path()), ["best-1.safetensors"]);
}

#[test]
fn a_per_epoch_schedule_resumed_mid_epoch_is_not_applied_twice() {
    let halve = || {
        Box::new(LearningRateScheduler::new(|epoch, rate: f32| {
            if epoch == 0 { rate } else { rate * 0.5 }
        }))
    };
    let (uninterrupted, _) = run(3, vec![halve()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let steps = |dir: &Path| {
        Box::new(
            BackupAndRestore::new(dir.join("backup")).save_freq(lockstep_train::SaveFreq::Steps(4)),
        )
    };
    // Step 15 is mid-epoch 1, after the backup of step 12 (within the same epoch).
    crashed(run(
        3,
        vec![steps(dir.path()), halve(), Box::new(CrashAt(15))],
    ));
    let (resumed, _) = run(3, vec![steps(dir.path()), halve()]).unwrap();
    assert!(resumed == uninterrupted, "the resumed weights differ");
}

static BACKUP: OnceLock<PathBuf> = OnceLock::new();

/// Fails at the end of training on every worker but the chief.
struct FailsAtTheEndOffTheChief;

impl Callback for FailsAtTheEndOffTheChief {
    fn on_train_end(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if ctx.is_chief() {
            return Ok(());
        }
        Err(TrainError::Invalid {
            what: "test",
            why: "failed at the end on purpose".into(),
        })
    }
}

#[derive(Clone, Copy)]
enum Ending {
    Crash,
    FailOffTheChief,
    Normal,
}

/// One worker of two: trains up to 10 epochs with `EarlyStopping` and the shared backup,
/// ending as `ending` says.
fn worker(strategy: MultiWorkerMirroredStrategy, ending: Ending) -> (Vec<f32>, Vec<u64>, bool) {
    let mut model = Model::new(strategy, common::mlp).unwrap();
    model
        .compile(Adam::default(), common::loss(), &["accuracy"])
        .unwrap();
    let data = model.distribute_dataset(digits(), 64).unwrap();
    let mut fit = model
        .fit(&data)
        .epochs(10)
        .verbose(false)
        .callback(BackupAndRestore::new(BACKUP.get().unwrap()))
        .callback(EarlyStopping::new("loss", 2).min_delta(10.0));
    match ending {
        Ending::Crash => fit = fit.callback(CrashAt(25)),
        Ending::FailOffTheChief => fit = fit.callback(FailsAtTheEndOffTheChief),
        Ending::Normal => {}
    }
    match fit.run() {
        Ok(history) => (
            model.network().parameters().values().to_vec(),
            history.epochs,
            true,
        ),
        Err(_) => (Vec::new(), Vec::new(), false),
    }
}

#[test]
fn every_worker_takes_the_restored_callback_states_and_all_stop_together() {
    let dir = tempfile::tempdir().unwrap();
    BACKUP.set(dir.path().join("backup")).unwrap();
    let crashed = workers(2, 1, |s| worker(s, Ending::Crash));
    assert!(crashed.iter().all(|(_, _, finished)| !finished));
    // Resumed in epoch 2, both workers stop after it, as the uninterrupted run does; then a
    // worker fails at the end, which keeps the backup: the job restarts from it, not from
    // scratch.
    let failed = workers(2, 1, |s| worker(s, Ending::FailOffTheChief));
    assert!(failed.iter().all(|(_, _, finished)| !finished));
    assert!(BACKUP.get().unwrap().exists(), "kept when a worker failed");
    // The restarted job finds training stopped already: no epoch runs, and the backup goes.
    let resumed = workers(2, 1, |s| worker(s, Ending::Normal));
    for (_, epochs, finished) in &resumed {
        assert!(finished);
        assert!(epochs.is_empty(), "{epochs:?}");
    }
    assert_eq!(resumed[0].0, resumed[1].0);
    assert!(!BACKUP.get().unwrap().exists(), "deleted once all finished");
}
