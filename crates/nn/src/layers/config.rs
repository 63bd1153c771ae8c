//! Layer configurations: what rebuilds a layer, as Keras' `get_config`/`from_config`, in a
//! form that serialises to JSON for whole-model saves; and the registry of users' layer types,
//! Keras' `register_keras_serializable`/`custom_objects`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use serde::{Deserialize, Serialize};

use super::{
    Activation, ActivationLayer, Add, AveragePooling2D, BatchNormalization, Concatenate, Conv2D,
    Dense, Dropout, Embedding, Flatten, GlobalAveragePooling2D, Layer, LayerNormalization,
    MaxPooling2D, Multiply, Reshape,
};
use crate::error::NnError;
use crate::initializers::Initializer;
use lockstep_tensor::ops::Padding;

/// One layer's settings, tagged with its Keras class name: a built-in layer's, or a user's
/// layer type's, rebuilt through [`register_layer`].
///
/// ```
/// use lockstep_nn::{Activation, Dense, Layer, LayerConfig};
///
/// let config = Dense::new(10).activation(Activation::Relu).config();
/// let json = serde_json::to_string(&config).unwrap();
/// assert_eq!(json, r#"{"class_name":"Dense","config":{"units":10,"activation":"relu","use_bias":true}}"#);
/// assert_eq!(serde_json::from_str::<LayerConfig>(&json).unwrap().build()?.config(), config);
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LayerConfig {
    /// A layer of this crate.
    Builtin(BuiltinLayerConfig),
    /// A layer type of the user's, by the name it was registered under.
    Custom(CustomLayerConfig),
}

/// A user's layer's settings: its registered class name and whatever its configuration holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomLayerConfig {
    /// The name the type was registered under ([`register_layer`]).
    pub class_name: String,
    /// The layer's own settings.
    pub config: serde_json::Value,
}

/// A built-in layer's settings, tagged with its Keras class name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class_name", content = "config", deny_unknown_fields)]
pub enum BuiltinLayerConfig {
    /// [`Dense`].
    Dense {
        /// Output features.
        units: usize,
        /// Applied to the output.
        activation: ActivationName,
        /// Whether the layer adds a bias.
        use_bias: bool,
        /// How the kernel is initialised (left out when Glorot-uniform).
        #[serde(default, skip_serializing_if = "Initializer::is_glorot_uniform")]
        kernel_initializer: Initializer,
        /// How the bias is initialised (left out when zeros).
        #[serde(default = "zeros", skip_serializing_if = "Initializer::is_zeros")]
        bias_initializer: Initializer,
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
        /// How the kernel is initialised (left out when Glorot-uniform).
        #[serde(default, skip_serializing_if = "Initializer::is_glorot_uniform")]
        kernel_initializer: Initializer,
        /// How the bias is initialised (left out when zeros).
        #[serde(default = "zeros", skip_serializing_if = "Initializer::is_zeros")]
        bias_initializer: Initializer,
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
    /// [`LayerNormalization`] (over the last axis).
    LayerNormalization {
        /// Added to the variance.
        epsilon: f32,
    },
    /// [`GlobalAveragePooling2D`].
    GlobalAveragePooling2D,
    /// [`AveragePooling2D`].
    AveragePooling2D {
        /// Window height and width.
        pool_size: (usize, usize),
        /// Steps between windows (the pool size when absent).
        strides: Option<(usize, usize)>,
        /// `valid` or `same`.
        padding: PaddingName,
    },
    /// [`BatchNormalization`] (over the last axis).
    BatchNormalization {
        /// The weight of the old moving statistics in each update.
        momentum: f32,
        /// Added to the variance.
        epsilon: f32,
        /// Whether a learned offset is added.
        center: bool,
        /// Whether a learned scale multiplies.
        scale: bool,
        /// Batch statistics over every replica in training.
        #[serde(default)]
        synchronized: bool,
    },
    /// [`Embedding`].
    Embedding {
        /// Ids in the table.
        input_dim: usize,
        /// Values per id.
        output_dim: usize,
        /// How the table is initialised.
        embeddings_initializer: Initializer,
    },
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
    /// The logistic function.
    Sigmoid,
}

impl From<Activation> for ActivationName {
    fn from(activation: Activation) -> Self {
        match activation {
            Activation::Linear => Self::Linear,
            Activation::Relu => Self::Relu,
            Activation::Softmax => Self::Softmax,
            Activation::Sigmoid => Self::Sigmoid,
        }
    }
}

impl From<ActivationName> for Activation {
    fn from(name: ActivationName) -> Self {
        match name {
            ActivationName::Linear => Self::Linear,
            ActivationName::Relu => Self::Relu,
            ActivationName::Softmax => Self::Softmax,
            ActivationName::Sigmoid => Self::Sigmoid,
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

impl BuiltinLayerConfig {
    /// A fresh layer with these settings (its variables are made when a model is built).
    pub fn build(&self) -> Box<dyn Layer> {
        match self.clone() {
            Self::Dense {
                units,
                activation,
                use_bias,
                kernel_initializer,
                bias_initializer,
            } => {
                let dense = Dense::new(units)
                    .activation(activation.into())
                    .kernel_initializer(kernel_initializer)
                    .bias_initializer(bias_initializer);
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
                kernel_initializer,
                bias_initializer,
            } => {
                let conv = Conv2D::new(filters, kernel_size)
                    .strides(strides)
                    .padding(padding.into())
                    .activation(activation.into())
                    .kernel_initializer(kernel_initializer)
                    .bias_initializer(bias_initializer);
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
            Self::LayerNormalization { epsilon } => {
                Box::new(LayerNormalization::new().epsilon(epsilon))
            }
            Self::GlobalAveragePooling2D => Box::new(GlobalAveragePooling2D),
            Self::AveragePooling2D {
                pool_size,
                strides,
                padding,
            } => {
                let pool = AveragePooling2D::new(pool_size).padding(padding.into());
                Box::new(match strides {
                    Some(strides) => pool.strides(strides),
                    None => pool,
                })
            }
            Self::BatchNormalization {
                momentum,
                epsilon,
                center,
                scale,
                synchronized,
            } => Box::new(
                BatchNormalization::new()
                    .momentum(momentum)
                    .epsilon(epsilon)
                    .center(center)
                    .scale(scale)
                    .synchronized(synchronized),
            ),
            Self::Embedding {
                input_dim,
                output_dim,
                embeddings_initializer,
            } => Box::new(
                Embedding::new(input_dim, output_dim)
                    .embeddings_initializer(embeddings_initializer),
            ),
        }
    }
}

/// Keras' default bias initializer, for configurations saved without one.
fn zeros() -> Initializer {
    Initializer::Zeros
}

impl From<BuiltinLayerConfig> for LayerConfig {
    fn from(config: BuiltinLayerConfig) -> Self {
        Self::Builtin(config)
    }
}

/// What makes a user's layer from its saved configuration.
pub type LayerFactory = dyn Fn(&serde_json::Value) -> Result<Box<dyn Layer>, NnError> + Send + Sync;

/// Users' layer types by class name.
static REGISTRY: LazyLock<RwLock<HashMap<String, Arc<LayerFactory>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The class names of the built-in layers, which a user's type cannot take.
const BUILTIN: &[&str] = &[
    "Dense",
    "Conv2D",
    "MaxPooling2D",
    "Flatten",
    "Reshape",
    "Dropout",
    "Activation",
    "Add",
    "Multiply",
    "Concatenate",
    "LayerNormalization",
    "GlobalAveragePooling2D",
    "AveragePooling2D",
    "BatchNormalization",
    "Embedding",
];

/// Registers a user's layer type under `class_name` (what its [`Layer::config`] returns in
/// [`LayerConfig::custom`]), so that models holding it load: Keras'
/// `register_keras_serializable`. Registering a name again replaces its factory.
///
/// ```
/// use lockstep_nn::{LayerConfig, register_layer, Flatten};
///
/// register_layer("MyFlatten", |_config| Ok(Box::new(Flatten)))?;
/// let config = LayerConfig::custom("MyFlatten", &serde_json::json!({}))?;
/// assert_eq!(config.build()?.kind(), "Flatten");
/// # Ok::<(), lockstep_nn::NnError>(())
/// ```
///
/// # Errors
///
/// [`NnError::InvalidConfig`] for the name of a built-in layer.
pub fn register_layer(
    class_name: &str,
    factory: impl Fn(&serde_json::Value) -> Result<Box<dyn Layer>, NnError> + Send + Sync + 'static,
) -> Result<(), NnError> {
    if BUILTIN.contains(&class_name) {
        return Err(NnError::InvalidConfig {
            layer: class_name.to_owned(),
            why: "a built-in layer has this class name".to_owned(),
        });
    }
    REGISTRY
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(class_name.to_owned(), Arc::new(factory));
    Ok(())
}

impl LayerConfig {
    /// A user's layer's configuration: its class name and its settings as JSON (what the
    /// factory given to [`register_layer`] reads back).
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`] when the settings do not serialise to JSON.
    pub fn custom(class_name: &str, settings: &impl Serialize) -> Result<Self, NnError> {
        let config = serde_json::to_value(settings).map_err(|e| NnError::InvalidConfig {
            layer: class_name.to_owned(),
            why: format!("its settings do not serialise: {e}"),
        })?;
        Ok(Self::Custom(CustomLayerConfig {
            class_name: class_name.to_owned(),
            config,
        }))
    }

    /// The layer's Keras class name.
    pub fn class_name(&self) -> String {
        match self {
            Self::Builtin(builtin) => serde_json::to_value(builtin)
                .ok()
                .and_then(|v| v.get("class_name")?.as_str().map(str::to_owned))
                .unwrap_or_default(),
            Self::Custom(custom) => custom.class_name.clone(),
        }
    }

    /// A fresh layer with these settings (its variables are made when a model is built): a
    /// built-in layer, or a user's through the factory registered for its class name.
    ///
    /// # Errors
    ///
    /// [`NnError::InvalidConfig`] naming a class that is not registered, or a built-in
    /// layer's configuration that does not parse; the factory's own error.
    pub fn build(&self) -> Result<Box<dyn Layer>, NnError> {
        let custom = match self {
            Self::Builtin(builtin) => return Ok(builtin.build()),
            Self::Custom(custom) => custom,
        };
        let name = custom.class_name.as_str();
        if BUILTIN.contains(&name) {
            // Not read as the built-in: say why.
            let value = serde_json::json!({ "class_name": name, "config": custom.config });
            let why = match serde_json::from_value::<BuiltinLayerConfig>(value) {
                Ok(builtin) => return Ok(builtin.build()),
                Err(e) => e.to_string(),
            };
            return Err(NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!("its saved configuration does not parse: {why}"),
            });
        }
        let factory = REGISTRY
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| NnError::InvalidConfig {
                layer: name.to_owned(),
                why: format!(
                    "unknown layer type {name:?}: register it with lockstep_nn::register_layer \
                     before loading the model"
                ),
            })?;
        factory(&custom.config)
    }
}
