//! Optimizers that update a model's flat parameter buffer from its flat gradient buffer, with
//! Keras' update rules, names and defaults: [`Sgd`] (momentum, Nesterov) and [`Adam`] here,
//! [`AdamW`], [`RmsProp`] and [`Adagrad`] in `adaptive.rs`; every one with Keras' gradient
//! clipping ([`GradientClipping`], applied by [`apply_clipped`]) and per-step learning-rate
//! schedules ([`LearningRateSchedule`], evaluated at the step count, so a resumed run takes the
//! rates an uninterrupted one would).

/// The trait methods of an optimizer whose inherent `update(params, grads, range)` applies its
/// rule to `range` of the buffers without counting the step: whole steps and ranged ones.
macro_rules! ranged_methods {
    () => {
        fn apply(&mut self, params: &mut [f32], grads: &[f32]) -> Result<(), NnError> {
            self.update(params, grads, 0..params.len())?;
            self.iterations += 1;
            Ok(())
        }

        fn applies_ranges(&self) -> bool {
            true
        }

        fn apply_range(
            &mut self,
            params: &mut [f32],
            grads: &[f32],
            range: std::ops::Range<usize>,
        ) -> Result<(), NnError> {
            self.update(params, grads, range)
        }

        fn finish_step(&mut self) {
            self.iterations += 1;
        }
    };
}

/// The trait methods every optimizer shares: step count, name, rate, schedule and clipping.
macro_rules! common_methods {
    ($name:literal) => {
        fn iterations(&self) -> u64 {
            self.iterations
        }

        fn name(&self) -> &'static str {
            $name
        }

        fn learning_rate(&self) -> f32 {
            $crate::optimizers::scheduled(
                self.schedule.as_ref(),
                self.learning_rate,
                self.iterations,
            )
        }

        fn set_learning_rate(&mut self, learning_rate: f32) {
            $crate::optimizers::set_rate(
                self.schedule.as_ref(),
                &mut self.learning_rate,
                learning_rate,
                $name,
            );
        }

        fn clipping(&self) -> GradientClipping {
            self.clipping
        }

        fn schedule(&self) -> Option<&LearningRateSchedule> {
            self.schedule.as_ref()
        }
    };
}

mod adaptive;
mod clipping;
mod schedules;

use std::ops::Range;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub use adaptive::{Adagrad, AdamW, RmsProp};
pub use clipping::GradientClipping;
pub use schedules::LearningRateSchedule;

use crate::error::NnError;
use crate::params::Parameters;

/// Values per parallel task: elementwise updates are independent, so any split gives the
/// same bits.
pub(crate) const CHUNK: usize = 1 << 14;

/// An update rule with state (slots) laid out like the parameters.
pub trait Optimizer: Send {
    /// Applies one step: `params` and `grads` are the model's buffers.
    ///
    /// # Errors
    ///
    /// When the buffers differ in length from each other or from the optimizer's slots.
    fn apply(&mut self, params: &mut [f32], grads: &[f32]) -> Result<(), NnError>;

    /// Whether [`Optimizer::apply_range`] works: every built-in optimizer's rule is
    /// elementwise, so a step applied range by range gives the bits of one applied whole.
    fn applies_ranges(&self) -> bool {
        false
    }

    /// Applies this step's update to `range` of the buffers only (`params` and `grads` are the
    /// model's whole buffers), without counting the step: a step applied this way is disjoint
    /// ranges that cover the buffers, then one [`Optimizer::finish_step`]. A training step
    /// whose update waits for its gradients pack by pack applies each pack as it is summed.
    ///
    /// # Errors
    ///
    /// As [`Optimizer::apply`]; a range past the buffers; an optimizer that applies whole
    /// steps only ([`Optimizer::applies_ranges`] is `false`, the default).
    fn apply_range(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        let _ = (params, grads, range);
        Err(NnError::InvalidConfig {
            layer: self.name().into(),
            why: "this optimizer applies whole steps only".into(),
        })
    }

    /// Counts a step applied with [`Optimizer::apply_range`].
    fn finish_step(&mut self) {}

    /// Steps applied so far.
    fn iterations(&self) -> u64;

    /// Named state, for checkpoints: each slot is laid out like the parameters (empty before
    /// the first step).
    fn slots(&self) -> Vec<(&'static str, &[f32])>;

    /// Keras' class name (`SGD`, `Adam`), recorded in checkpoints.
    fn name(&self) -> &'static str;

    /// The settings that make a fresh optimizer like this one ([`OptimizerConfig::build`]).
    fn config(&self) -> OptimizerConfig;

    /// The step size.
    fn learning_rate(&self) -> f32;

    /// Changes the step size (a learning-rate schedule).
    fn set_learning_rate(&mut self, learning_rate: f32);

    /// How gradients are clipped before an update ([`apply_clipped`]); none by default.
    fn clipping(&self) -> GradientClipping {
        GradientClipping::default()
    }

    /// The per-step learning-rate schedule, when the optimizer has one.
    fn schedule(&self) -> Option<&LearningRateSchedule> {
        None
    }

    /// Replaces the state with a saved one: the step count and every slot [`Optimizer::slots`]
    /// names, or no slot at all for an optimizer saved before its first step.
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`] when a slot is missing, unknown, or of another length than
    /// the others.
    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError>;
}

/// Clips `grads` as `optimizer` says ([`Optimizer::clipping`]; `variables` are the variables'
/// ranges in the flat buffers), then applies the update: what a training step calls with the
/// all-reduced gradient.
///
/// # Errors
///
/// As [`Optimizer::apply`].
pub fn apply_clipped(
    optimizer: &mut dyn Optimizer,
    params: &mut [f32],
    grads: &mut [f32],
    variables: &[Range<usize>],
) -> Result<(), NnError> {
    let clipping = optimizer.clipping();
    if !clipping.is_none() {
        clipping.apply(grads, variables);
    }
    optimizer.apply(params, grads)
}

/// One training step's update of a model's variables from the all-reduced buffer `grads` (laid
/// out as `params`): non-trainable state moves towards its observation (each observation slot
/// times `observation_scale` being the mean over the step, [`crate::Update::MovingAverage`]),
/// then [`apply_clipped`] updates the trainable variables, untouched by the state's slots.
///
/// # Errors
///
/// A buffer of another length than the parameters; as [`Optimizer::apply`].
pub fn apply_update(
    optimizer: &mut dyn Optimizer,
    params: &mut Parameters,
    grads: &mut [f32],
    observation_scale: f32,
) -> Result<(), NnError> {
    if grads.len() != params.len() {
        return Err(NnError::Length {
            what: "gradient buffer and parameters",
            left: grads.len(),
            right: params.len(),
        });
    }
    let next = params.next_state(grads, observation_scale);
    let variables = params.ranges();
    apply_clipped(optimizer, params.values_mut(), grads, &variables)?;
    params.set_state(next);
    Ok(())
}

/// [`apply_update`] on the values within `range` of the buffers only, the step not counted
/// ([`Optimizer::apply_range`]): a step applied piece by piece as each piece's sum arrives,
/// then [`Optimizer::finish_step`] once. The same bits as [`apply_update`] over the same step,
/// for an optimizer that [`Optimizer::applies_ranges`] and a clipping other than
/// `global_clipnorm` (which needs every gradient: [`GradientClipping::is_per_variable`]).
/// `range` may cut a trainable variable when nothing is clipped (the update of each value is
/// its own then); a clipped or non-trainable variable must be within it whole.
///
/// # Errors
///
/// A buffer of another length than the parameters, a range that cuts a variable it may not or
/// runs past them, a clipping across variables; as [`Optimizer::apply_range`].
pub fn apply_update_range(
    optimizer: &mut dyn Optimizer,
    params: &mut Parameters,
    grads: &mut [f32],
    range: Range<usize>,
    observation_scale: f32,
) -> Result<(), NnError> {
    if grads.len() != params.len() {
        return Err(NnError::Length {
            what: "gradient buffer and parameters",
            left: grads.len(),
            right: params.len(),
        });
    }
    if range.end > grads.len() || range.start > range.end {
        return Err(NnError::InvalidConfig {
            layer: optimizer.name().into(),
            why: format!("values {}..{} of {}", range.start, range.end, grads.len()),
        });
    }
    let clipping = optimizer.clipping();
    if !clipping.is_per_variable() {
        return Err(NnError::InvalidConfig {
            layer: optimizer.name().into(),
            why: "global_clipnorm needs every gradient of the step at once".into(),
        });
    }
    let mut variables = Vec::new();
    for spec in params.specs() {
        let v = spec.range();
        if v.is_empty() || v.end <= range.start || v.start >= range.end {
            continue;
        }
        if v.start >= range.start && v.end <= range.end {
            variables.push(v);
        } else if !(spec.is_trainable() && clipping.is_none()) {
            return Err(NnError::InvalidConfig {
                layer: optimizer.name().into(),
                why: format!(
                    "values {}..{} cut {}, whose update needs whole variables (it is clipped \
                     or not trained)",
                    range.start, range.end, spec.name
                ),
            });
        }
    }
    let next = params.next_state_within(grads, observation_scale, &range);
    let within: Vec<Range<usize>> = variables
        .iter()
        .map(|v| v.start - range.start..v.end - range.start)
        .collect();
    clipping.apply(&mut grads[range.clone()], &within);
    optimizer.apply_range(params.values_mut(), grads, range)?;
    params.set_state(next);
    Ok(())
}

/// What every optimizer has beside its update rule: its rate, schedule and clipping.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSettings {
    /// The step size, when no schedule sets it.
    pub learning_rate: f32,
    /// A per-step schedule of the step size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    #[serde(default, skip_serializing_if = "GradientClipping::is_none")]
    pub clipping: GradientClipping,
}

/// The step size at step `iterations`: the schedule's, or the fixed rate.
/// Builder methods every optimizer has: a schedule and Keras' three clippings.
macro_rules! schedule_and_clipping {
    ($($optimizer:ty),*) => {$(
        impl $optimizer {
            /// The step size follows `schedule`, step by step.
            #[must_use]
            pub fn with_schedule(mut self, schedule: LearningRateSchedule) -> Self {
                self.schedule = Some(schedule);
                self
            }

            /// Each variable's gradient is scaled down to this L2 norm at most (Keras'
            /// `clipnorm`).
            #[must_use]
            pub fn clipnorm(mut self, bound: f32) -> Self {
                self.clipping = GradientClipping { clipnorm: Some(bound), ..GradientClipping::default() };
                self
            }

            /// Each gradient value is limited to `±bound` (Keras' `clipvalue`).
            #[must_use]
            pub fn clipvalue(mut self, bound: f32) -> Self {
                self.clipping = GradientClipping { clipvalue: Some(bound), ..GradientClipping::default() };
                self
            }

            /// All gradients together are scaled down to this L2 norm at most (Keras'
            /// `global_clipnorm`).
            #[must_use]
            pub fn global_clipnorm(mut self, bound: f32) -> Self {
                self.clipping = GradientClipping {
                    global_clipnorm: Some(bound),
                    ..GradientClipping::default()
                };
                self
            }
        }
    )*};
}
schedule_and_clipping!(Sgd, Adam, AdamW, RmsProp, Adagrad);

pub(crate) fn scheduled(
    schedule: Option<&LearningRateSchedule>,
    learning_rate: f32,
    iterations: u64,
) -> f32 {
    schedule.map_or(learning_rate, |s| s.at(iterations))
}

/// Sets `slot` to `learning_rate`, unless a schedule decides the rate (Keras refuses to set
/// a scheduled rate; a `LearningRateScheduler` callback beside a schedule is logged).
pub(crate) fn set_rate(
    schedule: Option<&LearningRateSchedule>,
    slot: &mut f32,
    learning_rate: f32,
    optimizer: &str,
) {
    if schedule.is_some() {
        tracing::warn!(
            optimizer,
            learning_rate,
            "the optimizer's schedule sets its learning rate: the change is ignored"
        );
    } else {
        *slot = learning_rate;
    }
}

/// An optimizer's settings by Keras class name, serialisable for whole-model saves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// [`Sgd`].
    #[serde(rename = "SGD")]
    Sgd {
        /// Step size.
        learning_rate: f32,
        /// Momentum factor.
        momentum: f32,
        /// Nesterov momentum.
        nesterov: bool,
        /// A per-step schedule of the step size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schedule: Option<LearningRateSchedule>,
        /// Gradient clipping.
        #[serde(default, skip_serializing_if = "GradientClipping::is_none")]
        clipping: GradientClipping,
    },
    /// [`Adam`].
    Adam {
        /// Step size.
        learning_rate: f32,
        /// First-moment decay.
        beta_1: f32,
        /// Second-moment decay.
        beta_2: f32,
        /// Added to the denominator.
        epsilon: f32,
        /// A per-step schedule of the step size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schedule: Option<LearningRateSchedule>,
        /// Gradient clipping.
        #[serde(default, skip_serializing_if = "GradientClipping::is_none")]
        clipping: GradientClipping,
    },
    /// [`AdamW`].
    AdamW {
        /// Rate, schedule and clipping.
        #[serde(flatten)]
        common: OptimizerSettings,
        /// First-moment decay.
        beta_1: f32,
        /// Second-moment decay.
        beta_2: f32,
        /// Added to the denominator.
        epsilon: f32,
        /// Decoupled weight decay.
        weight_decay: f32,
    },
    /// [`RmsProp`].
    #[serde(rename = "RMSprop")]
    RmsProp {
        /// Rate, schedule and clipping.
        #[serde(flatten)]
        common: OptimizerSettings,
        /// Decay of the mean square.
        rho: f32,
        /// Momentum factor.
        momentum: f32,
        /// Added to the denominator.
        epsilon: f32,
        /// Whether the mean gradient's square is subtracted.
        centered: bool,
    },
    /// [`Adagrad`].
    Adagrad {
        /// Rate, schedule and clipping.
        #[serde(flatten)]
        common: OptimizerSettings,
        /// The accumulator's starting value.
        initial_accumulator_value: f32,
        /// Added to the denominator.
        epsilon: f32,
    },
}

impl OptimizerConfig {
    /// A fresh optimizer with these settings (no state yet).
    pub fn build(&self) -> Box<dyn Optimizer> {
        match self.clone() {
            Self::Sgd {
                learning_rate,
                momentum,
                nesterov,
                schedule,
                clipping,
            } => Box::new(Sgd {
                schedule,
                clipping,
                ..Sgd::with_momentum(learning_rate, momentum, nesterov)
            }),
            Self::Adam {
                learning_rate,
                beta_1,
                beta_2,
                epsilon,
                schedule,
                clipping,
            } => Box::new(Adam {
                beta_1,
                beta_2,
                epsilon,
                schedule,
                clipping,
                ..Adam::new(learning_rate)
            }),
            Self::AdamW {
                common,
                beta_1,
                beta_2,
                epsilon,
                weight_decay,
            } => Box::new(AdamW::from_settings(
                common,
                (beta_1, beta_2, epsilon),
                weight_decay,
            )),
            Self::RmsProp {
                common,
                rho,
                momentum,
                epsilon,
                centered,
            } => Box::new(RmsProp::from_settings(
                common, rho, momentum, epsilon, centered,
            )),
            Self::Adagrad {
                common,
                initial_accumulator_value,
                epsilon,
            } => Box::new(Adagrad::from_settings(
                common,
                initial_accumulator_value,
                epsilon,
            )),
        }
    }
}

/// Fills `targets` (name, slot) from `saved`, which must name exactly those slots, all of one
/// length, or none (the state before the first step).
pub(crate) fn restore_slots(
    optimizer: &'static str,
    targets: &mut [(&'static str, &mut Vec<f32>)],
    saved: &[(&str, &[f32])],
) -> Result<(), NnError> {
    if saved.is_empty() {
        // Saved before its first step: no state yet.
        for (_, slot) in targets.iter_mut() {
            slot.clear();
        }
        return Ok(());
    }
    let invalid = |why: String| NnError::InvalidConfig {
        layer: optimizer.to_owned(),
        why,
    };
    if let Some((name, _)) = saved
        .iter()
        .find(|(name, _)| !targets.iter().any(|(t, _)| t == name))
    {
        return Err(invalid(format!("it has no slot {name:?}")));
    }
    let mut length = None;
    for (name, slot) in targets.iter_mut() {
        let Some((_, values)) = saved.iter().find(|(s, _)| s == name) else {
            return Err(invalid(format!("the saved state lacks slot {name:?}")));
        };
        if *length.get_or_insert(values.len()) != values.len() {
            return Err(invalid(format!(
                "slot {name:?} holds {} values, another slot {}",
                values.len(),
                length.unwrap_or_default()
            )));
        }
        slot.clear();
        slot.extend_from_slice(values);
    }
    Ok(())
}

/// [`check`], and that `range` lies within the buffers.
pub(crate) fn check_range(
    params: &[f32],
    grads: &[f32],
    slots: &mut [&mut Vec<f32>],
    range: &Range<usize>,
) -> Result<(), NnError> {
    check(params, grads, slots)?;
    if range.start > range.end || range.end > params.len() {
        return Err(NnError::InvalidConfig {
            layer: "optimizer".into(),
            why: format!(
                "values {}..{} of a buffer of {}",
                range.start,
                range.end,
                params.len()
            ),
        });
    }
    Ok(())
}

pub(crate) fn check(
    params: &[f32],
    grads: &[f32],
    slots: &mut [&mut Vec<f32>],
) -> Result<(), NnError> {
    if params.len() != grads.len() {
        return Err(NnError::Length {
            what: "parameters and gradients",
            left: params.len(),
            right: grads.len(),
        });
    }
    for slot in slots {
        if slot.is_empty() {
            slot.resize(params.len(), 0.0);
        } else if slot.len() != params.len() {
            return Err(NnError::Length {
                what: "optimizer slots and parameters",
                left: slot.len(),
                right: params.len(),
            });
        }
    }
    Ok(())
}

/// Keras' `SGD`: plain, with momentum, or Nesterov momentum.
///
/// ```
/// use lockstep_nn::{Optimizer, Sgd};
///
/// let mut sgd = Sgd::new(0.1);
/// let mut params = [1.0_f32, 2.0];
/// sgd.apply(&mut params, &[1.0, -1.0])?;
/// assert_eq!(params, [0.9, 2.1]);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Sgd {
    /// Step size (Keras default 0.01).
    pub learning_rate: f32,
    /// Momentum factor; 0 for plain SGD.
    pub momentum: f32,
    /// Use Nesterov momentum.
    pub nesterov: bool,
    /// A per-step schedule of the step size (then `learning_rate` is unused).
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    pub clipping: GradientClipping,
    velocity: Vec<f32>,
    iterations: u64,
}

impl Sgd {
    /// Plain SGD with this learning rate.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            momentum: 0.0,
            nesterov: false,
            schedule: None,
            clipping: GradientClipping::default(),
            velocity: Vec::new(),
            iterations: 0,
        }
    }

    /// SGD with momentum, optionally Nesterov.
    pub fn with_momentum(learning_rate: f32, momentum: f32, nesterov: bool) -> Self {
        Self {
            momentum,
            nesterov,
            ..Self::new(learning_rate)
        }
    }
}

impl Default for Sgd {
    fn default() -> Self {
        Self::new(0.01)
    }
}

impl Sgd {
    /// The rule on `range` of the buffers, the step not counted.
    fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        let (lr, momentum, nesterov) = (self.learning_rate(), self.momentum, self.nesterov);
        if momentum == 0.0 {
            check_range(params, grads, &mut [], &range)?;
            params[range.clone()]
                .par_chunks_mut(CHUNK)
                .zip(grads[range].par_chunks(CHUNK))
                .for_each(|(p, g)| {
                    for (p, g) in p.iter_mut().zip(g) {
                        *p -= lr * g;
                    }
                });
        } else {
            check_range(params, grads, &mut [&mut self.velocity], &range)?;
            params[range.clone()]
                .par_chunks_mut(CHUNK)
                .zip(grads[range.clone()].par_chunks(CHUNK))
                .zip(self.velocity[range].par_chunks_mut(CHUNK))
                .for_each(|((p, g), v)| {
                    for ((p, g), v) in p.iter_mut().zip(g).zip(v) {
                        *v = momentum * *v - lr * g;
                        *p += if nesterov { momentum * *v - lr * g } else { *v };
                    }
                });
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    ranged_methods!();

    fn slots(&self) -> Vec<(&'static str, &[f32])> {
        if self.momentum == 0.0 {
            Vec::new()
        } else {
            vec![("momentum", &self.velocity)]
        }
    }

    fn config(&self) -> OptimizerConfig {
        OptimizerConfig::Sgd {
            learning_rate: self.learning_rate,
            momentum: self.momentum,
            nesterov: self.nesterov,
            schedule: self.schedule.clone(),
            clipping: self.clipping,
        }
    }

    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError> {
        if self.momentum == 0.0 {
            restore_slots("SGD", &mut [], slots)?;
        } else {
            restore_slots("SGD", &mut [("momentum", &mut self.velocity)], slots)?;
        }
        self.iterations = iterations;
        Ok(())
    }

    common_methods!("SGD");
}

/// Keras' `Adam` (Keras 3 update rule), with Keras' defaults.
///
/// ```
/// use lockstep_nn::{Adam, Optimizer};
///
/// let mut adam = Adam::default();
/// let mut params = [0.0_f32];
/// adam.apply(&mut params, &[3.0])?;
/// assert!((params[0] + 1e-3).abs() < 1e-6); // the first step moves by the learning rate
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    /// Step size, 1e-3.
    pub learning_rate: f32,
    /// First-moment decay, 0.9.
    pub beta_1: f32,
    /// Second-moment decay, 0.999.
    pub beta_2: f32,
    /// Added to the denominator, 1e-7.
    pub epsilon: f32,
    /// A per-step schedule of the step size (then `learning_rate` is unused).
    pub schedule: Option<LearningRateSchedule>,
    /// Gradient clipping.
    pub clipping: GradientClipping,
    m: Vec<f32>,
    v: Vec<f32>,
    iterations: u64,
}

impl Adam {
    /// Adam with this learning rate and Keras' other defaults.
    pub fn new(learning_rate: f32) -> Self {
        Self {
            learning_rate,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            schedule: None,
            clipping: GradientClipping::default(),
            m: Vec::new(),
            v: Vec::new(),
            iterations: 0,
        }
    }
}

impl Default for Adam {
    fn default() -> Self {
        Self::new(1e-3)
    }
}

impl Adam {
    /// The rule on `range` of the buffers, the step not counted.
    fn update(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        range: Range<usize>,
    ) -> Result<(), NnError> {
        let lr = self.learning_rate();
        let betas = (self.beta_1, self.beta_2, self.epsilon);
        adam_update(
            (params, grads, range),
            (&mut self.m, &mut self.v),
            self.iterations,
            lr,
            betas,
            0.0,
        )
    }
}

impl Optimizer for Adam {
    ranged_methods!();

    fn slots(&self) -> Vec<(&'static str, &[f32])> {
        vec![("m", &self.m), ("v", &self.v)]
    }

    fn config(&self) -> OptimizerConfig {
        OptimizerConfig::Adam {
            learning_rate: self.learning_rate,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            schedule: self.schedule.clone(),
            clipping: self.clipping,
        }
    }

    fn restore(&mut self, iterations: u64, slots: &[(&str, &[f32])]) -> Result<(), NnError> {
        restore_slots("Adam", &mut [("m", &mut self.m), ("v", &mut self.v)], slots)?;
        self.iterations = iterations;
        Ok(())
    }

    common_methods!("Adam");
}

/// One step of Adam (Keras 3's rule) at step count `iterations` with rate `lr`: the slots
/// `(m, v)` are updated and `params` moved; first, when `decay` is not 0, `params −= params ·
/// decay · lr` (`AdamW`'s decoupled weight decay).
pub(crate) fn adam_update(
    (params, grads, range): (&mut [f32], &[f32], Range<usize>),
    (m, v): (&mut Vec<f32>, &mut Vec<f32>),
    iterations: u64,
    lr: f32,
    (b1, b2, eps): (f32, f32, f32),
    decay: f32,
) -> Result<(), NnError> {
    check_range(params, grads, &mut [&mut *m, &mut *v], &range)?;
    let (params, grads) = (&mut params[range.clone()], &grads[range.clone()]);
    let (m, v) = (&mut m[range.clone()], &mut v[range]);
    let t = (iterations + 1) as f64;
    let alpha = (f64::from(lr) * (1.0 - f64::from(b2).powf(t)).sqrt()
        / (1.0 - f64::from(b1).powf(t))) as f32;
    let shrink = decay * lr;
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| {
            // A pass of its own: a branch inside the update's loop keeps it from vectorising
            // (10× the instructions of Adam's update, measured with callgrind).
            if decay != 0.0 {
                for p in p.iter_mut() {
                    *p -= *p * shrink;
                }
            }
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                *m += (g - *m) * (1.0 - b1);
                *v += (g * g - *v) * (1.0 - b2);
                *p -= *m * alpha / (v.sqrt() + eps);
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn momentum_sgd_follows_keras() {
        let mut sgd = Sgd::with_momentum(0.1, 0.9, false);
        let mut p = [1.0_f32];
        sgd.apply(&mut p, &[1.0]).unwrap(); // v = -0.1, p = 0.9
        sgd.apply(&mut p, &[1.0]).unwrap(); // v = -0.19, p = 0.71
        assert!((p[0] - 0.71).abs() < 1e-6);
        let mut nesterov = Sgd::with_momentum(0.1, 0.9, true);
        let mut q = [1.0_f32];
        nesterov.apply(&mut q, &[1.0]).unwrap(); // v = -0.1, p += 0.9·(−0.1) − 0.1
        assert!((q[0] - 0.81).abs() < 1e-6);
    }

    #[test]
    fn adam_minimises_a_quadratic() {
        let mut adam = Adam::new(0.1);
        let mut p = [5.0_f32, -3.0];
        for _ in 0..500 {
            let g = [2.0 * p[0], 2.0 * p[1]];
            adam.apply(&mut p, &g).unwrap();
        }
        assert!(p.iter().all(|v| v.abs() < 1e-2), "{p:?}");
        assert_eq!(adam.iterations(), 500);
    }

    #[test]
    fn a_restored_optimizer_continues_as_the_original_would() {
        let mut original = Adam::new(0.1);
        let mut p = [5.0_f32, -3.0];
        for _ in 0..3 {
            original.apply(&mut p, &[1.0, 2.0]).unwrap();
        }
        let saved: Vec<(&str, Vec<f32>)> = original
            .slots()
            .into_iter()
            .map(|(n, s)| (n, s.to_vec()))
            .collect();
        let view: Vec<(&str, &[f32])> = saved.iter().map(|(n, s)| (*n, s.as_slice())).collect();
        let mut restored = Adam::new(0.1);
        restored.restore(original.iterations(), &view).unwrap();
        let mut q = p;
        original.apply(&mut p, &[0.5, 0.5]).unwrap();
        restored.apply(&mut q, &[0.5, 0.5]).unwrap();
        assert_eq!(p, q);
        let err = Adam::default().restore(1, &view[..1]).unwrap_err();
        assert!(err.to_string().contains("lacks slot"), "{err}");
        let err = Sgd::new(0.1).restore(1, &view).unwrap_err();
        assert!(err.to_string().contains("no slot"), "{err}");
    }

    #[test]
    fn mismatched_buffers_are_errors() {
        let mut adam = Adam::default();
        assert!(adam.apply(&mut [0.0; 3], &[0.0; 2]).is_err());
        adam.apply(&mut [0.0; 3], &[0.0; 3]).unwrap();
        assert!(
            adam.apply(&mut [0.0; 4], &[0.0; 4]).is_err(),
            "slots of another model"
        );
    }

    /// Every built-in optimizer, with the options that add slots.
    fn every_optimizer() -> Vec<Box<dyn Optimizer>> {
        vec![
            Box::new(Sgd::new(0.1)),
            Box::new(Sgd::with_momentum(0.1, 0.9, true)),
            Box::new(Adam::new(0.01)),
            Box::new(AdamW::new(0.01)),
            Box::new(RmsProp::new(0.01).momentum(0.5).centered()),
            Box::new(Adagrad::new(0.1)),
        ]
    }

    #[test]
    fn a_step_applied_range_by_range_gives_the_bits_of_one_applied_whole() {
        let n = 3 * CHUNK + 17;
        let gradient = |step: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7 + step * 13) % 23) as f32 / 23.0 - 0.4)
                .collect()
        };
        let cuts = [0, 5, CHUNK + 3, 2 * CHUNK, n];
        for (mut whole, mut ranged) in every_optimizer().into_iter().zip(every_optimizer()) {
            assert!(ranged.applies_ranges(), "{}", ranged.name());
            let (mut p, mut q) = (vec![0.5_f32; n], vec![0.5_f32; n]);
            for step in 0..3 {
                let g = gradient(step);
                whole.apply(&mut p, &g).unwrap();
                // The ranges in another order than the buffer's, as packs land.
                for pair in cuts.windows(2).rev() {
                    ranged.apply_range(&mut q, &g, pair[0]..pair[1]).unwrap();
                }
                ranged.finish_step();
            }
            assert_eq!(p, q, "{}", whole.name());
            assert_eq!(whole.iterations(), ranged.iterations());
            assert_eq!(whole.slots(), ranged.slots(), "{}", whole.name());
        }
    }

    #[test]
    fn a_range_past_the_buffers_is_an_error() {
        let mut sgd = Sgd::new(0.1);
        let err = sgd.apply_range(&mut [0.0; 3], &[0.0; 3], 2..4).unwrap_err();
        assert!(err.to_string().contains("2..4"), "{err}");
    }

    #[test]
    fn an_update_applied_variable_by_variable_moves_state_and_weights_as_one_applied_whole() {
        use crate::{BatchNormalization, Dense, Sequential};
        let net = Sequential::new(
            &[4],
            vec![
                Box::new(Dense::new(6)),
                Box::new(BatchNormalization::new()),
                Box::new(Dense::new(2)),
            ],
            3,
        )
        .unwrap();
        let mut whole = net.parameters().clone();
        let mut ranged = net.parameters().clone();
        let n = whole.len();
        let g: Vec<f32> = (0..n).map(|i| (i % 11) as f32 / 11.0 - 0.5).collect();
        let (mut a, mut b): (Box<dyn Optimizer>, Box<dyn Optimizer>) = (
            Box::new(Adam::new(0.01).clipnorm(0.5)),
            Box::new(Adam::new(0.01).clipnorm(0.5)),
        );
        apply_update(&mut *a, &mut whole, &mut g.clone(), 0.25).unwrap();
        let mut grads = g.clone();
        for range in ranged.ranges().into_iter().rev() {
            apply_update_range(&mut *b, &mut ranged, &mut grads, range, 0.25).unwrap();
        }
        b.finish_step();
        assert_eq!(whole, ranged);
        // Without clipping, ranges may cut the trainable variables: the same bits again.
        let (mut c, mut d): (Box<dyn Optimizer>, Box<dyn Optimizer>) =
            (Box::new(Adam::new(0.01)), Box::new(Adam::new(0.01)));
        let mut whole = net.parameters().clone();
        let mut cut = net.parameters().clone();
        apply_update(&mut *c, &mut whole, &mut g.clone(), 0.25).unwrap();
        let mut grads = g.clone();
        let ranges = cut.ranges();
        // The first Dense's kernel in three pieces, the last first, then the rest whole.
        let kernel = ranges[0].clone();
        for piece in [13..kernel.end, 5..13, 0..5] {
            apply_update_range(&mut *d, &mut cut, &mut grads, piece, 0.25).unwrap();
        }
        apply_update_range(&mut *d, &mut cut, &mut grads, kernel.end..n, 0.25).unwrap();
        d.finish_step();
        assert_eq!(whole, cut);
        // A moving average cut, or one past the buffers, is refused.
        let state = ranges[4].clone();
        let err =
            apply_update_range(&mut *d, &mut cut, &mut grads, state.start + 1..n, 1.0).unwrap_err();
        assert!(err.to_string().contains("whole variables"), "{err}");
        assert!(apply_update_range(&mut *d, &mut cut, &mut grads, 0..n + 1, 1.0).is_err());
        // A range that cuts a clipped variable, and a clipping across all of them, are refused.
        let err = apply_update_range(&mut *b, &mut ranged, &mut grads, 1..3, 1.0).unwrap_err();
        assert!(err.to_string().contains("whole variables"), "{err}");
        let mut global = Adam::new(0.01).global_clipnorm(1.0);
        let err = apply_update_range(&mut global, &mut ranged, &mut grads, 0..n, 1.0).unwrap_err();
        assert!(err.to_string().contains("global_clipnorm"), "{err}");
    }
}
