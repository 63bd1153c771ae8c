//! `Sequential`: layers in a row, built from an input shape, with their variables in one buffer.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;

use lockstep_tensor::{Device, Gradients, Tensor};
use rayon::prelude::*;

use crate::error::{InLayer, NnError};
use serde::{Deserialize, Serialize};

use crate::layers::{ForwardContext, Layer, LayerConfig};
use crate::params::{ParamBuilder, Parameters};

/// Values per task when gradients are copied into the flat buffer.
const COPY_CHUNK: usize = 1 << 15;

struct Built {
    name: String,
    layer: Box<dyn Layer>,
    params: Range<usize>,
    output_shape: Vec<usize>,
}

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
    input_shape: Vec<usize>,
    layers: Vec<Built>,
    params: Parameters,
    device: Device,
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

/// The result of a forward pass that will be differentiated: the output, and the variable
/// tensors whose gradients [`Sequential::gradients`] collects.
pub struct Forward {
    /// The model's output for the batch.
    pub output: Tensor,
    variables: Vec<Tensor>,
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = std::iter::once("None".to_owned())
        .chain(shape.iter().map(ToString::to_string))
        .collect();
    format!("({})", dims.join(", "))
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
        let mut builder = ParamBuilder::new(seed);
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        let mut shape = input_shape.to_vec();
        let mut built = Vec::with_capacity(layers.len());
        for mut layer in layers {
            let count = counts.entry(layer.stem()).or_insert(0);
            let name = if *count == 0 {
                layer.stem().to_owned()
            } else {
                format!("{}_{count}", layer.stem())
            };
            *count += 1;
            let first = builder.count();
            shape = layer.build(&name, &shape, &mut builder)?;
            built.push(Built {
                name,
                layer,
                params: first..builder.count(),
                output_shape: shape.clone(),
            });
        }
        Ok(Self {
            input_shape: input_shape.to_vec(),
            layers: built,
            params: builder.finish(),
            device: Device::Cpu,
        })
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

    /// The settings that rebuild this model with [`Sequential::from_config`].
    pub fn config(&self) -> SequentialConfig {
        SequentialConfig {
            input_shape: self.input_shape.clone(),
            layers: self.layers.iter().map(|l| l.layer.config()).collect(),
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
        let layers = config.layers.iter().map(LayerConfig::build).collect();
        Self::new(&config.input_shape, layers, seed)
    }

    /// The shape of one example.
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// The shape of one output.
    pub fn output_shape(&self) -> &[usize] {
        self.layers
            .last()
            .map_or(&self.input_shape, |l| &l.output_shape)
    }

    /// The trainable variables.
    pub fn parameters(&self) -> &Parameters {
        &self.params
    }

    /// The trainable variables, for optimizers and checkpoint restores.
    pub fn parameters_mut(&mut self) -> &mut Parameters {
        &mut self.params
    }

    fn check_input(&self, x: &Tensor) -> Result<(), NnError> {
        if x.rank() == self.input_shape.len() + 1 && x.shape()[1..] == self.input_shape[..] {
            Ok(())
        } else {
            Err(NnError::Shape {
                what: "model input".into(),
                expected: shape_text(&self.input_shape),
                got: x.shape().to_vec(),
            })
        }
    }

    pub(crate) fn run(
        &self,
        x: &Tensor,
        variables: &[Tensor],
        ctx: ForwardContext,
    ) -> Result<Tensor, NnError> {
        self.check_input(x)?;
        let mut h = x.clone();
        let mut layers = self.layers.iter().peekable();
        while let Some(built) = layers.next() {
            let params = &variables[built.params.clone()];
            let pool = layers.peek().and_then(|next| next.layer.as_max_pool());
            let fused = pool.and_then(|pool| {
                built
                    .layer
                    .forward_then_max_pool(&built.name, &h, params, pool, ctx)
            });
            h = match fused {
                Some(pooled) => {
                    layers.next();
                    pooled?
                }
                None => built.layer.forward(&built.name, &h, params, ctx)?,
            };
        }
        Ok(h)
    }

    /// A forward pass whose variables record gradients, for training. On a GPU this uploads
    /// the variables for the pass and [`Sequential::gradients`] reads the gradients back (what
    /// a host-side all-reduce needs); [`Sequential::training`] keeps both on the GPU.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the input shape, or a layer fails.
    pub fn forward(&self, x: &Tensor, ctx: ForwardContext) -> Result<Forward, NnError> {
        let variables = self.on_device(self.params.tensors()?)?;
        let x = x.to_device(self.device).in_layer("input")?;
        let output = self.run(&x, &variables, ctx)?;
        Ok(Forward { output, variables })
    }

    /// Inference: no gradients recorded, dropout off.
    ///
    /// # Errors
    ///
    /// When `x` is not a batch of the input shape, or a layer fails.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let variables = self.on_device(self.params.constants()?)?;
        let x = x.to_device(self.device).in_layer("input")?;
        self.run(&x, &variables, ForwardContext::default())
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

    /// Copies the gradients of a forward pass into `out`, laid out like the parameters (zero
    /// for variables the loss does not depend on).
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
        if out.len() != self.params.len() {
            return Err(NnError::Length {
                what: "gradient buffer and parameters",
                left: out.len(),
                right: self.params.len(),
            });
        }
        for (spec, variable) in self.params.specs().iter().zip(&forward.variables) {
            let slot = &mut out[spec.range()];
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

    /// A table of layers, output shapes and parameter counts, like Keras' `model.summary()`.
    pub fn summary(&self) -> String {
        let rows: Vec<(String, String, usize)> = self
            .layers
            .iter()
            .map(|l| {
                let count: usize = self.params.specs()[l.params.clone()]
                    .iter()
                    .map(crate::params::ParamSpec::len)
                    .sum();
                (
                    format!("{} ({})", l.name, l.layer.kind()),
                    shape_text(&l.output_shape),
                    count,
                )
            })
            .collect();
        let w0 = rows
            .iter()
            .map(|r| r.0.len())
            .max()
            .unwrap_or(0)
            .max("Layer (type)".len());
        let w1 = rows
            .iter()
            .map(|r| r.1.len())
            .max()
            .unwrap_or(0)
            .max("Output Shape".len());
        let w2 = rows
            .iter()
            .map(|r| r.2.to_string().len())
            .max()
            .unwrap_or(0)
            .max("Param #".len());
        let rule = "─".repeat(w0 + w1 + w2 + 6);
        let mut out = String::from("Model: \"sequential\"\n");
        let _ = writeln!(
            out,
            "{rule}\n{:<w0$}   {:<w1$}   {:>w2$}\n{rule}",
            "Layer (type)", "Output Shape", "Param #"
        );
        for (name, shape, count) in &rows {
            let _ = writeln!(out, "{name:<w0$}   {shape:<w1$}   {count:>w2$}");
        }
        let _ = writeln!(
            out,
            "{rule}\nTotal params: {}\nTrainable params: {}\nNon-trainable params: 0",
            self.params.len(),
            self.params.len()
        );
        out
    }
}
