//! The callbacks of one `fit`, in the order their hooks run.

use std::collections::VecDeque;

use crate::callbacks::{Callback, CallbackState, TrainingContext};
use crate::error::TrainError;

/// A `fit`'s callbacks: in the order added, except that those that save the training state
/// (`BackupAndRestore`) run after all others, each time with every callback's state of the
/// same moment in hand.
pub(crate) struct CallbackList<'m> {
    callbacks: Vec<Box<dyn Callback + 'm>>,
    /// Index of the first callback that saves the training state (`callbacks.len()`: none).
    first_saver: usize,
}

impl<'m> CallbackList<'m> {
    pub(crate) fn new(mut callbacks: Vec<Box<dyn Callback + 'm>>) -> Self {
        // A stable sort: each group keeps the order the user gave.
        callbacks.sort_by_key(Callback::saves_training_state);
        let first_saver = callbacks
            .iter()
            .position(Callback::saves_training_state)
            .unwrap_or(callbacks.len());
        Self {
            callbacks,
            first_saver,
        }
    }

    /// Runs `hook` on every callback in turn; before the first one that saves the training
    /// state, gathers every callback's state into `ctx`.
    pub(crate) fn each(
        &mut self,
        ctx: &mut TrainingContext<'_>,
        mut hook: impl FnMut(&mut dyn Callback, &mut TrainingContext<'_>) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        for i in 0..self.callbacks.len() {
            if i == self.first_saver {
                ctx.callbacks = self.states();
            }
            hook(self.callbacks[i].as_mut(), ctx)?;
        }
        Ok(())
    }

    fn states(&self) -> Vec<CallbackState> {
        self.callbacks.iter().filter_map(Callback::state).collect()
    }

    /// Gives each stateful callback the saved state of its type in the same turn (the second
    /// `ModelCheckpoint` gets the second saved `ModelCheckpoint` state); a callback with none
    /// saved starts afresh, and saved states no callback takes are named in a warning.
    pub(crate) fn restore_states(&mut self, saved: &[CallbackState]) -> Result<(), TrainError> {
        let mut saved: VecDeque<&CallbackState> = saved.iter().collect();
        for callback in &mut self.callbacks {
            let Some(fresh) = callback.state() else {
                continue;
            };
            let at = saved.iter().position(|s| s.callback == fresh.callback);
            if let Some(state) = at.and_then(|at| saved.remove(at)) {
                callback.restore_state(state)?;
            } else {
                tracing::warn!(
                    callback = %fresh.callback,
                    "the backup holds no state for this callback: it starts afresh"
                );
            }
        }
        for unused in saved {
            tracing::warn!(
                callback = %unused.callback,
                "the backup holds the state of a callback this run does not have"
            );
        }
        Ok(())
    }
}
