//! `BackupAndRestore`: survive a crash by resuming from the last backup.

use std::path::PathBuf;

use lockstep_checkpoint::CheckpointManager;

use crate::callbacks::{Callback, TrainingContext};
use crate::error::TrainError;
use crate::history::Logs;
use crate::kill_switch::KillSwitch;

/// When a callback saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveFreq {
    /// At the end of every epoch.
    #[default]
    Epoch,
    /// Every this many steps.
    Steps(u64),
}

/// Backs the whole training state up to `backup_dir` and restores it when `fit` starts
/// again, as `tf.keras.callbacks.BackupAndRestore`, and more exactly: the backup holds the
/// optimizer state and the position in the epoch, so a restart resumes at the step it
/// stopped at and reproduces the uninterrupted run bit for bit, also on another number of
/// workers (with the same global batch).
///
/// The backup also holds every stateful callback's state ([`Callback::state`]:
/// `ModelCheckpoint`'s best value, `EarlyStopping`'s wait, `LearningRateScheduler`'s epoch),
/// so that these go on after a resume as they would have; `fit` runs `BackupAndRestore` after
/// all other callbacks, so a backup holds their states after the same step.
///
/// The chief writes the backup (keeping only the newest); after each save every worker
/// learns whether it was written, so a failed save stops training everywhere with the
/// reason. After a run that ends normally the backup is deleted, as `tf_keras` does, once
/// every worker has said that it finished: a worker that fails at the end leaves the backup
/// for the restarted job.
#[derive(Debug, Clone)]
pub struct BackupAndRestore {
    dir: PathBuf,
    save_freq: SaveFreq,
    delete_checkpoint: bool,
    manager: Option<CheckpointManager>,
    kill_switch: KillSwitch,
}

impl BackupAndRestore {
    /// Backs up to `backup_dir` at the end of every epoch.
    pub fn new(backup_dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: backup_dir.into(),
            save_freq: SaveFreq::Epoch,
            delete_checkpoint: true,
            manager: None,
            kill_switch: KillSwitch::default(),
        }
    }

    /// Sets when to save.
    #[must_use]
    pub fn save_freq(mut self, save_freq: SaveFreq) -> Self {
        self.save_freq = save_freq;
        self
    }

    /// Whether to delete the backup after training ends normally (default `true`).
    #[must_use]
    pub fn delete_checkpoint(mut self, delete: bool) -> Self {
        self.delete_checkpoint = delete;
        self
    }

    fn save(&self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        let what = format!("its backup to {}", self.dir.display());
        ctx.chief_writes("BackupAndRestore", &what, |ctx| {
            // The manager exists on the chief, the only worker this runs on.
            if let Some(manager) = &self.manager {
                let (kill_switch, step) = (self.kill_switch, ctx.step());
                manager.save_with_hook(&ctx.checkpoint()?, || kill_switch.in_save(step))?;
            }
            Ok(())
        })
    }
}

impl Callback for BackupAndRestore {
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if let SaveFreq::Steps(0) = self.save_freq {
            return Err(TrainError::invalid(
                "BackupAndRestore",
                "save_freq of 0 steps",
            ));
        }
        if !ctx.is_chief() {
            return Ok(());
        }
        self.kill_switch = KillSwitch::from_env()?;
        let manager = CheckpointManager::new(&self.dir, Some(1))?;
        if let Some(checkpoint) = manager.latest()? {
            ctx.restore(&checkpoint)?;
            tracing::info!(
                step = checkpoint.progress.step,
                epoch = checkpoint.progress.epoch,
                "resuming from the backup in {}",
                self.dir.display()
            );
        }
        self.manager = Some(manager);
        Ok(())
    }

    fn on_train_batch_end(
        &mut self,
        _batch: u64,
        _logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        match self.save_freq {
            SaveFreq::Steps(n) if ctx.step().is_multiple_of(n) => self.save(ctx),
            _ => Ok(()),
        }
    }

    fn on_epoch_end(
        &mut self,
        _epoch: u64,
        _logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        match self.save_freq {
            SaveFreq::Epoch => self.save(ctx),
            SaveFreq::Steps(_) => Ok(()),
        }
    }

    fn on_train_end(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if !self.delete_checkpoint {
            return Ok(());
        }
        // Every worker reaches here only after its whole run, other callbacks' ends included;
        // one that failed on the way breaks this agreement, and the backup stays.
        if !ctx.agree(true)? {
            return Ok(());
        }
        match &self.manager {
            Some(manager) => Ok(manager.delete_all()?),
            None => Ok(()),
        }
    }

    fn saves_training_state(&self) -> bool {
        true
    }
}
