//! Keras-style training under `tf.distribute` strategies: a [`Model`] replicated by a
//! [`Strategy`] ([`OneDeviceStrategy`], [`MirroredStrategy`],
//! [`MultiWorkerMirroredStrategy`]), `compile`, `fit` with [`Callback`]s, `evaluate`,
//! `predict`, and [`BackupAndRestore`] that resumes a crashed run at the step it stopped;
//! and the [`Estimator`] of `tf.estimator` with [`train_and_evaluate`] and its evaluator task;
//! and the [`SidecarEvaluator`] that evaluates a Keras model's checkpoints beside `fit`; and
//! asynchronous training under [`ParameterServerStrategy`]: the chief's
//! [`ParameterServerModel`] fits through the coordinator, workers [`serve_steps`], `ps` tasks
//! serve the variables.
//!
//! ```
//! use lockstep_data::{Dataset, mnist::{Mnist, scale}};
//! use lockstep_nn::{Adam, SparseCategoricalCrossentropy, models};
//! use lockstep_train::{MirroredStrategy, Model};
//!
//! let mnist = Mnist::embedded()?;
//! let mut model = Model::new(MirroredStrategy::new(2)?, || models::mnist_mlp(42))?;
//! model.compile(Adam::default(), SparseCategoricalCrossentropy { from_logits: true, ..Default::default() }, &["accuracy"])?;
//! let train = mnist.train.dataset()?.take(512).map(|(x, y)| (scale(&x).into_iter().collect::<ndarray::Array1<f32>>(), y));
//! let train = model.distribute_dataset(train, 64)?; // 32 examples per replica per step
//! let history = model.fit(&train).epochs(2).verbose(false).run()?;
//! assert_eq!(history.get("loss").map(<[f64]>::len), Some(2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The shape of a step: each replica of each worker runs forward and backward on its batch,
//! its gradients and its loss totals go into one flat buffer, one all-reduce sums them over
//! all replicas, and every replica divides by the step's example count and applies the same
//! optimizer update to its own copy of the variables. `docs/ARCHITECTURE.md` describes the
//! invariants.
//!
//! Dependencies: the Lockstep crates below it (cluster, collective, data, nn, tensor,
//! checkpoint, ps for the parameter servers and the coordinator, and cuda to count the GPUs a
//! strategy places replicas on); `ndarray` for the batches the data pipeline yields; `indicatif` for the
//! progress bar; `nix` to raise SIGKILL for the `LOCKSTEP_KILL_AT_STEP` fault injection; `serde`/`serde_json` for
//! the trainer state in checkpoints; `prost` and `crc32c` for `TensorBoard`'s event files (no
//! maintained crate writes them); `rayon` to run a process's single replica's steps, and a
//! parameter-server worker's, on a kernel pool of their own (`kernel_threads`); `rustix` for
//! the priority the thread that sums a step's packs asks for (`update_in_flight`: a thread's
//! nice value, which `std` cannot set); `thiserror` for errors; `tracing` for logs.

/// The README's example, compiled and run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod batch;
mod callbacks;
mod checkpoint_watcher;
mod custom_loop;
mod error;
mod estimator;
mod fit;
mod history;
mod kernel_threads;
mod kill_switch;
mod model;
mod packs;
mod parameter_server;
mod peer_watch;
mod progress;
mod replica;
mod sidecar_evaluator;
mod state;
mod step_clock;
mod steps_ahead;
mod stragglers;
mod strategy;
mod tensorboard;
mod update_in_flight;

pub use batch::{BatchTargets, Label, LabeledBatch, LabeledParts};
pub use callbacks::{
    BackupAndRestore, Callback, CallbackState, CsvLogger, EarlyStopping, LearningRateScheduler,
    Mode, ModelCheckpoint, SaveFreq, TrainingContext,
};
pub use custom_loop::{ReplicaContext, VariableGradients};
pub use error::TrainError;
pub use estimator::{
    Estimator, EstimatorSpec, EvalMetricOp, EvalSpec, ModeKeys, ModelFn, Params, RunConfig,
    TrainSpec, Variables, train_and_evaluate,
};
pub use fit::Fit;
pub use history::{History, Logs};
pub use kill_switch::{KILL_AT_STEP, KILL_IN_SAVE, SLOW_STEP_MS};
pub use model::Model;
pub use parameter_server::{
    ParameterServerModel, ParameterServerStrategy, PsRole, TRAIN_STEP, serve_steps,
};
pub use sidecar_evaluator::{Evaluation, SidecarEvaluator};
pub use step_clock::StepClock;
pub use stragglers::Straggler;
pub use strategy::{
    MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy, ReplicaLink, Strategy,
    visible_devices,
};
pub use tensorboard::TensorBoard;
