//! Learning rates that change every step: Keras' `LearningRateSchedule`s, evaluated at the
//! optimizer's step count, so that a run resumed from a checkpoint (which holds the count)
//! takes the same rates as an uninterrupted one.

use serde::{Deserialize, Serialize};

use crate::error::NnError;

/// A per-step learning rate, by Keras class name.
///
/// ```
/// use lockstep_nn::LearningRateSchedule;
///
/// let schedule = LearningRateSchedule::ExponentialDecay {
///     initial_learning_rate: 0.1,
///     decay_steps: 10,
///     decay_rate: 0.5,
///     staircase: true,
/// };
/// assert_eq!(schedule.at(9), 0.1);
/// assert_eq!(schedule.at(10), 0.05);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
pub enum LearningRateSchedule {
    /// `initial · decay_rate^(step / decay_steps)`, the exponent floored when `staircase`.
    ExponentialDecay {
        /// The rate at step 0.
        initial_learning_rate: f32,
        /// Steps per factor of `decay_rate`.
        decay_steps: u64,
        /// The factor.
        decay_rate: f32,
        /// Whether the rate changes only every `decay_steps`.
        staircase: bool,
    },
    /// `values[0]` up to `boundaries[0]` (included), `values[i]` up to `boundaries[i]`, then
    /// the last value.
    PiecewiseConstantDecay {
        /// Steps where the rate changes, increasing.
        boundaries: Vec<u64>,
        /// One more rate than boundaries.
        values: Vec<f32>,
    },
    /// A linear warm-up from `initial_learning_rate` to `warmup_target` over `warmup_steps`
    /// (when a target is given), then a cosine from there down to `alpha` times it over
    /// `decay_steps`, then constant.
    CosineDecay {
        /// The rate at step 0.
        initial_learning_rate: f32,
        /// Steps of the cosine.
        decay_steps: u64,
        /// The final fraction of the rate.
        #[serde(default)]
        alpha: f32,
        /// The rate the warm-up reaches, where the cosine starts.
        #[serde(default)]
        warmup_target: Option<f32>,
        /// Steps of the warm-up.
        #[serde(default)]
        warmup_steps: u64,
    },
}

impl LearningRateSchedule {
    /// The rate at `step` (the optimizer's step count before the update).
    pub fn at(&self, step: u64) -> f32 {
        let step_f = step as f64;
        let rate = match self {
            Self::ExponentialDecay {
                initial_learning_rate,
                decay_steps,
                decay_rate,
                staircase,
            } => {
                let mut p = step_f / (*decay_steps).max(1) as f64;
                if *staircase {
                    p = p.floor();
                }
                f64::from(*initial_learning_rate) * f64::from(*decay_rate).powf(p)
            }
            Self::PiecewiseConstantDecay { boundaries, values } => {
                let i = boundaries.iter().take_while(|&&b| step > b).count();
                f64::from(values.get(i).or(values.last()).copied().unwrap_or(0.0))
            }
            Self::CosineDecay {
                initial_learning_rate,
                decay_steps,
                alpha,
                warmup_target,
                warmup_steps,
            } => {
                let initial = f64::from(*initial_learning_rate);
                let (start, decay_from) = match warmup_target {
                    Some(target) if step < *warmup_steps => {
                        let target = f64::from(*target);
                        return (initial
                            + (target - initial) * step_f / (*warmup_steps).max(1) as f64)
                            as f32;
                    }
                    Some(target) => (f64::from(*target), *warmup_steps),
                    None => (initial, 0),
                };
                let done = (step - decay_from.min(step)).min(*decay_steps) as f64;
                let cosine = 0.5
                    * (1.0 + (std::f64::consts::PI * done / (*decay_steps).max(1) as f64).cos());
                let alpha = f64::from(*alpha);
                start * ((1.0 - alpha) * cosine + alpha)
            }
        };
        rate as f32
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`]: no decay steps, boundaries not increasing or not one fewer
    /// than the values.
    pub fn validate(&self) -> Result<(), NnError> {
        let invalid = |why: &str| {
            Err(NnError::InvalidConfig {
                layer: "learning rate schedule".to_owned(),
                why: why.to_owned(),
            })
        };
        match self {
            Self::ExponentialDecay { decay_steps: 0, .. }
            | Self::CosineDecay { decay_steps: 0, .. } => invalid("decay_steps must be at least 1"),
            Self::PiecewiseConstantDecay { boundaries, values } => {
                if values.len() != boundaries.len() + 1 {
                    invalid("PiecewiseConstantDecay needs one more value than boundaries")
                } else if boundaries.windows(2).any(|w| w[0] >= w[1]) {
                    invalid("PiecewiseConstantDecay's boundaries must increase")
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_schedule_gives_kerass_rates() {
        let smooth = LearningRateSchedule::ExponentialDecay {
            initial_learning_rate: 0.1,
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: false,
        };
        assert!((smooth.at(5) - 0.1 * 0.5_f32.powf(0.5)).abs() < 1e-7);
        let piecewise = LearningRateSchedule::PiecewiseConstantDecay {
            boundaries: vec![100, 200],
            values: vec![1.0, 0.5, 0.1],
        };
        let rates: Vec<f32> = [0, 100, 101, 200, 201, 10_000]
            .iter()
            .map(|&s| piecewise.at(s))
            .collect();
        assert_eq!(rates, [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]);
        let cosine = LearningRateSchedule::CosineDecay {
            initial_learning_rate: 0.0,
            decay_steps: 100,
            alpha: 0.1,
            warmup_target: Some(1.0),
            warmup_steps: 10,
        };
        assert_eq!(cosine.at(0), 0.0);
        assert!((cosine.at(5) - 0.5).abs() < 1e-7);
        assert_eq!(cosine.at(10), 1.0);
        assert!((cosine.at(60) - 0.55).abs() < 1e-6); // half way: (1 − 0.1)·0.5 + 0.1
        assert!((cosine.at(110) - 0.1).abs() < 1e-7);
        assert!((cosine.at(5_000) - 0.1).abs() < 1e-7);
    }

    #[test]
    fn impossible_schedules_are_errors() {
        let bad = LearningRateSchedule::PiecewiseConstantDecay {
            boundaries: vec![5, 5],
            values: vec![1.0, 0.5, 0.1],
        };
        assert!(bad.validate().is_err());
        let short = LearningRateSchedule::PiecewiseConstantDecay {
            boundaries: vec![5],
            values: vec![1.0],
        };
        assert!(short.validate().is_err());
    }
}
