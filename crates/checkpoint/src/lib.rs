//! Crash-safe training checkpoints: each a directory of [safetensors] files (weights,
//! optimizer slots) and a JSON manifest (where training stood, the trainer's own state, a
//! CRC32C checksum per file), saved atomically and restored from the newest intact one.
//!
//! ```
//! use lockstep_checkpoint::{Checkpoint, CheckpointManager, NamedTensor, Progress};
//!
//! let dir = tempfile::tempdir()?;
//! let manager = CheckpointManager::new(dir.path().join("backup"), Some(1))?;
//! let mut checkpoint = Checkpoint::new(Progress { step: 62, epoch: 1, worker_count: 2, seed: 42, ..Progress::default() });
//! checkpoint.files.insert("model".into(), vec![NamedTensor::new("dense/bias", vec![2], vec![0.5, -0.5])?]);
//! manager.save(&checkpoint)?;
//!
//! // After a crash, on any number of workers:
//! let restored = manager.latest()?.expect("one was saved");
//! assert_eq!(restored, checkpoint);
//! restored.check_variables("model", &[("dense/bias", &[2])])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On disk (`ckpt-<step>/`): `<key>.safetensors` per entry of [`Checkpoint::files`] (tensor
//! names are the variables' names, e.g. `conv2d/kernel`), `manifest.json`, and `latest` beside
//! the checkpoints naming the newest. Any safetensors reader opens the files (Python:
//! `safetensors.numpy.load_file`).
//!
//! Single files of tensors, as Keras' `save_weights` writes them: [`write_tensors`] (with
//! header metadata: [`write_tensors_with_metadata`]) and [`read_tensors`].
//!
//! The format does not depend on the number of workers: [`Progress`] counts examples over
//! all of them, so a checkpoint restores on a cluster of another size.
//!
//! Dependencies: `safetensors` for the tensor files (a format `PyTorch` and Hugging Face
//! users read); `serde`/`serde_json` for the manifest; `crc32c` for checksums (hardware-accelerated);
//! `nix` for `renameat2(RENAME_EXCHANGE)` (a step saved again swaps in with no instant
//! without it) and `O_NOFOLLOW` (a checkpoint file that is a link is refused unread);
//! `bytemuck` to copy a tensor's `f32`s to and from the file's little-endian bytes as one
//! block; `thiserror` for errors; `tracing` to warn about damaged checkpoints.
//!
//! [safetensors]: https://huggingface.co/docs/safetensors

mod durable;
mod error;
mod file;
mod manager;
mod manifest;
mod tensors;

use std::collections::BTreeMap;

pub use error::CheckpointError;
pub use file::{
    read_tensors, read_tensors_with_metadata, write_tensors, write_tensors_with_metadata,
};
pub use manager::CheckpointManager;
pub use manifest::Progress;
pub use tensors::NamedTensor;

/// Everything one checkpoint holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Where training stood.
    pub progress: Progress,
    /// Named groups of tensors, each saved as `<key>.safetensors` (keys: 1 to 64 of `a-z`,
    /// `0-9`, `_`, `-`), e.g. `model` and `optimizer`.
    pub files: BTreeMap<String, Vec<NamedTensor>>,
    /// The trainer's own state: optimizer settings and iteration count, callbacks' state.
    pub meta: serde_json::Value,
}

impl Checkpoint {
    /// A checkpoint with no files yet.
    pub fn new(progress: Progress) -> Self {
        Self {
            progress,
            files: BTreeMap::new(),
            meta: serde_json::Value::Null,
        }
    }

    /// The tensors of file `key`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Mismatch`] when the checkpoint has no such file.
    pub fn file(&self, key: &str) -> Result<&[NamedTensor], CheckpointError> {
        self.files
            .get(key)
            .map(Vec::as_slice)
            .ok_or_else(|| CheckpointError::Mismatch {
                what: format!("file {key}"),
                expected: "present".into(),
                found: format!("only {:?}", self.files.keys().collect::<Vec<_>>()),
            })
    }

    /// Tensor `name` of file `key`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Mismatch`] when there is no such file or tensor.
    pub fn tensor(&self, key: &str, name: &str) -> Result<&NamedTensor, CheckpointError> {
        self.file(key)?
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| CheckpointError::Mismatch {
                what: format!("variable {name} in {key}"),
                expected: "present".into(),
                found: "no such variable".into(),
            })
    }

    /// Checks that file `key` holds exactly the variables `want`, with those shapes: a
    /// checkpoint of another model is an error naming the first difference.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Mismatch`] naming a missing, extra or differently shaped variable.
    pub fn check_variables(
        &self,
        key: &str,
        want: &[(&str, &[usize])],
    ) -> Result<(), CheckpointError> {
        let have = self.file(key)?;
        for (name, shape) in want {
            let found = self.tensor(key, name)?;
            if found.shape != *shape {
                return Err(CheckpointError::Mismatch {
                    what: format!("variable {name} in {key}"),
                    expected: format!("shape {shape:?}"),
                    found: format!("shape {:?}", found.shape),
                });
            }
        }
        if let Some(extra) = have
            .iter()
            .find(|t| !want.iter().any(|(n, _)| *n == t.name))
        {
            return Err(CheckpointError::Mismatch {
                what: format!("variable {} in {key}", extra.name),
                expected: "no such variable".into(),
                found: format!("shape {:?}", extra.shape),
            });
        }
        Ok(())
    }
}
