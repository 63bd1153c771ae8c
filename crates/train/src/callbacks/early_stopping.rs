//! `EarlyStopping`: stop when a monitored value stops improving.

use serde::{Deserialize, Serialize};

use crate::callbacks::{Callback, CallbackState, Mode, TrainingContext, f64_bits};
use crate::error::TrainError;
use crate::history::Logs;

const NAME: &str = "EarlyStopping";

/// What a backup keeps of an `EarlyStopping`.
#[derive(Serialize, Deserialize)]
struct Saved {
    monitor: String,
    #[serde(with = "f64_bits")]
    best: Option<f64>,
    wait: u64,
}

/// Stops training after `patience` epochs without an improvement of `monitor` by more than
/// `min_delta`, as `tf.keras.callbacks.EarlyStopping`. Every worker sees the same logs, so
/// all stop after the same epoch. Its best value and the epochs waited are in every backup,
/// so a resumed run stops where the uninterrupted one would.
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

    fn state(&self) -> Option<CallbackState> {
        let saved = Saved {
            monitor: self.monitor.clone(),
            best: self.best,
            wait: self.wait,
        };
        CallbackState::new(NAME, &saved).ok()
    }

    fn restore_state(&mut self, state: &CallbackState) -> Result<(), TrainError> {
        let saved: Saved = state.value(NAME)?;
        if saved.monitor != self.monitor {
            tracing::warn!(
                saved = %saved.monitor,
                monitor = %self.monitor,
                "EarlyStopping: the backup watched another value; starting afresh"
            );
            return Ok(());
        }
        (self.best, self.wait) = (saved.best, saved.wait);
        Ok(())
    }
}
