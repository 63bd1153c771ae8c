//! When a `fit`'s steps ended.

use std::time::Instant;

use crate::callbacks::{Callback, TrainingContext};
use crate::error::TrainError;
use crate::history::Logs;

/// When the steps of a `fit` ended: the first (from `started`, the process's start) and the
/// last, so a run can report its steady speed as benchmarks time a training loop (examples of
/// steps 2..N over the time from the end of step 1 to the end of step N: without the first
/// step's set-up, a shuffle buffer's fill say). Pass
/// it to `fit` by reference (`.callback(&mut clock)`) and read it after.
#[derive(Debug)]
pub struct StepClock {
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl StepClock {
    /// A clock whose first-step time counts from `started`.
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            first: None,
            last: None,
        }
    }

    /// Seconds from `started` to the end of the first step (NaN before any step).
    pub fn first_step_s(&self) -> f64 {
        self.first
            .map_or(f64::NAN, |t| t.duration_since(self.started).as_secs_f64())
    }

    /// Examples per second of the steps after the first: `examples` trained in all, of which
    /// `first_step_examples` in the first step (NaN with fewer than two steps).
    pub fn loop_examples_per_s(&self, examples: u64, first_step_examples: u64) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) if last > first => {
                examples.saturating_sub(first_step_examples) as f64
                    / last.duration_since(first).as_secs_f64()
            }
            _ => f64::NAN,
        }
    }
}

impl Callback for &mut StepClock {
    fn on_train_batch_end(
        &mut self,
        _batch: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_loop_speed_counts_the_steps_after_the_first_over_their_time() {
        let started = Instant::now();
        let mut clock = StepClock::new(started);
        assert!(clock.first_step_s().is_nan());
        assert!(clock.loop_examples_per_s(640, 64).is_nan());
        clock.first = Some(started + Duration::from_secs(1));
        clock.last = Some(started + Duration::from_secs(3));
        assert_eq!(clock.first_step_s(), 1.0);
        // 576 examples after the first step's 64, in the 2 s from its end to the last's.
        assert_eq!(clock.loop_examples_per_s(640, 64), 288.0);
    }
}
