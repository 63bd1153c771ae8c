//! Layer configurations: what rebuilds a layer, as Keras' `get_config`/`from_config`, in a
//! form that serialises to JSON for whole-model saves.

use serde::{Deserialize, Serialize};

use super::{
    Activation, ActivationLayer, Add, Concatenate, Conv2D, Dense, Dropout, Flatten, Layer,
    MaxPooling2D, Multiply, Reshape,
};
use lockstep_tensor::ops::Padding;

/// One layer's settings, tagged with its Keras class name.
///
/// ```
/// use lockstep_nn::{Activation, Dense, Layer, LayerConfig};
///
/// let config = Dense::new(10).activation(Activation::Relu).config();
/// let json = serde_json::to_string(&config).unwrap();
/// assert_eq!(json, r#"{"class_name":"Dense","config":{"units":10,"activation":"relu","use_bias":true}}"#);
/// assert_eq!(serde_json::from_str::<LayerConfig>(&json).unwrap().build().config(), config);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
pub enum LayerConfig {
    /// [`Dense`].
    Dense {
        /// Output features.
        units: usize,
        /// Applied to the output.
        activation: ActivationName,
        /// Whether the layer adds a bias.
        use_bias: bool,
    },
    /// [`Conv2D`].
    Conv2D {
        /// Output channels.
        filters: usize,
        /// Window height and width.
        kernel_size: (usize, usize),
        /// Steps between windows.
        strides: (usize, usize),
        /// `valid` or `same`.
        padding: PaddingName,
        /// Applied to the output.
        activation: ActivationName,
        /// Whether the layer adds a bias.
        use_bias: bool,
    },
    /// [`MaxPooling2D`].
    MaxPooling2D {
        /// Window height and width.
        pool_size: (usize, usize),
        /// Steps between windows (the pool size when absent).
        strides: Option<(usize, usize)>,
        /// `valid` or `same`.
        padding: PaddingName,
    },
    /// [`Flatten`].
    Flatten,
    /// [`Reshape`].
    Reshape {
        /// The output shape of one example.
        target_shape: Vec<usize>,
    },
    /// [`Dropout`].
    Dropout {
        /// Fraction of values dropped in training.
        rate: f32,
        /// Seed of the masks.
        seed: u64,
    },
    /// [`ActivationLayer`].
    Activation {
        /// The function.
        activation: ActivationName,
    },
    /// [`Add`].
    Add,
    /// [`Multiply`].
    Multiply,
    /// [`Concatenate`] (along the last axis).
    Concatenate,
}

/// An activation by its Keras name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationName {
    /// The identity.
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// Softmax over the last axis.
    Softmax,
}

impl From<Activation> for ActivationName {
    fn from(activation: Activation) -> Self {
        match activation {
            Activation::Linear => Self::Linear,
            Activation::Relu => Self::Relu,
            Activation::Softmax => Self::Softmax,
        }
    }
}

impl From<ActivationName> for Activation {
    fn from(name: ActivationName) -> Self {
        match name {
            ActivationName::Linear => Self::Linear,
            ActivationName::Relu => Self::Relu,
            ActivationName::Softmax => Self::Softmax,
        }
    }
}

/// A padding by its Keras name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PaddingName {
    /// Windows entirely inside the input.
    Valid,
    /// Zero padding keeps `⌈in / stride⌉`.
    Same,
}

impl From<Padding> for PaddingName {
    fn from(padding: Padding) -> Self {
        match padding {
            Padding::Valid => Self::Valid,
            Padding::Same => Self::Same,
        }
    }
}

impl From<PaddingName> for Padding {
    fn from(name: PaddingName) -> Self {
        match name {
            PaddingName::Valid => Self::Valid,
            PaddingName::Same => Self::Same,
        }
    }
}

impl LayerConfig {
    /// A fresh layer with these settings (its variables are made when a model is built).
    pub fn build(&self) -> Box<dyn Layer> {
        match self.clone() {
            Self::Dense {
                units,
                activation,
                use_bias,
            } => {
                let dense = Dense::new(units).activation(activation.into());
                Box::new(if use_bias {
                    dense
                } else {
                    dense.without_bias()
                })
            }
            Self::Conv2D {
                filters,
                kernel_size,
                strides,
                padding,
                activation,
                use_bias,
            } => {
                let conv = Conv2D::new(filters, kernel_size)
                    .strides(strides)
                    .padding(padding.into())
                    .activation(activation.into());
                Box::new(if use_bias { conv } else { conv.without_bias() })
            }
            Self::MaxPooling2D {
                pool_size,
                strides,
                padding,
            } => {
                let pool = MaxPooling2D::new(pool_size).padding(padding.into());
                Box::new(match strides {
                    Some(strides) => pool.strides(strides),
                    None => pool,
                })
            }
            Self::Flatten => Box::new(Flatten),
            Self::Reshape { target_shape } => Box::new(Reshape::new(&target_shape)),
            Self::Dropout { rate, seed } => Box::new(Dropout::new(rate, seed)),
            Self::Activation { activation } => Box::new(ActivationLayer(activation.into())),
            Self::Add => Box::new(Add),
            Self::Multiply => Box::new(Multiply),
            Self::Concatenate => Box::new(Concatenate),
        }
    }
}
