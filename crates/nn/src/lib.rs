//! Keras-style models on [`lockstep_tensor`]: layers, `Sequential` with shape inference and
//! `summary()`, the sparse categorical cross-entropy loss, SGD and Adam, and metrics whose
//! state merges across replicas.
//!
//! One training step of the Keras guide's MLP:
//!
//! ```
//! use lockstep_nn::{Activation, Adam, Dense, ForwardContext, Optimizer, Reduction, Sequential, SparseCategoricalCrossentropy};
//! use lockstep_tensor::Tensor;
//!
//! let mut model = Sequential::new(&[784], vec![
//!     Box::new(Dense::new(256).activation(Activation::Relu)),
//!     Box::new(Dense::new(256).activation(Activation::Relu)),
//!     Box::new(Dense::new(10)),
//! ], 0)?;
//! let loss_fn = SparseCategoricalCrossentropy { from_logits: true, reduction: Reduction::SumOverBatchSize };
//! let mut adam = Adam::default();
//!
//! let x = Tensor::from_vec(vec![0.5; 32 * 784], &[32, 784]).unwrap();
//! let labels = vec![3_usize; 32];
//! let forward = model.forward(&x, ForwardContext::training(0, 0))?;
//! let loss = loss_fn.call(&forward.output, &labels)?;
//! let grads = loss.backward().unwrap();
//! let mut flat = vec![0.0; model.parameters().len()];
//! model.gradients(&forward, &grads, &mut flat)?; // one buffer: one all-reduce
//! adam.apply(model.parameters_mut().values_mut(), &flat)?;
//! # Ok::<(), lockstep_nn::NnError>(())
//! ```
//!
//! Every trainable value of a model lives in one contiguous buffer ([`Parameters`]) with a
//! named view per variable, and gradients are gathered into a buffer of the same layout, so a
//! collective can all-reduce a whole model's gradients in one call and a checkpoint can name
//! every variable.
//!
//! [`models`] holds the tutorials' models (the multi-worker tutorial's CNN, the Keras guide's
//! MLP), defined once for the examples, tests and benchmarks.
//!
//! A model runs a `Conv2D` and the `MaxPooling2D` after it as one fused operation
//! (`lockstep_tensor::ops::conv2d_bias_relu_max_pool`; see [`Layer::forward_then_max_pool`]),
//! with the two layers' values; in training, `BatchNormalization`, a relu and a max pooling as
//! one pass ([`Layer::forward_then_activation_max_pool`]), and a first `Conv2D` with those
//! three after it as one (`lockstep_tensor::ops::conv2d_batch_norm_max_pool`; see
//! [`Layer::forward_then_batch_norm_max_pool`]), equal to the layers apart up to rounding.
//!
//! Each layer, [`Sequential`] and each optimizer describe themselves as a configuration
//! ([`LayerConfig`], [`SequentialConfig`], [`OptimizerConfig`]) that rebuilds them, as Keras'
//! `get_config`, so a saved model can be loaded without its code.
//!
//! [`TrainingSession`] runs training steps of one model with one optimizer on the model's
//! device; on a GPU the parameters, gradients and optimizer state stay there between steps.
//!
//! Dependencies: `lockstep-tensor` for tensors and autograd; `lockstep-cuda` for the GPU
//! buffers and optimizer kernels of [`TrainingSession`]; `rand_pcg` for seeded initialisers;
//! `rayon` for parallel optimizer updates; `serde` for the configurations; `thiserror` for
//! errors; `tracing` for the one error that cannot be returned (a session dropped unfinished
//! whose values cannot be copied back).

mod device_state;
mod error;
pub mod functional;
mod initializers;
pub mod layers;
mod loss;
pub mod metrics;
mod model;
pub mod models;
mod network;
mod optimizers;
mod params;
mod session;

pub use device_state::DeviceState;
pub use error::NnError;
pub use functional::{Input, LayerCall, ModelConfig, SymbolicTensor};
pub use initializers::Initializer;
pub use layers::{
    Activation, ActivationLayer, ActivationName, Add, AveragePooling2D, BatchNormalization,
    BuiltinLayerConfig, Concatenate, Conv2D, CustomLayerConfig, Dense, DenseProduct, Dropout,
    Embedding, Flatten, ForwardContext, GlobalAveragePooling2D, Layer, LayerConfig, LayerFactory,
    LayerNormalization, MaxPooling2D, Multiply, NormalizationStep, PaddingName, Reshape,
    register_layer,
};
pub use loss::{
    BinaryCrossentropy, CategoricalCrossentropy, FnLoss, Huber, Loss, LossConfig,
    MeanAbsoluteError, MeanSquaredError, Reduction, SparseCategoricalCrossentropy, Targets,
    reduce_loss,
};
pub use metrics::{
    METRIC_NAMES, Mean, Metric, PredictionMetric, SparseCategoricalAccuracy, metric_by_name,
};
pub use model::{Sequential, SequentialConfig};
pub use network::{Forward, Network, RowLookup, ValuesReady};
pub use optimizers::{
    Adagrad, Adam, AdamW, GradientClipping, LearningRateSchedule, Optimizer, OptimizerConfig,
    OptimizerSettings, RmsProp, Sgd, apply_clipped, apply_update, apply_update_range,
};
pub use params::{ParamBuilder, ParamSpec, Parameters, Update, without_initial_values};
pub use session::TrainingSession;
