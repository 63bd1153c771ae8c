//! `Network`: layers in a directed acyclic graph from inputs to outputs, built from input
//! shapes, with every variable in one buffer. A [`Sequential`](crate::Sequential) model is
//! the chain case; a functional model ([`crate::functional`]) any graph.
//!
//! Nodes are kept in a topological order (each node after the nodes it reads), the order in
//! which their layers were called. Building declares each layer's variables in that order, so
//! the same graph and seed give the same values, and a chain gives the values of the
//! `Sequential` model with the same layers.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;

use lockstep_tensor::ops::{self, DenseByBlocks};
use lockstep_tensor::{Device, Gradients, Tensor, TensorError};
use rayon::prelude::*;

use crate::error::{InLayer, NnError};
use crate::layers::{
    Activation, DenseProduct, ForwardContext, Layer, NormalizationStep, ObservationSink,
};
use crate::params::{ParamBuilder, Parameters};

/// Values per task when gradients are copied into the flat buffer.
const COPY_CHUNK: usize = 1 << 15;

/// Where a node's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The network's input of this index.
    Input(usize),
    /// The output of the node of this index.
    Node(usize),
}

/// A layer to place in a network, before it is built.
pub(crate) struct Planned {
    /// Its name; `None` takes Keras' default (`dense`, `dense_1`, …).
    pub(crate) name: Option<String>,
    pub(crate) layer: Box<dyn Layer>,
    pub(crate) inputs: Vec<Source>,
}

struct Node {
    name: String,
    layer: Box<dyn Layer>,
    inputs: Vec<Source>,
    params: Range<usize>,
    output_shape: Vec<usize>,
    /// How many node inputs and network outputs read this node.
    readers: usize,
}

/// What kind of model a network was made as: it names the model in `summary()`, and the
/// configuration that rebuilds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sequential,
    Functional,
}

/// Layers in a graph from inputs to outputs, with their variables in one flat buffer: the
/// model type every strategy, checkpoint and training session works with. Made by
/// [`Sequential::new`](crate::Sequential::new) (a chain) or
/// [`Network::new`](crate::Network::new) from a functional graph.
pub struct Network {
    kind: Kind,
    inputs: Vec<(String, Vec<usize>)>,
    nodes: Vec<Node>,
    outputs: Vec<Source>,
    params: Parameters,
    device: Device,
}

/// The result of a forward pass that will be differentiated: the outputs, and the variable
/// tensors whose gradients [`Network::gradients`] collects.
pub struct Forward {
    /// The model's (first) output for the batch.
    pub output: Tensor,
    /// Every output, in the order the model's outputs were given.
    pub outputs: Vec<Tensor>,
    variables: Vec<Tensor>,
    /// What layers observed of their non-trainable variables, by variable index.
    observations: Vec<(usize, Tensor)>,
    /// The examples in the batch, which weigh the observations.
    examples: usize,
    /// Variables replaced for this pass by some of their rows
    /// ([`Network::forward_with_rows`]): their gradients are not the variables' shape.
    replaced: Vec<usize>,
}

impl Forward {
    /// A pass of inputs `xs` that gave `outputs` on `variables`, the layers' observations in
    /// `sink`.
    fn of_pass(
        xs: &[Tensor],
        outputs: Vec<Tensor>,
        variables: Vec<Tensor>,
        sink: ObservationSink,
    ) -> Self {
        Self {
            output: outputs[0].clone(),
            outputs,
            variables,
            observations: sink.into_inner(),
            examples: xs
                .first()
                .and_then(|x| x.shape().first())
                .copied()
                .unwrap_or(0),
            replaced: Vec::new(),
        }
    }

    /// The tensor that stood for variable `index` in this pass (its gradient is
    /// `gradients.get(tensor)`), or `None` past the variables.
    pub fn variable(&self, index: usize) -> Option<&Tensor> {
        self.variables.get(index)
    }
}

/// A table variable looked up by the ids one of the model's inputs holds, that input read by
/// nothing else ([`Network::row_lookups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLookup {
    /// The table's variable index (as [`Parameters::specs`]).
    pub variable: usize,
    /// The input that holds the ids.
    pub input: usize,
}

/// Writes the observation of variable `index` in `forward`, times its examples, into `slot`.
fn observation(forward: &Forward, index: usize, slot: &mut [f32]) -> Result<(), NnError> {
    let Some((_, seen)) = forward.observations.iter().find(|(v, _)| *v == index) else {
        slot.fill(0.0);
        return Ok(());
    };
    let values = seen.to_vec().in_layer("observations")?;
    if values.len() != slot.len() {
        return Err(NnError::Length {
            what: "an observed state variable and its observation",
            left: slot.len(),
            right: values.len(),
        });
    }
    let examples = forward.examples as f32;
    for (slot, v) in slot.iter_mut().zip(values) {
        *slot = v * examples;
    }
    Ok(())
}

pub(crate) fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = std::iter::once("None".to_owned())
        .chain(shape.iter().map(ToString::to_string))
        .collect();
    format!("({})", dims.join(", "))
}

impl Network {
    /// Builds `planned` (in topological order) for `inputs` (name and shape of one example
    /// each), with variables initialised from `seed`.
    pub(crate) fn build(
        kind: Kind,
        inputs: Vec<(String, Vec<usize>)>,
        planned: Vec<Planned>,
        outputs: Vec<Source>,
        seed: u64,
    ) -> Result<Self, NnError> {
        let mut builder = ParamBuilder::new(seed);
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        let mut nodes: Vec<Node> = Vec::with_capacity(planned.len());
        for (
            index,
            Planned {
                name,
                mut layer,
                inputs: sources,
            },
        ) in planned.into_iter().enumerate()
        {
            let count = counts.entry(layer.stem()).or_insert(0);
            let name = name.unwrap_or_else(|| {
                if *count == 0 {
                    layer.stem().to_owned()
                } else {
                    format!("{}_{count}", layer.stem())
                }
            });
            *count += 1;
            let shapes = sources
                .iter()
                .map(|&source| match source {
                    Source::Input(i) if i < inputs.len() => Ok(inputs[i].1.clone()),
                    Source::Node(j) if j < index => Ok(nodes[j].output_shape.clone()),
                    _ => Err(NnError::InvalidConfig {
                        layer: name.clone(),
                        why: format!("reads {source:?}, which is not before it in the graph"),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let first = builder.count();
            let output_shape = layer.build_inputs(&name, &shapes, &mut builder)?;
            for source in &sources {
                if let Source::Node(j) = source {
                    nodes[*j].readers += 1;
                }
            }
            nodes.push(Node {
                name,
                layer,
                inputs: sources,
                params: first..builder.count(),
                output_shape,
                readers: 0,
            });
        }
        for output in &outputs {
            match *output {
                Source::Node(j) if j < nodes.len() => nodes[j].readers += 1,
                Source::Input(i) if i < inputs.len() => {}
                other => {
                    return Err(NnError::InvalidConfig {
                        layer: "outputs".to_owned(),
                        why: format!("{other:?} is not in the graph"),
                    });
                }
            }
        }
        if outputs.is_empty() {
            return Err(NnError::InvalidConfig {
                layer: "outputs".to_owned(),
                why: "a model needs at least one output".to_owned(),
            });
        }
        let mut names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
        names.extend(nodes.iter().map(|n| n.name.as_str()));
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(NnError::InvalidConfig {
                layer: pair[0].to_owned(),
                why: "two layers of the model have this name".to_owned(),
            });
        }
        Ok(Self {
            kind,
            inputs,
            nodes,
            outputs,
            params: builder.finish(),
            device: Device::Cpu,
        })
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The layers, in topological order, with their names and the sources they read.
    pub(crate) fn layers(&self) -> impl Iterator<Item = (&str, &dyn Layer, &[Source])> {
        self.nodes
            .iter()
            .map(|n| (n.name.as_str(), n.layer.as_ref(), n.inputs.as_slice()))
    }

    /// The inputs' names and shapes.
    pub(crate) fn inputs(&self) -> &[(String, Vec<usize>)] {
        &self.inputs
    }

    /// The sources of the outputs.
    pub(crate) fn output_sources(&self) -> &[Source] {
        &self.outputs
    }

    /// The name of what `source` is.
    pub(crate) fn source_name(&self, source: Source) -> &str {
        match source {
            Source::Input(i) => &self.inputs[i].0,
            Source::Node(j) => &self.nodes[j].name,
        }
    }

    /// The model with its forward and backward passes on `device`, as a torch module's
    /// `model.to(device)` puts it there: each pass puts the variables and the batch there, every
    /// layer runs there, and the gradients come back into the flat gradient buffer that the
    /// optimizers and the collectives work on.
    ///
    /// ```
    /// use lockstep_nn::models;
    /// use lockstep_tensor::Device;
    ///
    /// let model = models::mnist_cnn(0)?;
    /// let model = match model.to_device(Device::Cuda(0)) {
    ///     Ok(on_gpu) => on_gpu,
    ///     Err((model, why)) => {
    ///         eprintln!("training on the CPU: {why}");
    ///         model
    ///     }
    /// };
    /// # let _ = model;
    /// # Ok::<(), lockstep_nn::NnError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When the device cannot be used (no driver, no such GPU, no NVRTC): the error, with the
    /// model handed back unchanged so that the caller can stay on the CPU.
    #[allow(
        clippy::result_large_err,
        reason = "the model is handed back on failure, as the caller's fallback"
    )]
    pub fn to_device(mut self, device: Device) -> Result<Self, (Self, NnError)> {
        if let Err(e) = Tensor::scalar(0.0).to_device(device).in_layer("to_device") {
            return Err((self, e));
        }
        self.device = device;
        Ok(self)
    }

    /// Where the forward and backward passes run.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The shape of one example of the (first) input.
    pub fn input_shape(&self) -> &[usize] {
        self.inputs.first().map_or(&[], |(_, shape)| shape)
    }

    /// The shape of one example of each input.
    pub fn input_shapes(&self) -> Vec<&[usize]> {
        self.inputs.iter().map(|(_, s)| s.as_slice()).collect()
    }

    /// The shape of one (first) output.
    pub fn output_shape(&self) -> &[usize] {
        self.shape_of(self.outputs[0])
    }

    /// The shape of one example of each output.
    pub fn output_shapes(&self) -> Vec<&[usize]> {
        self.outputs.iter().map(|&o| self.shape_of(o)).collect()
    }

    fn shape_of(&self, source: Source) -> &[usize] {
        match source {
            Source::Input(i) => &self.inputs[i].1,
            Source::Node(j) => &self.nodes[j].output_shape,
        }
    }

    /// The trainable variables.
    pub fn parameters(&self) -> &Parameters {
        &self.params
    }

    /// The trainable variables, for optimizers and checkpoint restores.
    pub fn parameters_mut(&mut self) -> &mut Parameters {
        &mut self.params
    }

    fn check_inputs(&self, xs: &[Tensor]) -> Result<(), NnError> {
        if xs.len() != self.inputs.len() {
            return Err(NnError::Length {
                what: "model inputs and tensors given",
                left: self.inputs.len(),
                right: xs.len(),
            });
        }
        for (x, (name, shape)) in xs.iter().zip(&self.inputs) {
            if !(x.rank() == shape.len() + 1 && x.shape()[1..] == shape[..]) {
                return Err(NnError::Shape {
                    what: if self.inputs.len() == 1 {
                        "model input".into()
                    } else {
                        format!("model input {name}")
                    },
                    expected: shape_text(shape),
                    got: x.shape().to_vec(),
                });
            }
        }
        Ok(())
    }

    /// The outputs for inputs `xs` with the variables `variables` (in declaration order).
    pub(crate) fn run_inputs(
        &self,
        xs: &[Tensor],
        mut variables: &[Tensor],
        ctx: ForwardContext<'_>,
    ) -> Result<Vec<Tensor>, NnError> {
        self.run_inputs_from(xs, &mut variables, ctx)
    }

    /// [`Network::run_inputs`] taking the variables from `source` as the pass reaches them.
    fn run_inputs_from(
        &self,
        xs: &[Tensor],
        source: &mut dyn VariableSource,
        ctx: ForwardContext<'_>,
    ) -> Result<Vec<Tensor>, NnError> {
        self.check_inputs(xs)?;
        let mut values: Vec<Option<Tensor>> = vec![None; self.nodes.len()];
        let value = |values: &[Option<Tensor>], source: Source| -> Result<Tensor, NnError> {
            match source {
                Source::Input(i) => Ok(xs[i].clone()),
                Source::Node(j) => values[j].clone().ok_or_else(|| NnError::InvalidConfig {
                    layer: self.nodes[j].name.clone(),
                    why: "its output was read before it was computed".to_owned(),
                }),
            }
        };
        let mut index = 0;
        while index < self.nodes.len() {
            // A dense layer whose variables become final piece by piece, one block of its
            // kernel's rows at a time.
            if source.is_live()
                && let Some(product) = self.nodes[index].layer.as_dense_product()
                && let [only] = self.nodes[index].inputs[..]
            {
                let x = value(&values, only)?;
                if let Some(y) = self.dense_by_blocks(index, product, &x, source)? {
                    values[index] = Some(y);
                    index += 1;
                    continue;
                }
            }
            // This node's variables, and a batch normalization's after it, which the fused
            // path below reads with them (the nodes it fuses after those hold none).
            let ahead = self
                .nodes
                .get(index + 1)
                .filter(|next| next.layer.as_batch_norm().is_some())
                .map_or(0, |next| next.params.end)
                .max(self.nodes[index].params.end);
            let variables = source.upto(ahead)?;
            let node = &self.nodes[index];
            let params = &variables[node.params.clone()];
            let inputs = node
                .inputs
                .iter()
                .map(|&s| value(&values, s))
                .collect::<Result<Vec<_>, _>>()?;
            // A layer read only by the max pooling right after it runs fused with it.
            let next = self.nodes.get(index + 1).filter(|next| {
                node.readers == 1 && next.inputs == [Source::Node(index)] && inputs.len() == 1
            });
            let layer_ctx = ctx.for_layer(node.params.start);
            // A layer, the batch normalization read only by it, an optional activation and a
            // max pooling, each read only by the next, as one pass.
            if let Some((last, pooled)) = next.and_then(|next| {
                self.normalized_max_pool(index, next, (&inputs[0], params), ctx, variables)
            }) {
                values[last] = Some(pooled?);
                index = last + 1;
                continue;
            }
            let ctx = layer_ctx;
            // Likewise a layer, an activation read only by the max pooling after it, and that
            // pooling.
            let third = next
                .filter(|next| next.readers == 1)
                .and(self.nodes.get(index + 2))
                .filter(|third| third.inputs == [Source::Node(index + 1)]);
            let fused = next.zip(third).and_then(|(next, third)| {
                let activation = next.layer.as_activation()?;
                let pool = third.layer.as_max_pool()?;
                node.layer.forward_then_activation_max_pool(
                    &node.name,
                    &inputs[0],
                    params,
                    (activation, pool),
                    ctx,
                )
            });
            if let Some(pooled) = fused {
                values[index + 2] = Some(pooled?);
                index += 3;
                continue;
            }
            let fused = next.and_then(|next| {
                let pool = next.layer.as_max_pool()?;
                node.layer
                    .forward_then_max_pool(&node.name, &inputs[0], params, pool, ctx)
            });
            if let Some(pooled) = fused {
                values[index + 1] = Some(pooled?);
                index += 2;
                continue;
            }
            values[index] = Some(
                node.layer
                    .forward_inputs(&node.name, &inputs, params, ctx)?,
            );
            index += 1;
        }
        self.outputs.iter().map(|&o| value(&values, o)).collect()
    }

    /// Dense node `index` computed from `source`'s live values one block of its kernel's rows
    /// at a time ([`DenseByBlocks`]), each as soon as `source` has it final; `None` (nothing
    /// read) when its kernel is one block, its input is not 2-D, or a batch normalization
    /// follows (the fused path reads both).
    fn dense_by_blocks(
        &self,
        index: usize,
        product: DenseProduct,
        x: &Tensor,
        source: &mut dyn VariableSource,
    ) -> Result<Option<Tensor>, NnError> {
        let node = &self.nodes[index];
        let DenseProduct {
            inputs: k,
            units: n,
            relu,
            bias,
        } = product;
        let followed_by_norm =
            (self.nodes.get(index + 1)).is_some_and(|next| next.layer.as_batch_norm().is_some());
        if !matches!(x.shape(), &[_, cols] if cols == k)
            || node.params.len() != 1 + usize::from(bias)
            || followed_by_norm
            || ops::dense_blocks(k, n).len() < 2
        {
            return Ok(None);
        }
        let name = node.name.as_str();
        let kernel = node.params.start;
        if source.upto(kernel)?.len() != kernel {
            // Its variables are made already: a pass that read them earlier.
            return Ok(None);
        }
        let bias = if bias {
            Some(source.values(kernel + 1, 0..n)?.to_vec())
        } else {
            None
        };
        let mut blocks = DenseByBlocks::new(x, (k, n), bias.as_deref()).in_layer(name)?;
        let mut kernel_values = vec![0.0; k * n];
        while let Some(rows) = blocks.next_rows() {
            let slot = &mut kernel_values[rows.clone()];
            slot.copy_from_slice(source.values(kernel, rows)?);
            blocks.add(slot).in_layer(name)?;
        }
        let w = source.make(kernel, kernel_values)?;
        let b = bias
            .map(|values| source.make(kernel + 1, values))
            .transpose()?;
        blocks.finish(&w, b.as_ref(), relu).in_layer(name).map(Some)
    }

    /// When node `index` (`next` after it) starts `layer → BatchNormalization → activation? →
    /// MaxPooling2D`, each read only by the next, and the layer computes them in one pass
    /// ([`Layer::forward_then_batch_norm_max_pool`]): the last node's index and the pooled
    /// output.
    fn normalized_max_pool(
        &self,
        index: usize,
        next: &Node,
        (x, params): (&Tensor, &[Tensor]),
        ctx: ForwardContext<'_>,
        variables: &[Tensor],
    ) -> Option<(usize, Result<Tensor, NnError>)> {
        let norm = next.layer.as_batch_norm()?;
        let reads = |at: usize, from: usize| {
            self.nodes
                .get(at)
                .filter(|node| node.inputs == [Source::Node(from)])
        };
        if next.readers != 1 {
            return None;
        }
        let after = reads(index + 2, index + 1)?;
        let (activation, last) = match after.layer.as_activation() {
            Some(activation) if after.readers == 1 => (activation, index + 3),
            Some(_) => return None,
            None => (Activation::Linear, index + 2),
        };
        let pool = reads(last, last - 1)?.layer.as_max_pool()?;
        let step = NormalizationStep {
            layer: norm,
            name: &next.name,
            params: &variables[next.params.clone()],
            ctx: ctx.for_layer(next.params.start),
        };
        let node = &self.nodes[index];
        let pooled = node.layer.forward_then_batch_norm_max_pool(
            &node.name,
            x,
            params,
            step,
            (activation, pool),
        )?;
        Some((last, pooled))
    }

    /// The (first) output for a single-input model.
    pub(crate) fn run(
        &self,
        x: &Tensor,
        variables: &[Tensor],
        ctx: ForwardContext<'_>,
    ) -> Result<Tensor, NnError> {
        let mut outputs = self.run_inputs(std::slice::from_ref(x), variables, ctx)?;
        Ok(outputs.swap_remove(0))
    }

    /// A forward pass whose variables record gradients, for training. On a GPU this uploads
    /// the variables for the pass and [`Network::gradients`] reads the gradients back (what
    /// a host-side all-reduce needs); [`Network::training`] keeps both on the GPU.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the input shape (or the model has several inputs), or a
    /// layer fails.
    pub fn forward(&self, x: &Tensor, ctx: ForwardContext<'_>) -> Result<Forward, NnError> {
        self.forward_inputs(std::slice::from_ref(x), ctx)
    }

    /// [`Network::forward`] with one tensor per input of the model.
    ///
    /// # Errors
    ///
    /// When the tensors do not match the inputs, or a layer fails.
    pub fn forward_inputs(
        &self,
        xs: &[Tensor],
        ctx: ForwardContext<'_>,
    ) -> Result<Forward, NnError> {
        let variables = self.on_device(self.params.tensors()?)?;
        self.forward_on(xs, variables, ctx)
    }

    /// [`Network::forward_inputs`] for a step whose variables are still being updated as it
    /// starts: before the pass reads values `range` of the parameters (as
    /// [`Parameters::values`] lays them out) it calls `ready(range, parameters)`, which may
    /// change them and must leave them final. The pass asks for each layer's variables as it
    /// reaches the layer, and for a dense layer whose kernel is summed in several blocks
    /// ([`lockstep_tensor::ops::dense_blocks`]) for its bias, then each block of the kernel's
    /// rows in turn, the last first; by its end it has asked for every value. A training step
    /// whose update is applied piece by piece as each piece's sum arrives runs its next forward
    /// pass this way, each layer (each block of a large kernel) as soon as its own values are
    /// updated, with the bits of a pass on the whole update. On a GPU, `ready` is called once
    /// for every value before the pass.
    ///
    /// # Errors
    ///
    /// `ready`'s errors, and [`Network::forward_inputs`]'.
    pub fn forward_inputs_as_ready(
        &mut self,
        xs: &[Tensor],
        ctx: ForwardContext<'_>,
        ready: &mut ValuesReady<'_>,
    ) -> Result<Forward, NnError> {
        let all = self.params.specs().len();
        if self.device != Device::Cpu {
            ready(0..self.params.len(), &mut self.params)?;
            return self.forward_inputs(xs, ctx);
        }
        // The pass reads the layers, `ready` writes the values: the values are set aside for
        // the pass (nothing in it reads `self.params`) and put back whatever happens.
        let mut params = std::mem::take(&mut self.params);
        let sink = ObservationSink::default();
        let mut source = AsReady {
            made: Vec::with_capacity(all),
            params: &mut params,
            ready,
        };
        let outputs = self
            .run_inputs_from(xs, &mut source, ctx.observing(&sink))
            .and_then(|outputs| source.upto(all).map(|_| outputs));
        let variables = source.made;
        self.params = params;
        Ok(Forward::of_pass(xs, outputs?, variables, sink))
    }

    /// A forward pass of `xs` on `variables`, recording what layers observe.
    fn forward_on(
        &self,
        xs: &[Tensor],
        variables: Vec<Tensor>,
        ctx: ForwardContext<'_>,
    ) -> Result<Forward, NnError> {
        let xs = self.inputs_on_device(xs)?;
        let sink = ObservationSink::default();
        let outputs = self.run_inputs(&xs, &variables, ctx.observing(&sink))?;
        Ok(Forward::of_pass(&xs, outputs, variables, sink))
    }

    /// The embedding tables that read their ids straight from one of the model's inputs,
    /// that input read by no other layer: a pass may then take only the rows a batch names
    /// ([`Network::forward_with_rows`]).
    pub fn row_lookups(&self) -> Vec<RowLookup> {
        let mut readers = vec![0_usize; self.inputs.len()];
        for source in self
            .nodes
            .iter()
            .flat_map(|n| &n.inputs)
            .chain(&self.outputs)
        {
            if let Source::Input(i) = *source {
                readers[i] += 1;
            }
        }
        self.nodes
            .iter()
            .filter(|node| node.layer.looks_up_rows() && node.params.len() == 1)
            .filter_map(|node| match node.inputs[..] {
                [Source::Input(input)] if readers[input] == 1 => Some(RowLookup {
                    variable: node.params.start,
                    input,
                }),
                _ => None,
            })
            .collect()
    }

    /// [`Network::forward_inputs`] with some table variables replaced, for this pass, by a
    /// table of some of their rows: `rows` holds `(variable, table)` pairs, each variable one
    /// of [`Network::row_lookups`], each `table` `[k, width]` with the variable's width, and
    /// the input that variable's layer reads holds ids renumbered into that table. The output
    /// is the full model's on the original ids; a replaced variable's slot in
    /// [`Network::gradients`] is left as it was, and its gradient, `[k, width]`, is
    /// `gradients.get(forward.variable(index))`. A worker whose tables live on parameter
    /// servers fetches and sends back only a batch's rows this way.
    ///
    /// # Errors
    ///
    /// A variable that is not a row lookup, a table of another width, and
    /// [`Network::forward_inputs`]' errors.
    pub fn forward_with_rows(
        &self,
        xs: &[Tensor],
        ctx: ForwardContext<'_>,
        rows: Vec<(usize, Tensor)>,
    ) -> Result<Forward, NnError> {
        let lookups = self.row_lookups();
        let specs = self.params.specs();
        let mut replaced = Vec::with_capacity(rows.len());
        for (variable, table) in &rows {
            let spec = specs
                .get(*variable)
                .filter(|_| lookups.iter().any(|l| l.variable == *variable));
            let Some(spec) = spec else {
                return Err(NnError::InvalidConfig {
                    layer: "forward_with_rows".into(),
                    why: format!(
                        "variable {variable} is not an embedding table read from an input"
                    ),
                });
            };
            if table.shape().len() != 2 || table.shape()[1..] != spec.shape[1..] {
                return Err(NnError::InvalidConfig {
                    layer: spec.name.clone(),
                    why: format!(
                        "a table of shape {:?} for a variable of shape {:?}",
                        table.shape(),
                        spec.shape
                    ),
                });
            }
            replaced.push(*variable);
        }
        let variables = self.on_device(self.params.tensors_replacing(rows)?)?;
        let mut forward = self.forward_on(xs, variables, ctx)?;
        forward.replaced = replaced;
        Ok(forward)
    }

    /// Inference: no gradients recorded, dropout off; the (first) output.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the input shape, or a layer fails.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let mut outputs = self.predict_inputs(std::slice::from_ref(x))?;
        Ok(outputs.swap_remove(0))
    }

    /// Inference with one tensor per input: every output.
    ///
    /// # Errors
    ///
    /// When the tensors do not match the inputs, or a layer fails.
    pub fn predict_inputs(&self, xs: &[Tensor]) -> Result<Vec<Tensor>, NnError> {
        let variables = self.on_device(self.params.constants()?)?;
        let xs = self.inputs_on_device(xs)?;
        self.run_inputs(&xs, &variables, ForwardContext::default())
    }

    fn inputs_on_device(&self, xs: &[Tensor]) -> Result<Vec<Tensor>, NnError> {
        xs.iter()
            .map(|x| x.to_device(self.device).in_layer("input"))
            .collect()
    }

    /// `variables` moved to the model's device (the same tensors on the CPU).
    fn on_device(&self, variables: Vec<Tensor>) -> Result<Vec<Tensor>, NnError> {
        if self.device == Device::Cpu {
            return Ok(variables);
        }
        variables
            .iter()
            .zip(self.params.specs())
            .map(|(v, spec)| v.to_device(self.device).in_layer(&spec.name))
            .collect()
    }

    /// An error unless `out` is as long as the parameters.
    fn check_gradient_buffer(&self, out: &[f32]) -> Result<(), NnError> {
        if out.len() == self.params.len() {
            return Ok(());
        }
        Err(NnError::Length {
            what: "gradient buffer and parameters",
            left: out.len(),
            right: self.params.len(),
        })
    }

    /// Copies the gradients of a forward pass into `out`, laid out like the parameters (zero
    /// for variables the loss does not depend on). A non-trainable variable's slot gets what
    /// its layer observed times the examples of the batch (zero when it observed nothing): a
    /// sum over replicas divided by the step's examples, as the gradients are, is the mean
    /// observation that [`apply_update`](crate::apply_update) moves it towards.
    ///
    /// # Errors
    ///
    /// When `out` is not as long as the parameters.
    pub fn gradients(
        &self,
        forward: &Forward,
        grads: &Gradients,
        out: &mut [f32],
    ) -> Result<(), NnError> {
        self.check_gradient_buffer(out)?;
        for (index, (spec, variable)) in self
            .params
            .specs()
            .iter()
            .zip(&forward.variables)
            .enumerate()
        {
            let slot = &mut out[spec.range()];
            if forward.replaced.contains(&index) {
                continue;
            }
            if !spec.is_trainable() {
                observation(forward, index, slot)?;
                continue;
            }
            // In parallel, as the variables are copied in `Parameters::tensors`.
            let Some(g) = grads.get(variable) else {
                slot.fill(0.0);
                continue;
            };
            // A gradient computed on a GPU is copied to the host here, where the flat
            // gradient buffer the collectives reduce lives.
            let copied;
            let values = if let Ok(values) = g.host_data() {
                values
            } else {
                copied = g.to_vec().in_layer("gradients")?;
                &copied
            };
            slot.par_chunks_mut(COPY_CHUNK)
                .zip(values.par_chunks(COPY_CHUNK))
                .for_each(|(slot, g)| slot.copy_from_slice(g));
        }
        Ok(())
    }

    /// [`Network::gradients`] of `loss`, taken by its backward pass: each variable's slot of
    /// `out` is written as soon as the pass has finished its gradient, and `ready(out, range)`
    /// is called once the values `range` of `out` are final, so that a data-parallel step can
    /// start reducing the last layers' gradients while the first layers' are still being
    /// computed. Each value is in exactly one call's range: a variable's whole, or, for a dense
    /// kernel whose gradient is computed one block of rows at a time
    /// ([`Tensor::backward_in_blocks`]), each block's. State variables (their observations)
    /// come first, then trainable ones in the pass's fixed order, then those the loss does not
    /// depend on (zeros).
    ///
    /// # Errors
    ///
    /// As [`Network::gradients`], and when the backward pass fails.
    pub fn gradients_streamed(
        &self,
        forward: &Forward,
        loss: &Tensor,
        out: &mut [f32],
        ready: &mut dyn FnMut(&[f32], Range<usize>),
    ) -> Result<(), NnError> {
        self.check_gradient_buffer(out)?;
        let specs = self.params.specs();
        let mut done = vec![false; specs.len()];
        // Values of each variable handed over in blocks.
        let mut in_blocks = vec![0_usize; specs.len()];
        let mut trainable = HashMap::new();
        if !forward.replaced.is_empty() {
            // A streamed slot is reduced as it is: a replaced table's would be stale.
            return Err(NnError::InvalidConfig {
                layer: "gradients".into(),
                why: "a pass on some rows of a table (forward_with_rows) cannot stream its \
                      gradients: take them with Network::gradients"
                    .into(),
            });
        }
        for (index, (spec, variable)) in specs.iter().zip(&forward.variables).enumerate() {
            if spec.is_trainable() {
                trainable.insert(variable.id(), index);
            } else {
                observation(forward, index, &mut out[spec.range()])?;
                done[index] = true;
                ready(out, spec.range());
            }
        }
        let length = |index: usize, values: usize| TensorError::InvalidArgument {
            op: "gradients",
            why: format!(
                "{} holds {} values, its gradient {values}",
                specs[index].name,
                specs[index].len()
            ),
        };
        // Both callbacks write `out` and call `ready`; the pass calls one at a time.
        let shared = std::cell::RefCell::new((&mut *out, &mut *ready, &mut done, &mut in_blocks));
        loss.backward_in_blocks(
            &mut |parameter, gradient| {
                let Some(&index) = trainable.get(&parameter.id()) else {
                    return Ok(());
                };
                let mut guard = shared.borrow_mut();
                let (out, ready, done, in_blocks) = &mut *guard;
                let range = specs[index].range();
                done[index] = true;
                if in_blocks[index] == range.len() {
                    // Every value is in `out` and handed over already.
                    return Ok(());
                }
                let slot = &mut out[range.clone()];
                match gradient.host_data() {
                    Ok(values) if values.len() == slot.len() => slot.copy_from_slice(values),
                    _ => {
                        let values = gradient.to_vec()?;
                        if values.len() != slot.len() {
                            return Err(length(index, values.len()));
                        }
                        slot.copy_from_slice(&values);
                    }
                }
                ready(out, range);
                Ok(())
            },
            &mut |parameter, within, values| {
                let Some(&index) = trainable.get(&parameter.id()) else {
                    return Ok(());
                };
                let mut guard = shared.borrow_mut();
                let (out, ready, _, in_blocks) = &mut *guard;
                let range = specs[index].range();
                if within.start > within.end
                    || within.end > range.len()
                    || within.len() != values.len()
                {
                    return Err(length(index, within.end));
                }
                let values_range = range.start + within.start..range.start + within.end;
                out[values_range.clone()].copy_from_slice(values);
                in_blocks[index] += within.len();
                ready(out, values_range);
                Ok(())
            },
        )
        .in_layer("gradients")?;
        for (index, spec) in specs.iter().enumerate() {
            if !done[index] {
                out[spec.range()].fill(0.0);
                ready(out, spec.range());
            }
        }
        Ok(())
    }

    /// `true` when some layer reduces across the replicas inside its forward pass (a
    /// synchronised batch normalization): then every replica runs every training step, one
    /// without data on an empty batch, so that the collectives meet.
    pub fn synchronizes_replicas(&self) -> bool {
        self.nodes.iter().any(|n| n.layer.synchronizes_replicas())
    }

    /// A table of layers, output shapes and parameter counts, like Keras' `model.summary()`;
    /// a functional model's also lists its inputs and what each layer is connected to.
    pub fn summary(&self) -> String {
        let functional = self.kind == Kind::Functional;
        let mut rows: Vec<[String; 4]> = Vec::new();
        if functional {
            for (name, shape) in &self.inputs {
                rows.push([
                    format!("{name} (InputLayer)"),
                    shape_text(shape),
                    "0".to_owned(),
                    "-".to_owned(),
                ]);
            }
        }
        for node in &self.nodes {
            let count: usize = self.params.specs()[node.params.clone()]
                .iter()
                .map(crate::params::ParamSpec::len)
                .sum();
            let connected: Vec<String> = node
                .inputs
                .iter()
                .map(|&s| format!("{}[0][0]", self.source_name(s)))
                .collect();
            rows.push([
                format!("{} ({})", node.name, node.layer.kind()),
                shape_text(&node.output_shape),
                count.to_string(),
                connected.join(", "),
            ]);
        }
        let headers = ["Layer (type)", "Output Shape", "Param #", "Connected to"];
        let columns = if functional { 4 } else { 3 };
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                rows.iter()
                    .map(|r| r[c].chars().count())
                    .chain([headers[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[&str]| -> String {
            let mut text = String::new();
            for (c, cell) in cells.iter().enumerate().take(columns) {
                let pad = widths[c].saturating_sub(cell.chars().count());
                if c > 0 {
                    text.push_str("   ");
                }
                if c == 2 {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    if c + 1 < columns {
                        text.push_str(&" ".repeat(pad));
                    }
                }
            }
            text
        };
        let rule = "─".repeat(widths.iter().sum::<usize>() + 3 * (columns - 1));
        let mut out = format!(
            "Model: \"{}\"\n",
            if functional {
                "functional"
            } else {
                "sequential"
            }
        );
        let _ = writeln!(out, "{rule}\n{}\n{rule}", line(&headers));
        for row in &rows {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            let _ = writeln!(out, "{}", line(&cells));
        }
        let trainable = self.params.trainable_len();
        let _ = writeln!(
            out,
            "{rule}\nTotal params: {}\nTrainable params: {trainable}\nNon-trainable params: {}",
            self.params.len(),
            self.params.len() - trainable
        );
        out
    }
}

/// What [`Network::forward_inputs_as_ready`] calls before it reads values `range` of the
/// parameters, to make them final.
pub type ValuesReady<'a> = dyn FnMut(Range<usize>, &mut Parameters) -> Result<(), NnError> + 'a;

/// Where a pass takes its variables from: made before it, or each as the pass reaches the
/// first layer that reads it.
trait VariableSource {
    /// The variables `..end` at least, in declaration order.
    fn upto(&mut self, end: usize) -> Result<&[Tensor], NnError>;

    /// Whether the values become final as the pass goes, and are read with
    /// [`VariableSource::values`] as they do.
    fn is_live(&self) -> bool {
        false
    }

    /// Values `within` of variable `index`, once final.
    fn values(&mut self, index: usize, within: Range<usize>) -> Result<&[f32], NnError> {
        let _ = within;
        Err(not_live(index))
    }

    /// Variable `index`, the next to be made, made of `values` (read with
    /// [`VariableSource::values`]).
    fn make(&mut self, index: usize, values: Vec<f32>) -> Result<Tensor, NnError> {
        let _ = values;
        Err(not_live(index))
    }
}

fn not_live(index: usize) -> NnError {
    NnError::InvalidConfig {
        layer: "parameters".into(),
        why: format!("variable {index} was read before the pass, not as it went"),
    }
}

impl VariableSource for &[Tensor] {
    fn upto(&mut self, _end: usize) -> Result<&[Tensor], NnError> {
        Ok(self)
    }
}

/// The variables of [`Network::forward_inputs_as_ready`]: each copied once `ready` has said
/// its values are final for the step.
struct AsReady<'a> {
    made: Vec<Tensor>,
    params: &'a mut Parameters,
    ready: &'a mut ValuesReady<'a>,
}

impl VariableSource for AsReady<'_> {
    fn upto(&mut self, end: usize) -> Result<&[Tensor], NnError> {
        let specs = self.params.specs();
        let end = end.min(specs.len());
        if end > self.made.len() {
            let values = specs[self.made.len()].range().start..specs[end - 1].range().end;
            (self.ready)(values, self.params)?;
            for index in self.made.len()..end {
                self.made.push(self.params.tensor(index)?);
            }
        }
        Ok(&self.made)
    }

    fn is_live(&self) -> bool {
        true
    }

    fn values(&mut self, index: usize, within: Range<usize>) -> Result<&[f32], NnError> {
        let spec = self
            .params
            .specs()
            .get(index)
            .ok_or_else(|| not_live(index))?;
        let range = spec.range();
        if within.start > within.end || within.end > range.len() {
            return Err(NnError::InvalidConfig {
                layer: spec.name.clone(),
                why: format!(
                    "values {}..{} of a variable of {}",
                    within.start,
                    within.end,
                    range.len()
                ),
            });
        }
        let values = range.start + within.start..range.start + within.end;
        (self.ready)(values.clone(), self.params)?;
        Ok(&self.params.values()[values])
    }

    fn make(&mut self, index: usize, values: Vec<f32>) -> Result<Tensor, NnError> {
        let spec = self
            .params
            .specs()
            .get(index)
            .ok_or_else(|| not_live(index))?;
        if index != self.made.len() || values.len() != spec.len() {
            return Err(NnError::InvalidConfig {
                layer: spec.name.clone(),
                why: format!(
                    "made as variable {} of {} values, not {index} of {}",
                    self.made.len(),
                    values.len(),
                    spec.len()
                ),
            });
        }
        let made = spec.tensor_of(values).in_layer(&spec.name)?;
        self.made.push(made.clone());
        Ok(made)
    }
}
