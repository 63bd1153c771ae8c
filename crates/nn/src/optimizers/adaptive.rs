//! Keras' adaptive optimizers beyond Adam: `AdamW` (Adam with decoupled weight decay),
//! `RMSprop` (plain, with momentum, centered) and `Adagrad`, with Keras 3's update rules and
//! defaults.

use std::ops::Range;

use rayon::prelude::*;

use super::{
    CHUNK, GradientClipping, LearningRateSchedule, Optimizer, OptimizerConfig, OptimizerSettings,
    adam_update, check_range, restore_slots,
};
use crate::error::NnError;

fn common(
    learning_rate: f32,
    schedule: Option<&LearningRateSchedule>,
    clipping: GradientClipping,
) -> OptimizerSettings {
    OptimizerSettings {
        learning_rate,
        schedule: schedule.cloned(),
        clipping,
    }
}

/// Keras' `AdamW`: Adam after a decoupled weight decay, `p −= p · weight_decay · lr`, with
/// Keras' defaults (rate 1e-3, weight decay 0.004, betas 0.9 and 0.999, epsilon 1e-7).
///
/// ```
/// use lockstep_nn::{AdamW, Optimizer};
///
/// let mut adamw = AdamW::default();
/// let mut params = [1.0_f32];
/// adamw.apply(&mut params, &[0.0])?; // no gradient: the decay alone
/// assert_eq!(params, [1.0 - 0.004 * 1e-3]);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// Step size, 1e-3.
    pub learning_rate: f32,
    /// First-moment decay, 0.9.
    pub beta_1: f32,
    /// Second-moment decay, 0.999.
    pub beta_2: f32,
    /// Added to the denominator, 1e-7.
    pub epsilon: f32,
    /// Decoupled weight decay, 0.004.
    pub weight_decay: f32,
    /// A per-step schedule of the step size.
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    pub clipping: GradientClipping,
    m: Vec<f32>,
    v: Vec<f32>,
    iterations: u64,
}

impl AdamW {
    /// `AdamW` with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            weight_decay: 0.004,
            schedule: None,
            clipping: GradientClipping::default(),
            m: Vec::new(),
            v: Vec::new(),
            iterations: 0,
        }
    }

    pub(crate) fn from_settings(
        common: OptimizerSettings,
        (beta_1, beta_2, epsilon): (f32, f32, f32),
        weight_decay: f32,
    ) -> Self {
        Self {
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
            schedule: common.schedule,
            clipping: common.clipping,
            ..Self::new(common.learning_rate)
        }
    }
}

impl Default for AdamW {
    fn default() -> Self {
        Self::new(1e-3)
    }
}

impl AdamW {
    /// The rule on `range` of the buffers, the step not counted.
    fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        let lr = self.learning_rate();
        let betas = (self.beta_1, self.beta_2, self.epsilon);
        let slots = (&mut self.m, &mut self.v);
        adam_update(
            (params, grads, range),
            slots,
            self.iterations,
            lr,
            betas,
            self.weight_decay,
        )
    }
}

impl Optimizer for AdamW {
    ranged_methods!();

    fn slots(&self) -> Vec<(&'static str, &[f32])> {
        vec![("m", &self.m), ("v", &self.v)]
    }

    fn config(&self) -> OptimizerConfig {
        OptimizerConfig::AdamW {
            common: common(self.learning_rate, self.schedule.as_ref(), self.clipping),
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
        }
    }

    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError> {
        restore_slots(
            "AdamW",
            &mut [("m", &mut self.m), ("v", &mut self.v)],
            slots,
        )?;
        self.iterations = iterations;
        Ok(())
    }

    common_methods!("AdamW");
}

/// Keras' `RMSprop`: steps scaled by a running mean square of the gradients, with Keras'
/// defaults (rate 1e-3, rho 0.9, no momentum, epsilon 1e-7, not centered).
#[derive(Debug, Clone, PartialEq)]
pub struct RmsProp {
    /// Step size, 1e-3.
    pub learning_rate: f32,
    /// Decay of the mean square, 0.9.
    pub rho: f32,
    /// Momentum factor, 0.
    pub momentum: f32,
    /// Added to the denominator, 1e-7.
    pub epsilon: f32,
    /// Whether the square of the mean gradient is subtracted (a variance, not a second moment).
    pub centered: bool,
    /// A per-step schedule of the step size.
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    pub clipping: GradientClipping,
    velocity: Vec<f32>,
    moment: Vec<f32>,
    average_gradient: Vec<f32>,
    iterations: u64,
}

impl RmsProp {
    /// `RMSprop` with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            rho: 0.9,
            momentum: 0.0,
            epsilon: 1e-7,
            centered: false,
            schedule: None,
            clipping: GradientClipping::default(),
            velocity: Vec::new(),
            moment: Vec::new(),
            average_gradient: Vec::new(),
            iterations: 0,
        }
    }

    pub(crate) fn from_settings(
        common: OptimizerSettings,
        rho: f32,
        momentum: f32,
        epsilon: f32,
        centered: bool,
    ) -> Self {
        Self {
            rho,
            momentum,
            epsilon,
            centered,
            schedule: common.schedule,
            clipping: common.clipping,
            ..Self::new(common.learning_rate)
        }
    }

    /// With momentum (Keras' `momentum`).
    #[must_use]
    pub fn momentum(mut self, momentum: f32) -> Self {
        self.momentum = momentum;
        self
    }

    /// Centered (Keras' `centered=True`).
    #[must_use]
    pub fn centered(mut self) -> Self {
        self.centered = true;
        self
    }

    fn slot_list(&mut self) -> Vec<(&'static str, &mut Vec<f32>)> {
        let mut slots = vec![("velocity", &mut self.velocity)];
        if self.momentum > 0.0 {
            slots.push(("momentum", &mut self.moment));
        }
        if self.centered {
            slots.push(("average_gradient", &mut self.average_gradient));
        }
        slots
    }
}

impl Default for RmsProp {
    fn default() -> Self {
        Self::new(1e-3)
    }
}

impl RmsProp {
    /// The rule on `range` of the buffers, the step not counted.
    fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        let lr = self.learning_rate();
        let (rho, momentum, eps, centered) = (self.rho, self.momentum, self.epsilon, self.centered);
        {
            let mut slots = self.slot_list();
            let mut refs: Vec<&mut Vec<f32>> = slots.iter_mut().map(|(_, s)| &mut **s).collect();
            check_range(params, grads, &mut refs, &range)?;
        }
        let n = params.len();
        let (moments, averages) = (
            slot_chunks(&mut self.moment, n, range.clone()),
            slot_chunks(&mut self.average_gradient, n, range.clone()),
        );
        params[range.clone()]
            .par_chunks_mut(CHUNK)
            .zip(grads[range.clone()].par_chunks(CHUNK))
            .zip(self.velocity[range].par_chunks_mut(CHUNK))
            .zip(moments.into_par_iter().zip(averages.into_par_iter()))
            .for_each(|(((p, g), v), (mut m, mut a))| {
                for (i, ((p, &g), v)) in p.iter_mut().zip(g).zip(v).enumerate() {
                    *v = rho * *v + (1.0 - rho) * g * g;
                    let denominator = match a.as_deref_mut() {
                        Some(a) if centered => {
                            a[i] = rho * a[i] + (1.0 - rho) * g;
                            *v - a[i] * a[i] + eps
                        }
                        _ => *v + eps,
                    };
                    let increment = lr * g / denominator.sqrt();
                    match m.as_deref_mut() {
                        Some(m) if momentum > 0.0 => {
                            m[i] = momentum * m[i] + increment;
                            *p -= m[i];
                        }
                        _ => *p -= increment,
                    }
                }
            });
        Ok(())
    }
}

impl Optimizer for RmsProp {
    ranged_methods!();

    fn slots(&self) -> Vec<(&'static str, &[f32])> {
        let mut slots: Vec<(&'static str, &[f32])> = vec![("velocity", &self.velocity)];
        if self.momentum > 0.0 {
            slots.push(("momentum", &self.moment));
        }
        if self.centered {
            slots.push(("average_gradient", &self.average_gradient));
        }
        slots
    }

    fn config(&self) -> OptimizerConfig {
        OptimizerConfig::RmsProp {
            common: common(self.learning_rate, self.schedule.as_ref(), self.clipping),
            rho: self.rho,
            momentum: self.momentum,
            epsilon: self.epsilon,
            centered: self.centered,
        }
    }

    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError> {
        let mut targets = self.slot_list();
        restore_slots("RMSprop", &mut targets, slots)?;
        self.iterations = iterations;
        Ok(())
    }

    common_methods!("RMSprop");
}

/// A slot cut into the update's chunks, or a `None` per chunk for a slot not in use (empty).
fn slot_chunks(slot: &mut [f32], n: usize, range: Range<usize>) -> Vec<Option<&mut [f32]>> {
    if slot.len() == n {
        slot[range].chunks_mut(CHUNK).map(Some).collect()
    } else {
        (0..range.len().div_ceil(CHUNK)).map(|_| None).collect()
    }
}

/// Keras' `Adagrad`: steps scaled by the root of the sum of squared gradients, which starts at
/// `initial_accumulator_value`, with Keras' defaults (rate 1e-3, 0.1, epsilon 1e-7).
#[derive(Debug, Clone, PartialEq)]
pub struct Adagrad {
    /// Step size, 1e-3.
    pub learning_rate: f32,
    /// The accumulator's starting value, 0.1.
    pub initial_accumulator_value: f32,
    /// Added under the root, 1e-7.
    pub epsilon: f32,
    /// A per-step schedule of the step size.
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    pub clipping: GradientClipping,
    accumulator: Vec<f32>,
    iterations: u64,
}

impl Adagrad {
    /// `Adagrad` with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            initial_accumulator_value: 0.1,
            epsilon: 1e-7,
            schedule: None,
            clipping: GradientClipping::default(),
            accumulator: Vec::new(),
            iterations: 0,
        }
    }

    pub(crate) fn from_settings(
        common: OptimizerSettings,
        initial_accumulator_value: f32,
        epsilon: f32,
    ) -> Self {
        Self {
            initial_accumulator_value,
            epsilon,
            schedule: common.schedule,
            clipping: common.clipping,
            ..Self::new(common.learning_rate)
        }
    }
}

impl Default for Adagrad {
    fn default() -> Self {
        Self::new(1e-3)
    }
}

impl Adagrad {
    /// The rule on `range` of the buffers, the step not counted.
    fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        if self.accumulator.is_empty() {
            self.accumulator = vec![self.initial_accumulator_value; params.len()];
        }
        check_range(params, grads, &mut [&mut self.accumulator], &range)?;
        let (lr, eps) = (self.learning_rate(), self.epsilon);
        params[range.clone()]
            .par_chunks_mut(CHUNK)
            .zip(grads[range.clone()].par_chunks(CHUNK))
            .zip(self.accumulator[range].par_chunks_mut(CHUNK))
            .for_each(|((p, g), a)| {
                for ((p, &g), a) in p.iter_mut().zip(g).zip(a) {
                    *a += g * g;
                    *p -= lr * g / (*a + eps).sqrt();
                }
            });
        Ok(())
    }
}

impl Optimizer for Adagrad {
    ranged_methods!();

    fn slots(&self) -> Vec<(&'static str, &[f32])> {
        vec![("accumulator", &self.accumulator)]
    }

    fn config(&self) -> OptimizerConfig {
        OptimizerConfig::Adagrad {
            common: common(self.learning_rate, self.schedule.as_ref(), self.clipping),
            initial_accumulator_value: self.initial_accumulator_value,
            epsilon: self.epsilon,
        }
    }

    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError> {
        restore_slots(
            "Adagrad",
            &mut [("accumulator", &mut self.accumulator)],
            slots,
        )?;
        self.iterations = iterations;
        Ok(())
    }

    common_methods!("Adagrad");
}
