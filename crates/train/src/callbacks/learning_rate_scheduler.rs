//! `LearningRateScheduler`: a learning rate chosen per epoch.

use serde::{Deserialize, Serialize};

use crate::callbacks::{Callback, CallbackState, TrainingContext};
use crate::error::TrainError;

const NAME: &str = "LearningRateScheduler";

/// The epoch the schedule last ran for, and the rate it was given then.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Applied {
    epoch: u64,
    /// The rate before the schedule changed it, as bits (exact through JSON).
    rate_before: u32,
}

/// Sets every replica's learning rate at the start of each epoch to `schedule(epoch, rate)`,
/// as `tf.keras.callbacks.LearningRateScheduler` (epoch from 0, `rate` the current one).
/// Every worker runs the same schedule, so all replicas keep the same rate. A run resumed in
/// the middle of an epoch gives the schedule the rate that epoch began with, as the
/// uninterrupted run did, not the rate the schedule already made of it.
pub struct LearningRateScheduler<F> {
    schedule: F,
    applied: Option<Applied>,
}

impl<F: FnMut(u64, f32) -> f32> LearningRateScheduler<F> {
    /// Schedules with `schedule`.
    pub fn new(schedule: F) -> Self {
        Self {
            schedule,
            applied: None,
        }
    }
}

impl<F: FnMut(u64, f32) -> f32> Callback for LearningRateScheduler<F> {
    fn on_epoch_begin(
        &mut self,
        epoch: u64,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let current = match self.applied {
            // Resumed within this epoch: the rate had been scheduled already.
            Some(applied) if applied.epoch == epoch => f32::from_bits(applied.rate_before),
            _ => ctx
                .model()
                .optimizer()
                .map(lockstep_nn::Optimizer::learning_rate)
                .ok_or_else(crate::replica::not_compiled)?,
        };
        self.applied = Some(Applied {
            epoch,
            rate_before: current.to_bits(),
        });
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

    fn state(&self) -> Option<CallbackState> {
        CallbackState::new(NAME, &self.applied).ok()
    }

    fn restore_state(&mut self, state: &CallbackState) -> Result<(), TrainError> {
        self.applied = state.value(NAME)?;
        Ok(())
    }
}
