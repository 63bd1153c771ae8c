//! `EarlyStopping`: stop when a monitored value stops improving.

use crate::callbacks::{Callback, Mode, TrainingContext};
use crate::error::TrainError;
use crate::history::Logs;

/// Stops training after `patience` epochs without an improvement of `monitor` by more than
/// `min_delta`, as `tf.keras.callbacks.EarlyStopping`. Every worker sees the same logs, so
/// all stop after the same epoch.
#[derive(Debug, Clone)]
pub struct EarlyStopping {
    monitor: String,
    min_delta: f64,
    patience: u64,
    mode: Mode,
    best: Option<f64>,
    wait: u64,
    /// The epoch after which training stopped, if it did.
    pub stopped_epoch: Option<u64>,
}

impl EarlyStopping {
    /// Watches `monitor` (e.g. `val_loss`) with this patience and no minimum change.
    pub fn new(monitor: impl Into<String>, patience: u64) -> Self {
        Self {
            monitor: monitor.into(),
            min_delta: 0.0,
            patience,
            mode: Mode::Auto,
            best: None,
            wait: 0,
            stopped_epoch: None,
        }
    }

    /// The smallest change that counts as an improvement.
    #[must_use]
    pub fn min_delta(mut self, min_delta: f64) -> Self {
        self.min_delta = min_delta;
        self
    }

    /// Which direction improves.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        (self.best, self.wait, self.stopped_epoch) = (None, 0, None);
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let Some(value) = logs.get(&self.monitor) else {
            tracing::warn!(monitor = %self.monitor, "EarlyStopping: the monitored value is not logged");
            return Ok(());
        };
        if self
            .mode
            .improves(&self.monitor, value, self.best, self.min_delta)
        {
            self.best = Some(value);
            self.wait = 0;
        } else {
            self.wait += 1;
            if self.wait >= self.patience {
                self.stopped_epoch = Some(epoch);
                ctx.stop_training();
            }
        }
        Ok(())
    }
}
