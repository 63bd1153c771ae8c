//! Callbacks: code that runs at points of `fit`, as Keras' `tf.keras.callbacks`.

mod backup_and_restore;
mod callback_state;
mod csv_logger;
mod early_stopping;
mod learning_rate_scheduler;
mod list;
mod model_checkpoint;
mod monitor;

pub use backup_and_restore::{BackupAndRestore, SaveFreq};
pub use callback_state::CallbackState;
pub(crate) use callback_state::f64_bits;
pub use csv_logger::CsvLogger;
pub use early_stopping::EarlyStopping;
pub use learning_rate_scheduler::LearningRateScheduler;
pub(crate) use list::CallbackList;
pub use model_checkpoint::ModelCheckpoint;
pub(crate) use model_checkpoint::format_path;
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

    /// What this callback carries from one step to the next, which every backup holds so
    /// that a resumed run goes on as the uninterrupted one would (`ModelCheckpoint`'s best
    /// value, `EarlyStopping`'s wait). `None`, the default: it carries nothing.
    fn state(&self) -> Option<CallbackState> {
        None
    }

    /// Takes back what [`Callback::state`] gave, when `fit` resumes from a backup: on every
    /// worker, after every callback's `on_train_begin`.
    ///
    /// # Errors
    ///
    /// When the state is not this callback's; `fit` stops with the error.
    fn restore_state(&mut self, state: &CallbackState) -> Result<(), TrainError> {
        let _ = state;
        Ok(())
    }

    /// Whether this callback saves the training state, as `BackupAndRestore` does: `fit` runs
    /// its hooks after every other callback's, so what it saves holds their states after the
    /// same step (PyTorch Lightning runs its checkpointing callbacks last for the same reason).
    fn saves_training_state(&self) -> bool {
        false
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
    fn state(&self) -> Option<CallbackState> {
        (**self).state()
    }
    fn restore_state(&mut self, state: &CallbackState) -> Result<(), TrainError> {
        (**self).restore_state(state)
    }
    fn saves_training_state(&self) -> bool {
        (**self).saves_training_state()
    }
}
