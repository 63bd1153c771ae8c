//! Keras' functional API: symbolic inputs ([`Input`]), layers called on symbolic tensors
//! ([`LayerCall::call`]), and a [`Network`] built from inputs to outputs, with branches and
//! merges, several inputs and outputs.
//!
//! The Keras guide's `get_compiled_model()` model, line for line:
//!
//! ```
//! use lockstep_nn::{Activation, Dense, Input, LayerCall, Network};
//!
//! let inputs = Input::named(&[784], "digits");
//! let x = Dense::new(64).activation(Activation::Relu).named("dense_1").call(&inputs)?;
//! let x = Dense::new(64).activation(Activation::Relu).named("dense_2").call(&x)?;
//! let outputs = Dense::new(10).activation(Activation::Softmax).named("predictions").call(&x)?;
//! let model = Network::new(&[&inputs], &[&outputs], 0)?;
//! assert_eq!(model.output_shape(), [10]);
//! println!("{}", model.summary());
//! # Ok::<(), lockstep_nn::NnError>(())
//! ```
//!
//! Calling a layer checks its input's shape at once (the layer is built to learn its output
//! shape, without drawing values); [`Network::new`] then builds every layer reachable from
//! the outputs, in the order they were called, and draws the variables from its seed, so a
//! chain of layers gives the same variables as the [`Sequential`](crate::Sequential) model of
//! the same layers. A layer object is called once (`call` takes it): the same layer on two
//! inputs (shared weights) is not supported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::error::NnError;
use crate::layers::{Layer, LayerConfig};
use crate::model::SequentialConfig;
use crate::network::{Kind, Network, Planned, Source};
use crate::params::ParamBuilder;

/// Creation order of symbolic nodes: a node is always created after the nodes it reads, so
/// sorting by it sorts a graph topologically.
static NEXT_NODE: AtomicU64 = AtomicU64::new(0);

/// A tensor of a functional graph: the output of an [`Input`] or of a layer called on other
/// symbolic tensors. Cheap to clone; it holds the graph behind it.
#[derive(Clone)]
pub struct SymbolicTensor {
    node: Arc<SymbolicNode>,
}

struct SymbolicNode {
    id: u64,
    name: Option<String>,
    shape: Vec<usize>,
    kind: NodeKind,
}

enum NodeKind {
    Input,
    Layer {
        /// Taken by the first [`Network::new`] that builds it.
        layer: Mutex<Option<Box<dyn Layer>>>,
        stem: &'static str,
        inputs: Vec<SymbolicTensor>,
    },
}

impl SymbolicTensor {
    /// The shape of one example (batch axis excluded).
    pub fn shape(&self) -> &[usize] {
        &self.node.shape
    }
}

impl std::fmt::Debug for SymbolicTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.node.kind {
            NodeKind::Input => "Input",
            NodeKind::Layer { stem, .. } => stem,
        };
        f.debug_struct("SymbolicTensor")
            .field("of", &what)
            .field("name", &self.node.name)
            .field("shape", &self.node.shape)
            .finish()
    }
}

/// Keras' `keras.Input`: a model's symbolic input.
#[derive(Debug, Clone, Copy)]
pub struct Input;

impl Input {
    /// An input of examples of `shape` (batch axis excluded), named `input_layer`,
    /// `input_layer_1`, … by the model.
    #[allow(
        clippy::new_ret_no_self,
        reason = "Keras' `Input(...)` is a symbolic tensor, not an input object"
    )]
    pub fn new(shape: &[usize]) -> SymbolicTensor {
        Self::make(shape, None)
    }

    /// An input of examples of `shape`, named `name`.
    pub fn named(shape: &[usize], name: &str) -> SymbolicTensor {
        Self::make(shape, Some(name.to_owned()))
    }

    fn make(shape: &[usize], name: Option<String>) -> SymbolicTensor {
        SymbolicTensor {
            node: Arc::new(SymbolicNode {
                id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
                name,
                shape: shape.to_vec(),
                kind: NodeKind::Input,
            }),
        }
    }
}

/// A layer with the name the model gives it (Keras' `name=` argument).
pub struct NamedLayer<L> {
    layer: L,
    name: String,
}

/// Calling a layer on symbolic tensors, as Keras' `layer(x)`: every [`Layer`] has it.
pub trait LayerCall: Sized {
    /// The layer on one input.
    ///
    /// # Errors
    ///
    /// When the layer cannot take the input's shape (named in the error).
    fn call(self, input: &SymbolicTensor) -> Result<SymbolicTensor, NnError> {
        self.call_on(&[input])
    }

    /// The layer on several inputs (a merge layer: [`Add`](crate::Add),
    /// [`Concatenate`](crate::Concatenate), [`Multiply`](crate::Multiply)).
    ///
    /// # Errors
    ///
    /// When the layer cannot take the inputs' shapes (named in the error).
    fn call_on(self, inputs: &[&SymbolicTensor]) -> Result<SymbolicTensor, NnError>;

    /// The layer, named `name` in the model (its variables are `name/kernel`, …).
    fn named(self, name: &str) -> NamedLayer<Self> {
        NamedLayer {
            layer: self,
            name: name.to_owned(),
        }
    }
}

impl<L: Layer + 'static> LayerCall for L {
    fn call_on(self, inputs: &[&SymbolicTensor]) -> Result<SymbolicTensor, NnError> {
        symbolic_call(Box::new(self), None, inputs)
    }
}

impl<L: Layer + 'static> LayerCall for NamedLayer<L> {
    fn call_on(self, inputs: &[&SymbolicTensor]) -> Result<SymbolicTensor, NnError> {
        symbolic_call(Box::new(self.layer), Some(self.name), inputs)
    }
}

fn symbolic_call(
    mut layer: Box<dyn Layer>,
    name: Option<String>,
    inputs: &[&SymbolicTensor],
) -> Result<SymbolicTensor, NnError> {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let label = name.clone().unwrap_or_else(|| layer.stem().to_owned());
    let shape = layer.build_inputs(&label, &shapes, &mut ParamBuilder::shapes_only())?;
    Ok(SymbolicTensor {
        node: Arc::new(SymbolicNode {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            name,
            shape,
            kind: NodeKind::Layer {
                stem: layer.stem(),
                layer: Mutex::new(Some(layer)),
                inputs: inputs.iter().map(|&t| t.clone()).collect(),
            },
        }),
    })
}

/// One input of a [`FunctionalConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputConfig {
    /// The input's name.
    pub name: String,
    /// The shape of one example.
    pub shape: Vec<usize>,
}

/// One layer of a [`FunctionalConfig`]: its settings and what it reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The layer's name in the model.
    pub name: String,
    /// The layer's settings.
    pub layer: LayerConfig,
    /// The names of the inputs and layers it reads, in order (Keras' `inbound_nodes`).
    pub inbound: Vec<String>,
}

/// What rebuilds a functional [`Network`] (Keras' functional `get_config()`): inputs, layers
/// in topological order with what each reads, and the outputs, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionalConfig {
    /// The inputs, in order.
    pub input_layers: Vec<InputConfig>,
    /// The layers, each after those it reads.
    pub layers: Vec<NodeConfig>,
    /// The names of the outputs, in order.
    pub output_layers: Vec<String>,
}

/// What rebuilds any [`Network`]: a `Sequential` model's configuration or a functional one's.
/// Serialised untagged: a `Sequential` configuration saved alone reads back as one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ModelConfig {
    /// A chain of layers.
    Sequential(SequentialConfig),
    /// A graph of layers.
    Functional(FunctionalConfig),
}

impl Network {
    /// Builds the functional model from `inputs` to `outputs` (Keras'
    /// `keras.Model(inputs, outputs)`), with variables initialised from `seed`.
    ///
    /// # Errors
    ///
    /// An output that depends on an input not in `inputs`, an input listed twice, a layer
    /// already built into another model, two layers of one name, or a layer's own error.
    pub fn new(
        inputs: &[&SymbolicTensor],
        outputs: &[&SymbolicTensor],
        seed: u64,
    ) -> Result<Self, NnError> {
        let invalid = |layer: &str, why: String| NnError::InvalidConfig {
            layer: layer.to_owned(),
            why,
        };
        // Every node the outputs depend on, each once.
        let mut reached: Vec<SymbolicTensor> = Vec::new();
        let mut pending: Vec<SymbolicTensor> = outputs.iter().map(|&t| t.clone()).collect();
        while let Some(tensor) = pending.pop() {
            if reached.iter().any(|t| Arc::ptr_eq(&t.node, &tensor.node)) {
                continue;
            }
            if let NodeKind::Layer { inputs, .. } = &tensor.node.kind {
                pending.extend(inputs.iter().cloned());
            }
            reached.push(tensor);
        }
        reached.sort_by_key(|t| t.node.id);
        let input_index = |tensor: &SymbolicTensor| {
            inputs
                .iter()
                .position(|&i| Arc::ptr_eq(&i.node, &tensor.node))
        };
        let mut input_names: Vec<(String, Vec<usize>)> = Vec::with_capacity(inputs.len());
        for (k, input) in inputs.iter().enumerate() {
            if !matches!(input.node.kind, NodeKind::Input) {
                return Err(invalid(
                    "inputs",
                    format!("input {k} is a layer's output, not an Input"),
                ));
            }
            if input_index(input) != Some(k) {
                return Err(invalid("inputs", format!("input {k} is listed twice")));
            }
            let name = input.node.name.clone().unwrap_or_else(|| {
                let unnamed = inputs[..k].iter().filter(|i| i.node.name.is_none()).count();
                if unnamed == 0 {
                    "input_layer".to_owned()
                } else {
                    format!("input_layer_{unnamed}")
                }
            });
            input_names.push((name, input.shape().to_vec()));
        }
        let layer_nodes: Vec<&SymbolicTensor> = reached
            .iter()
            .filter(|t| !matches!(t.node.kind, NodeKind::Input))
            .collect();
        let source_of = |tensor: &SymbolicTensor| -> Result<Source, NnError> {
            if let Some(k) = input_index(tensor) {
                return Ok(Source::Input(k));
            }
            if matches!(tensor.node.kind, NodeKind::Input) {
                return Err(invalid(
                    tensor.node.name.as_deref().unwrap_or("input"),
                    format!(
                        "an output depends on this input of shape {:?}, which is not among the model's inputs",
                        tensor.shape()
                    ),
                ));
            }
            layer_nodes
                .iter()
                .position(|t| Arc::ptr_eq(&t.node, &tensor.node))
                .map(Source::Node)
                .ok_or_else(|| invalid("outputs", "a node outside the graph".to_owned()))
        };
        let mut planned = Vec::with_capacity(layer_nodes.len());
        for tensor in &layer_nodes {
            let NodeKind::Layer {
                layer,
                inputs: reads,
                stem,
            } = &tensor.node.kind
            else {
                continue;
            };
            let layer = layer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .ok_or_else(|| {
                    invalid(
                        tensor.node.name.as_deref().unwrap_or(stem),
                        "this layer is already built into another model (a layer is called \
                         and built once)"
                            .to_owned(),
                    )
                })?;
            planned.push(Planned {
                name: tensor.node.name.clone(),
                layer,
                inputs: reads.iter().map(source_of).collect::<Result<_, _>>()?,
            });
        }
        let outputs = outputs
            .iter()
            .map(|&t| source_of(t))
            .collect::<Result<Vec<_>, _>>()?;
        Network::build(Kind::Functional, input_names, planned, outputs, seed)
    }

    /// The settings that rebuild this model with [`Network::from_config`]: a `Sequential`
    /// model's own configuration, or the graph of a functional one.
    pub fn config(&self) -> ModelConfig {
        if self.kind() == Kind::Sequential {
            return ModelConfig::Sequential(SequentialConfig {
                input_shape: self.input_shape().to_vec(),
                layers: self.layers().map(|(_, l, _)| l.config()).collect(),
            });
        }
        ModelConfig::Functional(FunctionalConfig {
            input_layers: self
                .inputs()
                .iter()
                .map(|(name, shape)| InputConfig {
                    name: name.clone(),
                    shape: shape.clone(),
                })
                .collect(),
            layers: self
                .layers()
                .map(|(name, layer, reads)| NodeConfig {
                    name: name.to_owned(),
                    layer: layer.config(),
                    inbound: reads
                        .iter()
                        .map(|&s| self.source_name(s).to_owned())
                        .collect(),
                })
                .collect(),
            output_layers: self
                .output_sources()
                .iter()
                .map(|&s| self.source_name(s).to_owned())
                .collect(),
        })
    }

    /// Builds the model `config` describes, with variables initialised from `seed` (load
    /// saved weights into them to restore a model).
    ///
    /// # Errors
    ///
    /// A layer that reads a name not defined before it, or a layer's own error.
    pub fn from_config(config: &ModelConfig, seed: u64) -> Result<Self, NnError> {
        let config = match config {
            ModelConfig::Sequential(sequential) => {
                return crate::Sequential::from_config(sequential, seed).map(Network::from);
            }
            ModelConfig::Functional(functional) => functional,
        };
        let inputs: Vec<(String, Vec<usize>)> = config
            .input_layers
            .iter()
            .map(|i| (i.name.clone(), i.shape.clone()))
            .collect();
        let mut defined: Vec<&str> = Vec::new();
        let source = |defined: &[&str], name: &str, reader: &str| -> Result<Source, NnError> {
            if let Some(k) = inputs.iter().position(|(n, _)| n == name) {
                return Ok(Source::Input(k));
            }
            defined
                .iter()
                .position(|d| *d == name)
                .map(Source::Node)
                .ok_or_else(|| NnError::InvalidConfig {
                    layer: reader.to_owned(),
                    why: format!("reads {name:?}, which is no input nor a layer before it"),
                })
        };
        let mut planned = Vec::with_capacity(config.layers.len());
        for node in &config.layers {
            let reads = node
                .inbound
                .iter()
                .map(|name| source(&defined, name, &node.name))
                .collect::<Result<Vec<_>, _>>()?;
            planned.push(Planned {
                name: Some(node.name.clone()),
                layer: node.layer.build()?,
                inputs: reads,
            });
            defined.push(&node.name);
        }
        let outputs = config
            .output_layers
            .iter()
            .map(|name| source(&defined, name, "outputs"))
            .collect::<Result<Vec<_>, _>>()?;
        Network::build(Kind::Functional, inputs, planned, outputs, seed)
    }
}
