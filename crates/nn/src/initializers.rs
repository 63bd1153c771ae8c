//! Initial values of variables, as Keras chooses them by default.

use rand_core::Rng;

/// How a variable's initial values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Initializer {
    /// Keras' default for kernels: uniform in `±√(6 / (fan_in + fan_out))`.
    #[default]
    GlorotUniform,
    /// Keras' default for biases.
    Zeros,
}

impl Initializer {
    /// Draws values for a variable of `shape`. Fans follow Keras: the last axis is `fan_out`,
    /// the one before `fan_in`, both times the product of any leading (receptive field) axes.
    pub fn sample(self, shape: &[usize], rng: &mut impl Rng) -> Vec<f32> {
        let n: usize = shape.iter().product();
        match self {
            Self::Zeros => vec![0.0; n],
            Self::GlorotUniform => {
                let (fan_in, fan_out) = fans(shape);
                let limit = (6.0 / fan_in.saturating_add(fan_out).max(1) as f64).sqrt() as f32;
                (0..n).map(|_| (uniform(rng) * 2.0 - 1.0) * limit).collect()
            }
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

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    use super::*;

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
}
