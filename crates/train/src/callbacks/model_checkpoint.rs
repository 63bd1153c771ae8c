//! `ModelCheckpoint`: the model's weights, saved as training goes.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::callbacks::{Callback, CallbackState, Mode, SaveFreq, TrainingContext, f64_bits};
use crate::error::TrainError;
use crate::history::Logs;

const NAME: &str = "ModelCheckpoint";

/// What a backup keeps of a `ModelCheckpoint`: the best value of its monitor so far.
#[derive(Serialize, Deserialize)]
struct Saved {
    monitor: String,
    #[serde(with = "f64_bits")]
    best: Option<f64>,
}

/// Saves the whole model (or with [`ModelCheckpoint::save_weights_only`]`(true)`, or a path
/// ending in `.safetensors`, only the weights) to a path made from a pattern, as
/// `tf.keras.callbacks.ModelCheckpoint` (whose default is the whole model too, and whose
/// `.weights.h5` paths are weights): `{epoch}` (from 1), `{batch}` (the step of the epoch, from
/// 1), and any logged value by name (`{val_loss}`), each with an optional format as Keras
/// writes them (`{epoch:02d}`, `{val_loss:.2f}`). A whole model is a directory that
/// [`Model::load`](crate::Model::load) reads back (given the pattern's directory, it loads the
/// newest); weights are a safetensors file named by variable, which
/// [`Model::load_weights`](crate::Model::load_weights) reads.
///
/// With `save_best_only`, a save happens only when `monitor` improved (direction from `mode`);
/// the best value so far is in every backup, so a resumed run does not overwrite the best
/// model with a worse one.
/// The chief writes; every worker learns whether it could, so an unwritable path stops
/// training everywhere with the reason.
#[derive(Debug, Clone)]
pub struct ModelCheckpoint {
    pattern: String,
    save_freq: SaveFreq,
    monitor: String,
    mode: Mode,
    save_best_only: bool,
    /// As set; by default, whether the pattern names a `.safetensors` file.
    weights_only: Option<bool>,
    best: Option<f64>,
}

impl ModelCheckpoint {
    /// Saves after every epoch to `filepath` (a pattern).
    pub fn new(filepath: impl Into<String>) -> Self {
        Self {
            pattern: filepath.into(),
            save_freq: SaveFreq::Epoch,
            monitor: "val_loss".into(),
            mode: Mode::Auto,
            save_best_only: false,
            weights_only: None,
            best: None,
        }
    }

    /// Sets when to save.
    #[must_use]
    pub fn save_freq(mut self, save_freq: SaveFreq) -> Self {
        self.save_freq = save_freq;
        self
    }

    /// Saves only when `monitor` (a logged value, default `val_loss`) improves.
    #[must_use]
    pub fn save_best_only(mut self, monitor: impl Into<String>, mode: Mode) -> Self {
        self.save_best_only = true;
        self.monitor = monitor.into();
        self.mode = mode;
        self
    }

    /// With `true`, saves only the weights (a safetensors file); with `false`, the whole model
    /// ([`Model::save`](crate::Model::save): one more checkpoint directory inside the
    /// formatted path, which [`Model::load`](crate::Model::load) reads). Without it, a pattern
    /// ending in `.safetensors` saves weights and any other the whole model.
    #[must_use]
    pub fn save_weights_only(mut self, weights_only: bool) -> Self {
        self.weights_only = Some(weights_only);
        self
    }

    fn weights_only(&self) -> bool {
        self.weights_only
            .unwrap_or_else(|| self.pattern.ends_with(".safetensors"))
    }

    fn save(
        &mut self,
        epoch: u64,
        batch: Option<u64>,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        if self.save_best_only {
            let Some(value) = logs.get(&self.monitor) else {
                tracing::warn!(monitor = %self.monitor, "ModelCheckpoint: the monitored value is not logged; not saving");
                return Ok(());
            };
            if !self.mode.improves(&self.monitor, value, self.best, 0.0) {
                return Ok(());
            }
            self.best = Some(value);
        }
        let path = PathBuf::from(format_path(&self.pattern, epoch + 1, batch, logs)?);
        let weights_only = self.weights_only();
        ctx.chief_writes("ModelCheckpoint", &path.display().to_string(), |ctx| {
            // As Keras, the pattern's directory is made when missing.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    TrainError::invalid(
                        "ModelCheckpoint",
                        format!("creating {}: {e}", dir.display()),
                    )
                })?;
            }
            if weights_only {
                ctx.model().save_weights(&path)
            } else {
                ctx.model().save(&path).map(|_| ())
            }
        })
    }
}

impl Callback for ModelCheckpoint {
    fn on_train_begin(&mut self, _ctx: &mut TrainingContext<'_>) -> Result<(), TrainError> {
        if let SaveFreq::Steps(0) = self.save_freq {
            return Err(TrainError::invalid(
                "ModelCheckpoint",
                "save_freq of 0 steps",
            ));
        }
        // A bad pattern fails now, not after an epoch of training.
        format_path(&self.pattern, 1, Some(1), &Logs::default()).map(|_| ())
    }

    fn on_train_batch_end(
        &mut self,
        batch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        match self.save_freq {
            SaveFreq::Steps(n) if ctx.step().is_multiple_of(n) => {
                self.save(ctx.epoch(), Some(batch + 1), logs, ctx)
            }
            _ => Ok(()),
        }
    }

    fn on_epoch_end(
        &mut self,
        epoch: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), TrainError> {
        match self.save_freq {
            SaveFreq::Epoch => self.save(epoch, None, logs, ctx),
            SaveFreq::Steps(_) => Ok(()),
        }
    }

    fn state(&self) -> Option<CallbackState> {
        if !self.save_best_only {
            return None;
        }
        let saved = Saved {
            monitor: self.monitor.clone(),
            best: self.best,
        };
        CallbackState::new(NAME, &saved).ok()
    }

    fn restore_state(&mut self, state: &CallbackState) -> Result<(), TrainError> {
        let saved: Saved = state.value(NAME)?;
        if saved.monitor == self.monitor {
            self.best = saved.best;
        } else {
            tracing::warn!(
                saved = %saved.monitor,
                monitor = %self.monitor,
                "ModelCheckpoint: the backup watched another value; starting afresh"
            );
        }
        Ok(())
    }
}

/// Fills `{name[:format]}` fields of `pattern`: `epoch` and `batch` are integers (format
/// `0Nd` pads), logged values are numbers (format `.Nf` rounds); a logged value that is not
/// there yet formats as 0, as it may appear only at an epoch's end.
pub(crate) fn format_path(
    pattern: &str,
    epoch: u64,
    batch: Option<u64>,
    logs: &Logs,
) -> Result<String, TrainError> {
    let bad = |why: String| TrainError::invalid("ModelCheckpoint filepath", why);
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| bad(format!("{pattern:?} opens a field it does not close")))?;
        let field = &rest[open + 1..open + close];
        let (name, format) = field.split_once(':').unwrap_or((field, ""));
        let integer = match name {
            "epoch" => Some(epoch),
            "batch" => Some(batch.unwrap_or(0)),
            _ => None,
        };
        match integer {
            Some(value) => {
                let width = match format {
                    "" => 0,
                    _ => format
                        .strip_suffix('d')
                        .and_then(|w| {
                            if w.is_empty() {
                                Some(0)
                            } else {
                                w.parse().ok()
                            }
                        })
                        .ok_or_else(|| bad(format!("{field:?}: use a format like 02d")))?,
                };
                let _ = write!(out, "{value:0width$}");
            }
            None if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.is_empty() =>
            {
                let value = logs.get(name).unwrap_or(0.0);
                let precision = match format {
                    "" => None,
                    _ => Some(
                        format
                            .strip_prefix('.')
                            .and_then(|p| p.strip_suffix('f'))
                            .and_then(|p| p.parse::<usize>().ok())
                            .ok_or_else(|| bad(format!("{field:?}: use a format like .2f")))?,
                    ),
                };
                match precision {
                    Some(p) => {
                        let _ = write!(out, "{value:.p$}");
                    }
                    None => {
                        let _ = write!(out, "{value}");
                    }
                }
            }
            None => return Err(bad(format!("{field:?} is not a field name"))),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn patterns_fill_epoch_batch_and_logged_values_as_keras_does() {
        let logs = Logs(BTreeMap::from([("val_loss".to_owned(), 0.123_456)]));
        let path = format_path(
            "ckpt/w.{epoch:02d}-{val_loss:.2f}.safetensors",
            3,
            None,
            &logs,
        )
        .unwrap();
        assert_eq!(path, "ckpt/w.03-0.12.safetensors");
        assert_eq!(format_path("b{batch}", 1, Some(7), &logs).unwrap(), "b7");
        for bad in ["w{epoch", "w{epoch:x}", "w{val loss}", "w{val_loss:2}"] {
            assert!(format_path(bad, 1, None, &logs).is_err(), "{bad}");
        }
    }
}
