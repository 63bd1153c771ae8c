//! Keras' `Embedding`: a trainable table of vectors, one per id, looked up by the input.

use lockstep_tensor::{Tensor, ops};

use super::config::{BuiltinLayerConfig, LayerConfig};
use super::{ForwardContext, Layer};
use crate::error::{InLayer, NnError, count_values};
use crate::initializers::Initializer;
use crate::params::ParamBuilder;

/// Keras' `Embedding`: `(None, …) → (None, …, output_dim)`, each input value an id in
/// `0..input_dim` (held as a whole `f32`, as the batch's tensor holds it, so `input_dim` is at
/// most [`Embedding::MAX_IDS`]) replaced by its row of a trainable `[input_dim, output_dim]`
/// table, drawn uniform in ±0.05 as Keras' default. The gradient reaches only the rows the
/// batch looked up. Runs on the CPU.
///
/// ```
/// use lockstep_nn::{Embedding, Input, LayerCall, Network};
/// use lockstep_tensor::Tensor;
///
/// let ids = Input::new(&[3]);
/// let vectors = Embedding::new(100, 8).call(&ids)?;
/// let model = Network::new(&[&ids], &[&vectors], 0)?;
/// let out = model.predict(&Tensor::from_vec(vec![4.0, 99.0, 4.0], &[1, 3])?)?;
/// assert_eq!(out.shape(), [1, 3, 8]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Embedding {
    input_dim: usize,
    output_dim: usize,
    initializer: Initializer,
}

impl Embedding {
    /// The most ids a table can have: an id is a whole `f32`, exact up to 2^24.
    pub const MAX_IDS: usize = 1 << 24;

    /// A table of `input_dim` ids (`0..input_dim`) by `output_dim` values.
    pub fn new(input_dim: usize, output_dim: usize) -> Self {
        Self {
            input_dim,
            output_dim,
            initializer: Initializer::RandomUniform {
                minval: -0.05,
                maxval: 0.05,
            },
        }
    }

    /// The ids `values` hold for a table of `input_dim` rows: each a whole number in
    /// `0..input_dim`, held as an `f32`; the first value that is not is the error.
    ///
    /// # Errors
    ///
    /// The first value that is negative, fractional, not a number, or not below `input_dim`.
    pub fn ids(values: &[f32], input_dim: usize) -> Result<Vec<usize>, f32> {
        values
            .iter()
            .map(|&v| {
                if v >= 0.0 && v.fract() == 0.0 && (v as usize) < input_dim {
                    Ok(v as usize)
                } else {
                    Err(v)
                }
            })
            .collect()
    }

    /// Sets how the table's initial values are drawn (Keras' `embeddings_initializer`).
    #[must_use]
    pub fn embeddings_initializer(mut self, initializer: Initializer) -> Self {
        self.initializer = initializer;
        self
    }
}

impl Layer for Embedding {
    fn config(&self) -> LayerConfig {
        BuiltinLayerConfig::Embedding {
            input_dim: self.input_dim,
            output_dim: self.output_dim,
            embeddings_initializer: self.initializer,
        }
        .into()
    }

    fn kind(&self) -> &'static str {
        "Embedding"
    }

    fn stem(&self) -> &'static str {
        "embedding"
    }

    fn looks_up_rows(&self) -> bool {
        true
    }

    fn build(
        &mut self,
        name: &str,
        input_shape: &[usize],
        params: &mut ParamBuilder,
    ) -> Result<Vec<usize>, NnError> {
        if self.input_dim == 0 || self.output_dim == 0 {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: "input_dim and output_dim must be at least 1".into(),
            });
        }
        if self.input_dim > Self::MAX_IDS {
            return Err(NnError::InvalidConfig {
                layer: name.into(),
                why: format!(
                    "input_dim {} is past {}: ids are held as the batch's f32 values, \
                     whole numbers exact only up to 2^24, so larger ids would pick \
                     neighbouring rows",
                    self.input_dim,
                    Self::MAX_IDS
                ),
            });
        }
        params.add(
            format!("{name}/embeddings"),
            vec![self.input_dim, self.output_dim],
            self.initializer,
        )?;
        let mut shape = input_shape.to_vec();
        shape.push(self.output_dim);
        count_values(name, &shape)?;
        Ok(shape)
    }

    fn forward(
        &self,
        name: &str,
        x: &Tensor,
        params: &[Tensor],
        _ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let ids = Self::ids(&x.to_vec().in_layer(name)?, self.input_dim).map_err(|v| {
            NnError::InvalidConfig {
                layer: name.into(),
                why: format!("input {v} is not an id below input_dim {}", self.input_dim),
            }
        })?;
        let rows = ops::gather_rows(&params[0], &ids).in_layer(name)?;
        let mut shape = x.shape().to_vec();
        shape.push(self.output_dim);
        ops::reshape(&rows, &shape).in_layer(name)
    }
}
