//! `Sequential`: layers in a row, built from an input shape: the chain case of a
//! [`Network`], which it derefs to.

use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};

use crate::error::NnError;
use crate::layers::{Layer, LayerConfig};
use crate::network::{Kind, Network, Planned, Source};

/// Keras' `Sequential` model: each layer feeds the next.
///
/// Building infers every layer's output shape from the input shape and initialises variables
/// from `seed`, so the same seed gives the same model, bit for bit.
///
/// ```
/// use lockstep_nn::{Activation, Conv2D, Dense, Flatten, MaxPooling2D, Sequential};
///
/// let model = Sequential::new(&[28, 28, 1], vec![
///     Box::new(Conv2D::new(32, (3, 3)).activation(Activation::Relu)),
///     Box::new(MaxPooling2D::new((2, 2))),
///     Box::new(Flatten),
///     Box::new(Dense::new(10)),
/// ], 42)?;
/// assert_eq!(model.output_shape(), [10]);
/// assert_eq!(model.parameters().len(), 3 * 3 * 32 + 32 + 13 * 13 * 32 * 10 + 10);
/// println!("{}", model.summary());
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
pub struct Sequential {
    network: Network,
}

/// What rebuilds a [`Sequential`]: the input shape and each layer's settings (Keras'
/// `model.get_config()`), serialisable to JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequentialConfig {
    /// The shape of one example.
    pub input_shape: Vec<usize>,
    /// The layers, in order.
    pub layers: Vec<LayerConfig>,
}

impl Sequential {
    /// Builds the model for examples of `input_shape` (batch axis excluded). Layers are named as
    /// Keras names them: `dense`, `dense_1`, `conv2d`, …
    ///
    /// # Errors
    ///
    /// When a layer cannot take its input's shape or its settings are impossible.
    pub fn new(
        input_shape: &[usize],
        layers: Vec<Box<dyn Layer>>,
        seed: u64,
    ) -> Result<Self, NnError> {
        let count = layers.len();
        let planned = layers
            .into_iter()
            .enumerate()
            .map(|(i, layer)| Planned {
                name: None,
                layer,
                inputs: vec![if i == 0 {
                    Source::Input(0)
                } else {
                    Source::Node(i - 1)
                }],
            })
            .collect();
        let output = if count == 0 {
            Source::Input(0)
        } else {
            Source::Node(count - 1)
        };
        let network = Network::build(
            Kind::Sequential,
            vec![("input_layer".to_owned(), input_shape.to_vec())],
            planned,
            vec![output],
            seed,
        )?;
        Ok(Self { network })
    }

    /// The model with its passes on `device` ([`Network::to_device`]).
    ///
    /// # Errors
    ///
    /// As [`Network::to_device`]: the model is handed back with the reason.
    #[allow(
        clippy::result_large_err,
        reason = "the model is handed back on failure, as the caller's fallback"
    )]
    pub fn to_device(self, device: lockstep_tensor::Device) -> Result<Self, (Self, NnError)> {
        self.network
            .to_device(device)
            .map(|network| Self { network })
            .map_err(|(network, e)| (Self { network }, e))
    }

    /// The settings that rebuild this model with [`Sequential::from_config`].
    pub fn config(&self) -> SequentialConfig {
        SequentialConfig {
            input_shape: self.network.input_shape().to_vec(),
            layers: self.network.layers().map(|(_, l, _)| l.config()).collect(),
        }
    }

    /// Builds the model `config` describes, with variables initialised from `seed` (load
    /// saved weights into them to restore a model).
    ///
    /// ```
    /// use lockstep_nn::{Sequential, models};
    ///
    /// let model = models::mnist_cnn(1)?;
    /// let again = Sequential::from_config(&model.config(), 1)?;
    /// assert_eq!(again.parameters(), model.parameters());
    /// # Ok::<(), lockstep_nn::NnError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Sequential::new`].
    pub fn from_config(config: &SequentialConfig, seed: u64) -> Result<Self, NnError> {
        let layers = config
            .layers
            .iter()
            .map(LayerConfig::build)
            .collect::<Result<_, _>>()?;
        Self::new(&config.input_shape, layers, seed)
    }

    /// The network this model is.
    pub fn into_network(self) -> Network {
        self.network
    }
}

impl Deref for Sequential {
    type Target = Network;

    fn deref(&self) -> &Network {
        &self.network
    }
}

impl DerefMut for Sequential {
    fn deref_mut(&mut self) -> &mut Network {
        &mut self.network
    }
}

impl From<Sequential> for Network {
    fn from(model: Sequential) -> Self {
        model.network
    }
}
