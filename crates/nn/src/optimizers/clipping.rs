//! Gradient clipping as Keras' optimizers do it (`clipnorm`, `clipvalue`, `global_clipnorm`),
//! applied to the all-reduced gradient before the update, so every replica clips alike.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::NnError;

/// How gradients are clipped before an update: at most one of the three, as in Keras.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradientClipping {
    /// Each variable's gradient scaled down to this L2 norm at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clipnorm: Option<f32>,
    /// Each gradient value limited to `±clipvalue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clipvalue: Option<f32>,
    /// All gradients scaled together down to this L2 norm at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_clipnorm: Option<f32>,
}

impl GradientClipping {
    /// Whether nothing is clipped.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Whether each variable's gradient is clipped on its own (all but `global_clipnorm`), so
    /// that a step's variables can be clipped and updated a few at a time.
    pub fn is_per_variable(&self) -> bool {
        self.global_clipnorm.is_none()
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`] when more than one is set, or one is not positive.
    pub fn validate(&self) -> Result<(), NnError> {
        let set: Vec<f32> = [self.clipnorm, self.clipvalue, self.global_clipnorm]
            .into_iter()
            .flatten()
            .collect();
        let why = if set.len() > 1 {
            "only one of clipnorm, clipvalue and global_clipnorm can be set"
        } else if set.iter().any(|v| !(*v > 0.0 && v.is_finite())) {
            "a clipping bound must be positive"
        } else {
            return Ok(());
        };
        Err(NnError::InvalidConfig {
            layer: "optimizer".to_owned(),
            why: why.to_owned(),
        })
    }

    /// Clips `grads` in place; `variables` are the variables' ranges in the flat buffer (for
    /// `clipnorm`, which scales each variable's gradient on its own).
    pub fn apply(&self, grads: &mut [f32], variables: &[Range<usize>]) {
        let norm = |values: &[f32]| -> f64 {
            values
                .iter()
                .map(|&g| f64::from(g) * f64::from(g))
                .sum::<f64>()
                .sqrt()
        };
        // Keras: g · bound / max(norm, bound), which leaves a gradient within the bound alone.
        let scale = |values: &mut [f32], norm: f64, bound: f32| {
            if norm > f64::from(bound) {
                let factor = (f64::from(bound) / norm) as f32;
                for g in values {
                    *g *= factor;
                }
            }
        };
        if let Some(bound) = self.clipvalue {
            for g in grads.iter_mut() {
                *g = g.clamp(-bound, bound);
            }
        }
        if let Some(bound) = self.clipnorm {
            for range in variables {
                if let Some(values) = grads.get_mut(range.clone()) {
                    let n = norm(values);
                    scale(values, n, bound);
                }
            }
        }
        if let Some(bound) = self.global_clipnorm {
            let n = norm(grads);
            scale(grads, n, bound);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_clipping_bounds_what_keras_bounds() {
        let variables = [0..2, 2..4];
        let mut g = [3.0_f32, 4.0, 0.3, 0.4];
        GradientClipping {
            clipnorm: Some(1.0),
            ..Default::default()
        }
        .apply(&mut g, &variables);
        assert_eq!(g, [0.6, 0.8, 0.3, 0.4]);
        let mut g = [3.0_f32, 4.0, 0.0, 0.0];
        GradientClipping {
            global_clipnorm: Some(2.5),
            ..Default::default()
        }
        .apply(&mut g, &variables);
        assert_eq!(g, [1.5, 2.0, 0.0, 0.0]);
        let mut g = [3.0_f32, -4.0, 0.1, 0.0];
        GradientClipping {
            clipvalue: Some(0.5),
            ..Default::default()
        }
        .apply(&mut g, &variables);
        assert_eq!(g, [0.5, -0.5, 0.1, 0.0]);
    }

    #[test]
    fn two_kinds_at_once_or_a_bound_of_zero_are_errors() {
        let two = GradientClipping {
            clipnorm: Some(1.0),
            clipvalue: Some(1.0),
            ..Default::default()
        };
        assert!(two.validate().is_err());
        let zero = GradientClipping {
            global_clipnorm: Some(0.0),
            ..Default::default()
        };
        assert!(zero.validate().is_err());
        assert!(GradientClipping::default().validate().is_ok());
    }
}
