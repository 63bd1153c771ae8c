//! Initial values of variables, with Keras' initializers, names and defaults.

use rand_core::Rng;
use serde::{Deserialize, Serialize};

/// How a variable's initial values are drawn, by Keras class name (`GlorotUniform`, `HeNormal`,
/// `Constant`, …). The scaled initializers are Keras' `VarianceScaling`: a variance of
/// `scale / n`, with `n` the fan in (He, `LeCun`) or the mean of the fans (Glorot); the normal
/// ones draw from a normal truncated at two standard deviations, widened so that the variance
/// stays `scale / n`, as Keras does.
///
/// ```
/// use lockstep_nn::{Dense, Initializer};
///
/// let layer = Dense::new(64).kernel_initializer(Initializer::HeNormal);
/// let json = serde_json::to_string(&Initializer::Constant { value: 0.1 }).unwrap();
/// assert_eq!(json, r#"{"class_name":"Constant","config":{"value":0.1}}"#);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
#[non_exhaustive]
pub enum Initializer {
    /// Keras' default for kernels: uniform in `±√(6 / (fan_in + fan_out))`.
    #[default]
    GlorotUniform,
    /// Truncated normal of variance `2 / (fan_in + fan_out)`.
    GlorotNormal,
    /// Uniform in `±√(6 / fan_in)`.
    HeUniform,
    /// Truncated normal of variance `2 / fan_in`.
    HeNormal,
    /// Uniform in `±√(3 / fan_in)`.
    LecunUniform,
    /// Truncated normal of variance `1 / fan_in`.
    LecunNormal,
    /// Keras' default for biases.
    Zeros,
    /// Every value 1.
    Ones,
    /// Every value `value`.
    Constant {
        /// The value.
        value: f32,
    },
    /// Normal around `mean` with deviation `stddev`, redrawn beyond two deviations (Keras'
    /// defaults: 0 and 0.05).
    TruncatedNormal {
        /// The mean.
        mean: f32,
        /// The standard deviation before truncation.
        stddev: f32,
    },
    /// Normal around `mean` with deviation `stddev`.
    RandomNormal {
        /// The mean.
        mean: f32,
        /// The standard deviation.
        stddev: f32,
    },
    /// Uniform in `[minval, maxval)`.
    RandomUniform {
        /// The lower bound.
        minval: f32,
        /// The upper bound.
        maxval: f32,
    },
}

/// The standard deviation of a unit normal truncated at ±2: Keras divides by it so that the
/// truncated draw keeps the variance asked for.
const TRUNCATED_UNIT_STDDEV: f64 = 0.879_625_661_034_239_8;

impl Initializer {
    /// Keras' `TruncatedNormal()` with its defaults.
    pub fn truncated_normal() -> Self {
        Self::TruncatedNormal {
            mean: 0.0,
            stddev: 0.05,
        }
    }

    /// Whether this is Keras' default for kernels (a configuration leaves it out).
    pub fn is_glorot_uniform(&self) -> bool {
        *self == Self::GlorotUniform
    }

    /// Whether this is Keras' default for biases (a configuration leaves it out).
    pub fn is_zeros(&self) -> bool {
        *self == Self::Zeros
    }

    /// Draws values for a variable of `shape`. Fans follow Keras: the last axis is `fan_out`,
    /// the one before `fan_in`, both times the product of any leading (receptive field) axes.
    pub fn sample(self, shape: &[usize], rng: &mut impl Rng) -> Vec<f32> {
        let n: usize = shape.iter().product();
        let (fan_in, fan_out) = fans(shape);
        let (fan_in, fan_avg) = (
            fan_in.max(1) as f64,
            (fan_in.saturating_add(fan_out).max(1) as f64) / 2.0,
        );
        // In f32 after the limit, as the first version of this crate drew Glorot's: the
        // models' initial values (and the documented checksums) stay what they were.
        let uniform_within = |limit: f64, rng: &mut _| -> Vec<f32> {
            let limit = limit as f32;
            (0..n).map(|_| (uniform(rng) * 2.0 - 1.0) * limit).collect()
        };
        let truncated = |variance: f64, rng: &mut _| -> Vec<f32> {
            let stddev = variance.sqrt() / TRUNCATED_UNIT_STDDEV;
            (0..n)
                .map(|_| (truncated_unit_normal(rng) * stddev) as f32)
                .collect()
        };
        match self {
            Self::GlorotUniform => {
                let (fan_in, fan_out) = fans(shape);
                uniform_within(
                    (6.0 / fan_in.saturating_add(fan_out).max(1) as f64).sqrt(),
                    rng,
                )
            }
            Self::GlorotNormal => truncated(1.0 / fan_avg, rng),
            Self::HeUniform => uniform_within((6.0 / fan_in).sqrt(), rng),
            Self::HeNormal => truncated(2.0 / fan_in, rng),
            Self::LecunUniform => uniform_within((3.0 / fan_in).sqrt(), rng),
            Self::LecunNormal => truncated(1.0 / fan_in, rng),
            Self::Zeros => vec![0.0; n],
            Self::Ones => vec![1.0; n],
            Self::Constant { value } => vec![value; n],
            Self::TruncatedNormal { mean, stddev } => (0..n)
                .map(|_| (f64::from(mean) + truncated_unit_normal(rng) * f64::from(stddev)) as f32)
                .collect(),
            Self::RandomNormal { mean, stddev } => (0..n)
                .map(|_| (f64::from(mean) + unit_normal(rng) * f64::from(stddev)) as f32)
                .collect(),
            Self::RandomUniform { minval, maxval } => (0..n)
                .map(|_| {
                    let u = f64::from(uniform(rng));
                    (f64::from(minval) + u * (f64::from(maxval) - f64::from(minval))) as f32
                })
                .collect(),
        }
    }
}

fn fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [.., fan_in, fan_out] => {
            // Only the initialisation's scale depends on the fans: saturate rather than fail.
            let receptive = shape[..shape.len() - 2]
                .iter()
                .fold(1_usize, |acc, &d| acc.saturating_mul(d));
            (
                fan_in.saturating_mul(receptive),
                fan_out.saturating_mul(receptive),
            )
        }
    }
}

/// A uniform `f32` in `[0, 1)` from 24 random bits (every value exactly representable).
fn uniform(rng: &mut impl Rng) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / (1 << 24) as f32)
}

/// A unit normal by Box–Muller from two 53-bit uniforms (the first kept away from 0).
fn unit_normal(rng: &mut impl Rng) -> f64 {
    let u = ((rng.next_u64() >> 11) as f64 + 1.0) / (1_u64 << 53) as f64;
    let v = (rng.next_u64() >> 11) as f64 / (1_u64 << 53) as f64;
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A unit normal redrawn until it lies within ±2.
fn truncated_unit_normal(rng: &mut impl Rng) -> f64 {
    loop {
        let z = unit_normal(rng);
        if z.abs() <= 2.0 {
            return z;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    use super::*;

    fn moments(values: &[f32]) -> (f64, f64) {
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var)
    }

    #[test]
    fn glorot_stays_within_its_limit_and_fills_it() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let values = Initializer::GlorotUniform.sample(&[3, 3, 32, 64], &mut rng);
        let limit = (6.0_f32 / (9.0 * 32.0 + 9.0 * 64.0)).sqrt();
        assert!(values.iter().all(|v| v.abs() <= limit));
        assert!(values.iter().any(|v| v.abs() > 0.9 * limit));
        let mean: f32 = values.iter().sum::<f32>() / values.len() as f32;
        assert!(mean.abs() < 0.01 * limit * 10.0);
        assert_eq!(fans(&[784, 256]), (784, 256));
    }

    #[test]
    fn every_scaled_initializer_has_kerass_variance() {
        // fan_in 400, fan_out 100: Keras' variances, within 3% over 40,000 draws.
        let shape = [400, 100];
        let want = [
            (Initializer::GlorotUniform, 2.0_f64 / 500.0),
            (Initializer::GlorotNormal, 2.0 / 500.0),
            (Initializer::HeUniform, 2.0 / 400.0),
            (Initializer::HeNormal, 2.0 / 400.0),
            (Initializer::LecunUniform, 1.0 / 400.0),
            (Initializer::LecunNormal, 1.0 / 400.0),
        ];
        for (init, variance) in want {
            let values = init.sample(&shape, &mut Pcg64Mcg::seed_from_u64(7));
            let (mean, var) = moments(&values);
            assert!(mean.abs() < 0.05 * variance.sqrt(), "{init:?}: mean {mean}");
            assert!(
                (var / variance - 1.0).abs() < 0.03,
                "{init:?}: variance {var}, Keras {variance}"
            );
        }
    }

    #[test]
    fn truncated_normals_stay_within_two_deviations_and_constants_are_constant() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let values = Initializer::truncated_normal().sample(&[10_000], &mut rng);
        assert!(values.iter().all(|v| v.abs() <= 0.1 + 1e-6));
        let (_, var) = moments(&values);
        // A unit normal truncated at ±2 has variance 0.774.
        assert!((var / (0.05 * 0.05 * 0.774) - 1.0).abs() < 0.05, "{var}");
        let he = Initializer::HeNormal.sample(&[100, 10], &mut rng);
        let limit = 2.0 * (2.0_f32 / 100.0).sqrt() / TRUNCATED_UNIT_STDDEV as f32;
        assert!(he.iter().all(|v| v.abs() <= limit * 1.0001));
        assert_eq!(Initializer::Ones.sample(&[3], &mut rng), [1.0; 3]);
        assert_eq!(
            Initializer::Constant { value: 0.5 }.sample(&[2, 2], &mut rng),
            [0.5; 4]
        );
        let uniform = Initializer::RandomUniform {
            minval: -1.0,
            maxval: 3.0,
        }
        .sample(&[1000], &mut rng);
        assert!(uniform.iter().all(|v| (-1.0..3.0).contains(v)));
    }

    #[test]
    fn initializers_serialise_with_kerass_class_names() {
        for init in [
            Initializer::HeNormal,
            Initializer::Zeros,
            Initializer::Constant { value: 0.25 },
            Initializer::truncated_normal(),
        ] {
            let json = serde_json::to_string(&init).unwrap();
            assert_eq!(serde_json::from_str::<Initializer>(&json).unwrap(), init);
        }
        assert_eq!(
            serde_json::to_string(&Initializer::HeNormal).unwrap(),
            r#"{"class_name":"HeNormal"}"#
        );
    }
}
