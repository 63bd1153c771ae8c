//! `SidecarEvaluator`: the Keras multi-worker guide's evaluator task, evaluating each weights
//! checkpoint the chief writes while the workers train.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockstep_checkpoint::{NamedTensor, read_tensors_with_metadata};
use lockstep_data::Dataset;

use crate::batch::LabeledBatch;
use crate::checkpoint_watcher::{CheckpointSource, CheckpointWatcher};
use crate::error::TrainError;
use crate::history::Logs;
use crate::model::{ITERATIONS, Model};
use crate::replica::not_compiled;
use crate::tensorboard::EventWriter;

/// One evaluation of a [`SidecarEvaluator`].
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The weights file evaluated.
    pub checkpoint: PathBuf,
    /// Its number, from its name (`ckpt-3` is 3: the epoch, with `ckpt-{epoch}`).
    pub number: u64,
    /// The training step its weights are of (the file's `iterations`).
    pub iterations: u64,
    /// Loss and metrics over the whole of the data.
    pub logs: Logs,
}

/// Evaluates each new weights checkpoint in a directory as the chief writes it, as
/// `tf.keras.utils.SidecarEvaluator` does in the Keras multi-worker guide: the workers train
/// with [`ModelCheckpoint`](crate::ModelCheckpoint)`::new("<dir>/ckpt-{epoch}").save_weights_only(true)`
/// (the guide's `save_weights_only=True`), and an
/// evaluator task outside the collective group runs this on a model compiled with the same
/// loss and metrics.
///
/// A checkpoint is a file named `<prefix>-<number>` or `<prefix>-<number>.<extension>`; hidden
/// files (the writer's temporary files) and other names are ignored. Each appears whole, by
/// an atomic rename, so a half-written one is never read. When several are new, only the
/// newest is evaluated, as TensorFlow's does; a damaged one is skipped with a warning.
///
/// ```
/// use lockstep_data::{Dataset, mnist::{Mnist, scale}};
/// use lockstep_nn::{Sgd, SparseCategoricalCrossentropy, models};
/// use lockstep_train::{Model, OneDeviceStrategy, SidecarEvaluator};
///
/// let dir = tempfile::tempdir()?;
/// let loss = || SparseCategoricalCrossentropy { from_logits: true, ..Default::default() };
/// let digits = Mnist::embedded()?.test.dataset()?.take(256)
///     .map(|(x, y)| (scale(&x).into_iter().collect::<ndarray::Array1<f32>>(), y));
///
/// // What the chief does: train, and save the weights at the end of each epoch.
/// let mut trained = Model::new(OneDeviceStrategy::new(), || models::mnist_mlp(1))?;
/// trained.compile(Sgd::new(0.1), loss(), &["accuracy"])?;
/// let train = trained.distribute_dataset(digits.clone(), 64)?;
/// trained.fit(&train).verbose(false).run()?;
/// trained.save_weights(dir.path().join("ckpt-1"))?;
///
/// // The evaluator task: its own model, compiled for the loss and metrics.
/// let mut model = Model::new(OneDeviceStrategy::new(), || models::mnist_mlp(2))?;
/// model.compile(Sgd::new(0.1), loss(), &["accuracy"])?;
/// let test = model.distribute_dataset(digits, 64)?;
/// let evaluations = SidecarEvaluator::new(&mut model, &test, dir.path())
///     .max_evaluations(1) // stop after the checkpoint numbered 1
///     .start()?;
/// assert_eq!(evaluations[0].iterations, 4); // 256 digits in batches of 64
/// assert!(evaluations[0].logs.get("accuracy").is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SidecarEvaluator<'a, D> {
    model: &'a mut Model,
    data: &'a D,
    checkpoint_dir: PathBuf,
    max_evaluations: Option<u64>,
    log_dir: Option<PathBuf>,
    timeout: Option<Duration>,
    poll: Duration,
}

impl<'a, D, B> SidecarEvaluator<'a, D>
where
    D: Dataset<Item = Vec<B>>,
    B: LabeledBatch,
{
    /// Evaluates `model` (compiled) on `data` (from
    /// [`Model::distribute_dataset`]) with each checkpoint that appears in `checkpoint_dir`.
    pub fn new(model: &'a mut Model, data: &'a D, checkpoint_dir: impl Into<PathBuf>) -> Self {
        Self {
            model,
            data,
            checkpoint_dir: checkpoint_dir.into(),
            max_evaluations: None,
            log_dir: None,
            timeout: None,
            poll: Duration::from_millis(500),
        }
    }

    /// Stops after evaluating a checkpoint numbered `last` or higher: with `ckpt-{epoch}`, the
    /// last epoch's. TensorFlow's `max_evaluations` means the same. Without it, evaluation
    /// goes on until [`timeout`](Self::timeout) (or for ever, as TensorFlow's).
    #[must_use]
    pub fn max_evaluations(mut self, last: u64) -> Self {
        self.max_evaluations = Some(last);
        self
    }

    /// Logs each evaluation for `TensorBoard` as Keras' `TensorBoard` callback does in the
    /// evaluator: event files in `log_dir/validation`, scalars
    /// `evaluation_<name>_vs_iterations` at the checkpoint's training step.
    #[must_use]
    pub fn log_dir(mut self, log_dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(log_dir.into());
        self
    }

    /// Gives up when no new checkpoint appears for this long: an error if
    /// [`max_evaluations`](Self::max_evaluations) was not reached (the chief died or writes
    /// elsewhere), the end of evaluation otherwise.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How often to look for a new checkpoint (default 0.5 s).
    #[must_use]
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Evaluates checkpoints until the last one (see
    /// [`max_evaluations`](Self::max_evaluations)) and returns every evaluation made.
    ///
    /// # Errors
    ///
    /// When the model is not compiled, `max_evaluations` is 0, a checkpoint holds another
    /// model's variables or no `iterations`, the data fails, the log directory cannot be
    /// written, or the timeout passes before the last checkpoint.
    pub fn start(self) -> Result<Vec<Evaluation>, TrainError> {
        if self.model.compiled.is_none() {
            return Err(not_compiled());
        }
        if self.max_evaluations == Some(0) {
            return Err(TrainError::invalid(
                "SidecarEvaluator",
                "max_evaluations of 0: nothing would be evaluated",
            ));
        }
        let mut writer = self
            .log_dir
            .as_ref()
            .map(|dir| EventWriter::create(&dir.join("validation")))
            .transpose()?;
        let mut watcher =
            CheckpointWatcher::new(NumberedWeightFiles(self.checkpoint_dir.clone()), self.poll);
        let mut evaluations = Vec::new();
        loop {
            let deadline = self.timeout.map(|t| Instant::now() + t);
            let Some((number, checkpoint, (tensors, metadata))) = watcher.wait_for_new(deadline)?
            else {
                return match self.max_evaluations {
                    Some(last) => Err(TrainError::invalid(
                        "SidecarEvaluator",
                        format!(
                            "no new checkpoint in {} for {:?}; the last one evaluated was {}, and evaluation stops after number {last}",
                            self.checkpoint_dir.display(),
                            self.timeout.unwrap_or_default(),
                            evaluations.last().map_or_else(
                                || "none".to_owned(),
                                |e: &Evaluation| e.number.to_string()
                            ),
                        ),
                    )),
                    None => Ok(evaluations),
                };
            };
            let iterations = iterations_of(&checkpoint, &metadata)?;
            self.model.set_weights(tensors)?;
            let logs = self.model.evaluate(self.data)?;
            tracing::info!(
                checkpoint = %checkpoint.display(),
                iterations,
                "evaluation: {}",
                logs.line()
            );
            if let Some(writer) = &mut writer {
                let scalars: Vec<(String, f64)> = logs
                    .0
                    .iter()
                    .map(|(name, value)| (format!("evaluation_{name}_vs_iterations"), *value))
                    .collect();
                writer.scalars(iterations, &scalars)?;
                writer.flush()?;
            }
            evaluations.push(Evaluation {
                checkpoint,
                number,
                iterations,
                logs,
            });
            if self.max_evaluations.is_some_and(|last| number >= last) {
                return Ok(evaluations);
            }
        }
    }
}

/// The training step of a weights file, from its metadata.
fn iterations_of(path: &Path, metadata: &BTreeMap<String, String>) -> Result<u64, TrainError> {
    let bad = |why: String| {
        TrainError::invalid(
            "SidecarEvaluator",
            format!("checkpoint {}: {why}", path.display()),
        )
    };
    let value = metadata.get(ITERATIONS).ok_or_else(|| {
        bad("it records no `iterations` (write checkpoints with ModelCheckpoint or Model::save_weights)".into())
    })?;
    value
        .parse()
        .map_err(|_| bad(format!("its `iterations` {value:?} is not a step count")))
}

/// Weights files `<prefix>-<number>[.<extension>]` in a directory.
struct NumberedWeightFiles(PathBuf);

impl CheckpointSource for NumberedWeightFiles {
    type Checkpoint = (Vec<NamedTensor>, BTreeMap<String, String>);

    fn list(&self) -> Result<BTreeMap<u64, PathBuf>, TrainError> {
        let unreadable = |e: std::io::Error| {
            TrainError::invalid(
                "SidecarEvaluator",
                format!("reading {}: {e}", self.0.display()),
            )
        };
        let entries = match fs::read_dir(&self.0) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(unreadable(e)),
        };
        let mut found = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(unreadable)?;
            let Some(number) = entry.file_name().to_str().and_then(checkpoint_number) else {
                continue;
            };
            if entry.path().is_file() {
                found.insert(number, entry.path());
            }
        }
        Ok(found)
    }

    fn read(&self, _number: u64, path: &Path) -> Result<Self::Checkpoint, TrainError> {
        Ok(read_tensors_with_metadata(path)?)
    }
}

/// The number of a checkpoint file's name `<prefix>-<number>[.<extension>]`; `None` for a
/// hidden file or another name.
fn checkpoint_number(name: &str) -> Option<u64> {
    if name.starts_with('.') {
        return None;
    }
    let stem = name.split_once('.').map_or(name, |(stem, _)| stem);
    let (_, digits) = stem.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn checkpoint_names_carry_their_number_before_any_extension() {
        assert_eq!(checkpoint_number("ckpt-3"), Some(3));
        assert_eq!(checkpoint_number("ckpt-12.safetensors"), Some(12));
        assert_eq!(checkpoint_number("model-weights-007"), Some(7));
        assert_eq!(checkpoint_number(".ckpt-3.tmp-4242"), None);
        assert_eq!(checkpoint_number("ckpt-"), None);
        assert_eq!(checkpoint_number("ckpt-3a"), None);
        assert_eq!(checkpoint_number("ckpt-+3"), None);
        assert_eq!(checkpoint_number("weights.03.safetensors"), None);
        assert_eq!(checkpoint_number("ckpt-99999999999999999999"), None);
    }

    #[test]
    fn a_file_without_iterations_is_a_clear_error() {
        let err = iterations_of(Path::new("ckpt-1"), &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("records no `iterations`"), "{err}");
        let metadata = BTreeMap::from([(ITERATIONS.to_owned(), "-1".to_owned())]);
        let err = iterations_of(Path::new("ckpt-1"), &metadata).unwrap_err();
        assert!(err.to_string().contains("not a step count"), "{err}");
    }

    proptest! {
        #[test]
        fn any_file_name_parses_without_panicking(name in "\\PC{0,24}") {
            if let Some(number) = checkpoint_number(&name) {
                let suffix = format!("-{number}");
                prop_assert!(name.contains(&suffix) || name.contains("-0"));
            }
        }
    }
}
