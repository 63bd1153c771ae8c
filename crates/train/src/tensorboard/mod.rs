//! The `TensorBoard` callback and the event files it writes.

mod events;

use std::path::PathBuf;

use crate::callbacks::{Callback, TrainingContext};
use crate::error::TrainError;
use crate::history::Logs;
pub(crate) use events::EventWriter;

/// Logs to `TensorBoard` as `tf.keras.callbacks.TensorBoard` does: event files under
/// `log_dir/train` and `log_dir/validation`, scalars `epoch_<name>` at each epoch's end (step =
/// the epoch, from 0; validation values without their `val_` prefix), and with
/// [`TensorBoard::update_freq`] `batch_<name>` every N steps (step = the optimizer step). Only
/// the chief writes. With several replicas in sync, each epoch's straggler report goes beside
/// the training scalars: `straggler/replica` (the index of the replica the others waited for),
/// `straggler/wait_ms_per_step` and `straggler/share_of_step`
/// ([`TrainingContext::straggler`]).
#[derive(Default)]
pub struct TensorBoard {
    log_dir: PathBuf,
    update_freq: Option<u64>,
    train: Option<EventWriter>,
    validation: Option<EventWriter>,
}

impl std::fmt::Debug for TensorBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorBoard")
            .field("log_dir", &self.log_dir)
            .field("update_freq", &self.update_freq)
            .finish_non_exhaustive()
    }
}

impl TensorBoard {
    /// Logs under `log_dir` once per epoch.
    pub fn new(log_dir: impl Into<PathBuf>) -> Self {
        Self {
            log_dir: log_dir.into(),
            ..Self::default()
        }
    }

    /// Also logs the running values every `steps` steps.
    #[must_use]
    pub fn update_freq(mut self, steps: u64) -> Self {
        self.update_freq = Some(steps);
        self
    }
}

impl Callback for TensorBoard {
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if self.update_freq == Some(0) {
            return Err(TrainError::invalid("TensorBoard", "update_freq of 0 steps"));
        }
        if ctx.is_chief() {
            self.train = Some(EventWriter::create(&self.log_dir.join("train"))?);
        }
        Ok(())
    }

    fn on_train_batch_end(
        &mut self,
        _batch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let (Some(writer), Some(every)) = (&mut self.train, self.update_freq) else {
            return Ok(());
        };
        if !ctx.step().is_multiple_of(every) {
            return Ok(());
        }
        let values: Vec<(String, f64)> = logs
            .0
            .iter()
            .map(|(name, value)| (format!("batch_{name}"), *value))
            .collect();
        writer.scalars(ctx.step(), &values)?;
        writer.flush()
    }

    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let Some(train) = &mut self.train else {
            return Ok(());
        };
        let (validation, training): (Vec<_>, Vec<_>) = logs
            .0
            .iter()
            .partition(|(name, _)| name.starts_with("val_"));
        let mut training: Vec<(String, f64)> = training
            .into_iter()
            .map(|(name, value)| (format!("epoch_{name}"), *value))
            .collect();
        if let Some(s) = ctx.straggler() {
            training.extend([
                ("straggler/replica".to_owned(), s.replica as f64),
                (
                    "straggler/wait_ms_per_step".to_owned(),
                    s.wait_per_step.as_secs_f64() * 1e3,
                ),
                ("straggler/share_of_step".to_owned(), s.share),
            ]);
        }
        train.scalars(epoch, &training)?;
        train.flush()?;
        if !validation.is_empty() {
            if self.validation.is_none() {
                self.validation = Some(EventWriter::create(&self.log_dir.join("validation"))?);
            }
            if let Some(writer) = &mut self.validation {
                let values: Vec<(String, f64)> = validation
                    .into_iter()
                    .map(|(name, value)| {
                        (format!("epoch_{}", name.trim_start_matches("val_")), *value)
                    })
                    .collect();
                writer.scalars(epoch, &values)?;
                writer.flush()?;
            }
        }
        Ok(())
    }
}
