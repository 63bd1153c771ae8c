//! `LearningRateScheduler`: a learning rate chosen per epoch.

use crate::callbacks::{Callback, TrainingContext};
use crate::error::TrainError;

/// Sets every replica's learning rate at the start of each epoch to `schedule(epoch, rate)`,
/// as `tf.keras.callbacks.LearningRateScheduler` (epoch from 0, `rate` the current one).
/// Every worker runs the same schedule, so all replicas keep the same rate.
pub struct LearningRateScheduler<F> {
    schedule: F,
}

impl<F: FnMut(u64, f32) -> f32> LearningRateScheduler<F> {
    /// Schedules with `schedule`.
    pub fn new(schedule: F) -> Self {
        Self { schedule }
    }
}

impl<F: FnMut(u64, f32) -> f32> Callback for LearningRateScheduler<F> {
    fn on_epoch_begin(
        &mut self,
        epoch: u64,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let current = ctx
            .model()
            .optimizer()
            .map(lockstep_nn::Optimizer::learning_rate)
            .ok_or_else(crate::replica::not_compiled)?;
        let rate = (self.schedule)(epoch, current);
        if !rate.is_finite() || rate < 0.0 {
            return Err(TrainError::invalid(
                "LearningRateScheduler",
                format!("the schedule gave {rate} for epoch {epoch}"),
            ));
        }
        ctx.set_learning_rate(rate);
        Ok(())
    }
}
