//! The one error type of the crate.

use lockstep_tensor::TensorError;

/// What went wrong building or running a model; variants name the layer at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NnError {
    /// A layer's settings are impossible (0 units, a dropout rate of 2, …).
    #[error("layer {layer}: {why}")]
    InvalidConfig {
        /// The layer's name.
        layer: String,
        /// What is wrong.
        why: String,
    },
    /// Data of the wrong shape reached a model or layer.
    #[error("{what}: expected shape {expected}, got {got:?}")]
    Shape {
        /// Which input.
        what: String,
        /// The expected shape, as text (`(None, 784)`).
        expected: String,
        /// The shape received.
        got: Vec<usize>,
    },
    /// Buffers of different sizes (gradients for another model, labels for another batch).
    #[error("{what}: {left} and {right} values do not match")]
    Length {
        /// What was being combined.
        what: &'static str,
        /// The first length.
        left: usize,
        /// The second length.
        right: usize,
    },
    /// A tensor operation failed inside a layer.
    #[error("layer {layer}: {source}")]
    Tensor {
        /// The layer's name.
        layer: String,
        /// The operation's error.
        #[source]
        source: TensorError,
    },
}

/// Attaches a layer's name to tensor errors.
pub(crate) trait InLayer<T> {
    fn in_layer(self, layer: &str) -> Result<T, NnError>;
}

impl<T> InLayer<T> for Result<T, TensorError> {
    fn in_layer(self, layer: &str) -> Result<T, NnError> {
        self.map_err(|source| NnError::Tensor {
            layer: layer.to_owned(),
            source,
        })
    }
}

/// The number of values of `shape`, or [`NnError::InvalidConfig`] naming `layer` when the
/// count overflows `usize` (as `lockstep_tensor::element_count` counts it).
pub(crate) fn count_values(layer: &str, shape: &[usize]) -> Result<usize, NnError> {
    lockstep_tensor::element_count(shape).ok_or_else(|| NnError::InvalidConfig {
        layer: layer.into(),
        why: format!("shape {shape:?} has more values than a usize can count"),
    })
}
