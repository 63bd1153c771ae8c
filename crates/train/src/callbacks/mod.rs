//! Callbacks: code that runs at points of `fit`, as Keras' `tf.keras.callbacks`.

mod backup_and_restore;
mod csv_logger;
mod early_stopping;
mod learning_rate_scheduler;
mod model_checkpoint;
mod monitor;

pub use backup_and_restore::{BackupAndRestore, SaveFreq};
pub use csv_logger::CsvLogger;
pub use early_stopping::EarlyStopping;
pub use learning_rate_scheduler::LearningRateScheduler;
pub use model_checkpoint::ModelCheckpoint;
pub use monitor::Mode;

use crate::error::TrainError;
use crate::history::Logs;

/// Hooks into `fit`, all optional. They run on every worker, on the thread that called `fit`,
/// between steps; [`TrainingContext::is_chief`] tells a callback whether to write files.
pub trait Callback {
    /// Before the first step: the place to restore a backup.
    ///
    /// # Errors
    ///
    /// Any error stops `fit` with it.
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        let _ = ctx;
        Ok(())
    }

    /// Before epoch `epoch` (from 0).
    ///
    /// # Errors
    ///
    /// Any error stops `fit` with it.
    fn on_epoch_begin(
        &mut self,
        epoch: u64,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let _ = (epoch, ctx);
        Ok(())
    }

    /// After step `batch` of the epoch (from 0); `logs` are the epoch's running averages.
    ///
    /// # Errors
    ///
    /// Any error stops `fit` with it.
    fn on_train_batch_end(
        &mut self,
        batch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let _ = (batch, logs, ctx);
        Ok(())
    }

    /// After epoch `epoch`, with its logs (validation values prefixed `val_`).
    ///
    /// # Errors
    ///
    /// Any error stops `fit` with it.
    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let _ = (epoch, logs, ctx);
        Ok(())
    }

    /// After the last epoch, when training ended without an error.
    ///
    /// # Errors
    ///
    /// Any error is returned by `fit`.
    fn on_train_end(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        let _ = ctx;
        Ok(())
    }
}

pub use crate::state::TrainingContext;

/// A boxed callback is a callback: lists of `Box<dyn Callback>` chosen at run time.
impl<C: Callback + ?Sized> Callback for Box<C> {
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        (**self).on_train_begin(ctx)
    }
    fn on_epoch_begin(
        &mut self,
        epoch: u64,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        (**self).on_epoch_begin(epoch, ctx)
    }
    fn on_train_batch_end(
        &mut self,
        batch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        (**self).on_train_batch_end(batch, logs, ctx)
    }
    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        (**self).on_epoch_end(epoch, logs, ctx)
    }
    fn on_train_end(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        (**self).on_train_end(ctx)
    }
}
