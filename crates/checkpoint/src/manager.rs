//! `CheckpointManager`: numbered checkpoints in one directory, saved atomically, restored from
//! the newest intact one.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::Checkpoint;
use crate::durable::{Op, sync_dir};
use crate::error::CheckpointError;
use crate::manifest::{FORMAT, FileEntry, MAX_MANIFEST_BYTES, Manifest, VERSION, valid_key};
use crate::tensors::{decode, encode};

const MANIFEST: &str = "manifest.json";
/// Names the newest checkpoint, for people and tools (as TensorFlow's `checkpoint` file does).
const LATEST: &str = "latest";
const PREFIX: &str = "ckpt-";
/// Directories of saves in progress, and of checkpoints being replaced or removed.
const TEMPORARY: &str = ".tmp-";

/// A directory of checkpoints `ckpt-<step>`, each a directory of safetensors files and a
/// `manifest.json` with a checksum for each.
///
/// [`save`](Self::save) writes into a temporary directory, flushes every file and the
/// directory to disk, renames it into place and then rewrites the `latest` pointer the same
/// way, so a crash at any instant leaves the previous checkpoint intact.
/// [`latest`](Self::latest) verifies checksums and falls back, with a warning, to the newest
/// checkpoint that is intact.
///
/// ```
/// use lockstep_checkpoint::{Checkpoint, CheckpointManager, NamedTensor, Progress};
///
/// let dir = tempfile::tempdir()?;
/// let manager = CheckpointManager::new(dir.path(), Some(2))?;
/// for step in [10, 20, 30] {
///     let mut checkpoint = Checkpoint::new(Progress { step, ..Progress::default() });
///     checkpoint.files.insert("model".into(), vec![NamedTensor::new("w", vec![2], vec![1.0, step as f32])?]);
///     manager.save(&checkpoint)?;
/// }
/// let latest = manager.latest()?.expect("saved above");
/// assert_eq!(latest.progress.step, 30);
/// assert_eq!(latest.tensor("model", "w")?.values, [1.0, 30.0]);
/// assert_eq!(manager.steps()?, [20, 30]); // max_to_keep = 2
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointManager {
    dir: PathBuf,
    max_to_keep: Option<usize>,
}

impl CheckpointManager {
    /// Manages checkpoints in `dir` (created if missing), keeping the `max_to_keep` newest
    /// (`None`: all). Leftovers of saves that a crash interrupted are removed by the next `save`.
    ///
    /// # Errors
    ///
    /// When `dir` cannot be created or read, or `max_to_keep` is `Some(0)`.
    pub fn new(
        dir: impl Into<PathBuf>,
        max_to_keep: Option<usize>,
    ) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        if max_to_keep == Some(0) {
            return Err(CheckpointError::Invalid(
                "max_to_keep must be at least 1".into(),
            ));
        }
        fs::create_dir_all(&dir).map_err(CheckpointError::io("creating", &dir))?;
        Ok(Self { dir, max_to_keep })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves `checkpoint` as `ckpt-<step>` (replacing one of the same step), points `latest`
    /// at it and removes checkpoints beyond `max_to_keep`. Returns its directory.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Invalid`] for a malformed checkpoint (a bad file key, values that do
    /// not fill their shape); [`CheckpointError::Io`] when the disk refuses. The previous
    /// checkpoint stays intact either way.
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<PathBuf, CheckpointError> {
        self.save_with_hook(checkpoint, || {})
    }

    /// As [`save`](Self::save), calling `before_publish` once every file of the checkpoint is
    /// written and synced in its temporary directory, just before the first rename publishes
    /// it: the moment a crash tests the atomicity of saving (`LOCKSTEP_KILL_IN_SAVE` in
    /// `lockstep-train` kills the process there).
    ///
    /// # Errors
    ///
    /// As [`save`](Self::save).
    pub fn save_with_hook(
        &self,
        checkpoint: &Checkpoint,
        before_publish: impl FnOnce(),
    ) -> Result<PathBuf, CheckpointError> {
        // Only a writer clears what crashed saves left: a reader (an evaluator watching the
        // directory) must not remove the writer's save in progress.
        for entry in self.entries()? {
            if !entry.starts_with(TEMPORARY) {
                continue;
            }
            // A checkpoint set aside by a save that could not swap and then crashed: the
            // only copy of its step when none stands under the step's name.
            if let Some(name) = set_aside(&entry)
                && !self.dir.join(name).exists()
            {
                Op::Rename {
                    from: self.dir.join(&entry),
                    to: self.dir.join(name),
                }
                .run()?;
                continue;
            }
            Op::RemoveAll(self.dir.join(entry)).run()?;
        }
        let (path, ops) = self.plan(checkpoint)?;
        let mut before_publish = Some(before_publish);
        for op in &ops {
            if matches!(op, Op::Rename { .. })
                && let Some(hook) = before_publish.take()
            {
                hook();
            }
            op.run()?;
        }
        tracing::debug!(path = %path.display(), step = checkpoint.progress.step, "checkpoint saved");
        Ok(path)
    }

    /// The file-system operations of [`save`](Self::save), in order.
    pub(crate) fn plan(
        &self,
        checkpoint: &Checkpoint,
    ) -> Result<(PathBuf, Vec<Op>), CheckpointError> {
        let step = checkpoint.progress.step;
        let name = format!("{PREFIX}{step}");
        let pid = std::process::id();
        let temporary = self.dir.join(format!("{TEMPORARY}{name}-{pid}"));
        let replaced = self.dir.join(format!("{TEMPORARY}old-{name}-{pid}"));
        let path = self.dir.join(&name);

        let mut ops = vec![
            Op::RemoveAll(temporary.clone()),
            Op::CreateDir(temporary.clone()),
        ];
        let mut files = Vec::with_capacity(checkpoint.files.len());
        for (key, tensors) in &checkpoint.files {
            if !valid_key(key) {
                return Err(CheckpointError::Invalid(format!(
                    "file key {key:?}: use 1 to 64 of a-z, 0-9, '_' and '-'"
                )));
            }
            let bytes = encode(tensors, &BTreeMap::new())?;
            files.push(FileEntry {
                key: key.clone(),
                tensors: tensors.iter().map(|t| t.name.clone()).collect(),
                bytes: bytes.len() as u64,
                crc32c: crc32c::crc32c(&bytes),
            });
            ops.push(Op::Write {
                path: temporary.join(format!("{key}.safetensors")),
                bytes,
            });
        }
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            progress: checkpoint.progress,
            meta: checkpoint.meta.clone(),
            files,
        };
        let manifest = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| CheckpointError::Invalid(format!("encoding the manifest: {e}")))?;
        ops.push(Op::Write {
            path: temporary.join(MANIFEST),
            bytes: manifest,
        });
        ops.push(Op::SyncDir(temporary.clone()));
        if path.exists() {
            // Saved again: the new copy and the old swap names in one step, so the step's
            // checkpoint is there at every instant (then the old copy goes).
            ops.push(Op::Exchange {
                new: temporary.clone(),
                old: path.clone(),
                aside: replaced.clone(),
            });
            ops.push(Op::SyncDir(self.dir.clone()));
            ops.push(Op::RemoveAll(temporary));
        } else {
            ops.push(Op::Rename {
                from: temporary,
                to: path.clone(),
            });
            ops.push(Op::SyncDir(self.dir.clone()));
        }
        ops.push(Op::RemoveAll(replaced));
        let pointer = self.dir.join(format!("{TEMPORARY}{LATEST}-{pid}"));
        ops.push(Op::Write {
            path: pointer.clone(),
            bytes: format!("{name}\n").into_bytes(),
        });
        ops.push(Op::Rename {
            from: pointer,
            to: self.dir.join(LATEST),
        });
        ops.push(Op::SyncDir(self.dir.clone()));
        if let Some(keep) = self.max_to_keep {
            let mut steps = self.steps()?;
            steps.retain(|&s| s != step);
            steps.push(step);
            steps.sort_unstable();
            let excess = steps.len().saturating_sub(keep);
            // Never the one just written, even if older ones carry larger steps.
            ops.extend(
                steps[..excess]
                    .iter()
                    .filter(|&&s| s != step)
                    .map(|s| Op::RemoveAll(self.dir.join(format!("{PREFIX}{s}")))),
            );
        }
        Ok((path, ops))
    }

    /// Steps of the checkpoints present, intact or not, in increasing order.
    ///
    /// # Errors
    ///
    /// When the directory cannot be read.
    pub fn steps(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut steps: Vec<u64> = self
            .entries()?
            .iter()
            .filter_map(|name| name.strip_prefix(PREFIX)?.parse().ok())
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// The newest intact checkpoint, or `None` when there is none. A damaged newer one is
    /// skipped with a warning naming what is wrong with it.
    ///
    /// # Errors
    ///
    /// When the directory cannot be read.
    pub fn latest(&self) -> Result<Option<Checkpoint>, CheckpointError> {
        let pointer = fs::read_to_string(self.dir.join(LATEST)).ok();
        for step in self.steps()?.into_iter().rev() {
            match self.restore(step) {
                Ok(checkpoint) => {
                    let name = format!("{PREFIX}{step}");
                    if pointer.as_deref().map(str::trim) != Some(name.as_str()) {
                        tracing::info!(
                            checkpoint = %self.dir.join(&name).display(),
                            "'latest' names another checkpoint (a save was cut short); using the newest intact one"
                        );
                    }
                    return Ok(Some(checkpoint));
                }
                Err(e @ (CheckpointError::Damaged { .. } | CheckpointError::Io { .. })) => {
                    tracing::warn!("{e}; falling back to an earlier checkpoint");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The checkpoint of `step`, verified against its manifest.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Damaged`] when a file is missing, truncated or fails its checksum;
    /// [`CheckpointError::Io`] when it cannot be read.
    pub fn restore(&self, step: u64) -> Result<Checkpoint, CheckpointError> {
        let path = self.dir.join(format!("{PREFIX}{step}"));
        let manifest_path = path.join(MANIFEST);
        let bytes = read_limited(&manifest_path, MAX_MANIFEST_BYTES)?;
        let manifest =
            Manifest::parse(&bytes).map_err(|why| CheckpointError::damaged(&path, why))?;
        if manifest.progress.step != step {
            return Err(CheckpointError::damaged(
                &path,
                format!("its manifest is of step {}", manifest.progress.step),
            ));
        }
        let mut files = BTreeMap::new();
        for entry in &manifest.files {
            let file = path.join(format!("{}.safetensors", entry.key));
            let bytes = read_limited(&file, entry.bytes)?;
            if bytes.len() as u64 != entry.bytes {
                return Err(CheckpointError::damaged(
                    &file,
                    format!("{} bytes, the manifest says {}", bytes.len(), entry.bytes),
                ));
            }
            let crc = crc32c::crc32c(&bytes);
            if crc != entry.crc32c {
                return Err(CheckpointError::damaged(
                    &file,
                    format!("checksum {crc:08x}, the manifest says {:08x}", entry.crc32c),
                ));
            }
            let mut tensors = decode(&bytes, &file)?;
            let mut ordered = Vec::with_capacity(tensors.len());
            for name in &entry.tensors {
                let Some(at) = tensors.iter().position(|t| t.name == *name) else {
                    return Err(CheckpointError::damaged(
                        &file,
                        format!("the manifest lists tensor {name}, the file lacks it"),
                    ));
                };
                ordered.push(tensors.swap_remove(at));
            }
            if let Some(extra) = tensors.first() {
                return Err(CheckpointError::damaged(
                    &file,
                    format!("tensor {} is not in the manifest", extra.name),
                ));
            }
            files.insert(entry.key.clone(), ordered);
        }
        Ok(Checkpoint {
            progress: manifest.progress,
            files,
            meta: manifest.meta,
        })
    }

    /// Removes the directory and every checkpoint in it (`BackupAndRestore` does after a
    /// successful run).
    ///
    /// # Errors
    ///
    /// When the file system refuses.
    pub fn delete_all(&self) -> Result<(), CheckpointError> {
        Op::RemoveAll(self.dir.clone()).run()?;
        if let Some(parent) = self.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(())
    }

    fn entries(&self) -> Result<Vec<String>, CheckpointError> {
        let read = fs::read_dir(&self.dir).map_err(CheckpointError::io("reading", &self.dir))?;
        let mut names = Vec::new();
        for entry in read {
            let entry = entry.map_err(CheckpointError::io("reading", &self.dir))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }
}

/// Reads a checkpoint file of at most `limit` bytes; a missing file, or anything but a
/// regular file (a symbolic link, a FIFO, a device), is damage, and so is a longer one, told
/// from its size before a byte is read.
fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, CheckpointError> {
    let (file, size) = crate::file::open_regular(path, false)?;
    if size > limit {
        return Err(CheckpointError::damaged(
            path,
            format!("{size} bytes, longer than the {limit} expected"),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(CheckpointError::io("reading", path))?;
    if bytes.len() as u64 > limit {
        return Err(CheckpointError::damaged(
            path,
            format!("longer than the {limit} bytes expected"),
        ));
    }
    Ok(bytes)
}

/// The checkpoint name (`ckpt-N`) of a copy a save set aside (`.tmp-old-ckpt-N-PID`).
fn set_aside(entry: &str) -> Option<&str> {
    let rest = entry.strip_prefix(TEMPORARY)?.strip_prefix("old-")?;
    let (name, pid) = rest.rsplit_once('-')?;
    (name.starts_with(PREFIX) && pid.parse::<u32>().is_ok()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NamedTensor, Progress};

    fn checkpoint(step: u64, fill: f32) -> Checkpoint {
        let mut c = Checkpoint::new(Progress {
            step,
            epoch: step / 10,
            examples_into_epoch: step * 64,
            worker_count: 2,
            seed: 42,
        });
        c.files.insert(
            "model".into(),
            vec![
                NamedTensor::new("dense/kernel", vec![3, 2], vec![fill; 6]).unwrap(),
                NamedTensor::new("dense/bias", vec![2], vec![-fill; 2]).unwrap(),
            ],
        );
        c.files.insert(
            "optimizer".into(),
            vec![NamedTensor::new("m/dense/bias", vec![2], vec![fill * 0.5; 2]).unwrap()],
        );
        c.meta = serde_json::json!({"optimizer": {"iterations": step}});
        c
    }

    #[test]
    fn a_save_cut_short_at_any_operation_leaves_an_intact_checkpoint() {
        let (old, new) = (checkpoint(10, 1.0), checkpoint(20, 2.0));
        let count = {
            let dir = tempfile::tempdir().unwrap();
            let manager = CheckpointManager::new(dir.path(), Some(1)).unwrap();
            manager.save(&old).unwrap();
            manager.plan(&new).unwrap().1.len()
        };
        for done in 0..=count {
            // The operation after the last one done may have half-written its file.
            for torn in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let manager = CheckpointManager::new(dir.path(), Some(1)).unwrap();
                manager.save(&old).unwrap();
                let (_, ops) = manager.plan(&new).unwrap();
                for op in &ops[..done] {
                    op.run().unwrap();
                }
                if torn && let Some(Op::Write { path, bytes }) = ops.get(done) {
                    fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
                }
                // A restarted process opens the directory afresh.
                let reopened = CheckpointManager::new(dir.path(), Some(1)).unwrap();
                let latest = reopened.latest().unwrap().expect("an intact checkpoint");
                let want = if done == count { &new } else { &latest };
                assert!(
                    latest == old || latest == new,
                    "after {done} operations: step {}",
                    latest.progress.step
                );
                assert_eq!(&latest, want, "a finished save is the latest");
            }
        }
    }

    #[test]
    fn a_step_saved_again_and_cut_short_at_any_operation_is_never_lost() {
        let (old, new) = (checkpoint(10, 1.0), checkpoint(10, 2.0));
        let count = {
            let dir = tempfile::tempdir().unwrap();
            let manager = CheckpointManager::new(dir.path(), Some(1)).unwrap();
            manager.save(&old).unwrap();
            manager.plan(&new).unwrap().1.len()
        };
        for done in 0..=count {
            let dir = tempfile::tempdir().unwrap();
            let manager = CheckpointManager::new(dir.path(), None).unwrap();
            manager.save(&old).unwrap();
            for op in &manager.plan(&new).unwrap().1[..done] {
                op.run().unwrap();
            }
            let reopened = CheckpointManager::new(dir.path(), None).unwrap();
            let latest = reopened.latest().unwrap().expect("the step's checkpoint");
            assert!(latest == old || latest == new, "after {done} operations");
            // The next save clears what the cut one left, and the step survives it.
            reopened.save(&checkpoint(11, 3.0)).unwrap();
            let again = reopened.restore(10).unwrap();
            assert!(again == old || again == new, "after {done} operations");
        }
    }

    #[test]
    fn links_fifos_and_sizes_beyond_the_file_are_damage_found_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        let path = manager.save(&checkpoint(10, 1.0)).unwrap();
        let file = path.join("model.safetensors");
        // A link to an endless device, with a manifest claiming a huge size.
        let manifest = fs::read_to_string(path.join(MANIFEST)).unwrap();
        let size = fs::metadata(&file).unwrap().len();
        fs::write(
            path.join(MANIFEST),
            manifest.replace(&format!("\"bytes\": {size}"), "\"bytes\": 1099511627776"),
        )
        .unwrap();
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
        let err = manager.restore(10).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        // A FIFO no one writes: refused when opened, not waited on.
        fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = manager.restore(10).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let err = crate::read_tensors(&file).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(manager.latest().unwrap().is_none());
    }

    #[test]
    fn a_copy_set_aside_by_a_save_that_crashed_is_put_back_by_the_next_writer() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        let path = manager.save(&checkpoint(10, 1.0)).unwrap();
        // Where the file system cannot swap, a save renames the old copy aside first.
        fs::rename(&path, dir.path().join(".tmp-old-ckpt-10-4242")).unwrap();
        manager.save(&checkpoint(11, 2.0)).unwrap();
        assert_eq!(manager.restore(10).unwrap(), checkpoint(10, 1.0));
        assert_eq!(manager.steps().unwrap(), [10, 11]);
        assert_eq!(set_aside(".tmp-old-ckpt-10-4242"), Some("ckpt-10"));
        assert_eq!(set_aside(".tmp-ckpt-10-4242"), None);
        assert_eq!(set_aside(".tmp-old-latest-4242"), None);
    }

    #[test]
    fn a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        manager.save(&checkpoint(10, 1.0)).unwrap();
        let newest = manager.save(&checkpoint(20, 2.0)).unwrap();
        let file = newest.join("model.safetensors");
        let good = fs::read(&file).unwrap();
        let mut bytes = good.clone();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&file, bytes).unwrap();
        let err = manager.restore(20).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        assert_eq!(manager.latest().unwrap().unwrap(), checkpoint(10, 1.0));
        fs::write(&file, &good[..good.len() - 1]).unwrap();
        let err = manager.restore(20).unwrap_err();
        assert!(
            err.to_string().contains("bytes, the manifest says"),
            "{err}"
        );
        fs::write(&file, good).unwrap();

        fs::remove_file(newest.join("optimizer.safetensors")).unwrap();
        let err = manager.restore(20).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        fs::write(newest.join(MANIFEST), b"{\"format\": ").unwrap();
        let err = manager.restore(20).unwrap_err();
        assert!(err.to_string().contains("manifest.json"), "{err}");
        assert_eq!(manager.latest().unwrap().unwrap().progress.step, 10);
    }

    #[test]
    fn saving_a_step_again_replaces_it_and_old_checkpoints_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), Some(2)).unwrap();
        for step in [1, 2, 3] {
            manager.save(&checkpoint(step, step as f32)).unwrap();
        }
        assert_eq!(manager.steps().unwrap(), [2, 3]);
        manager.save(&checkpoint(3, 9.0)).unwrap();
        assert_eq!(manager.steps().unwrap(), [2, 3]);
        assert_eq!(manager.latest().unwrap().unwrap(), checkpoint(3, 9.0));
        assert_eq!(
            fs::read_to_string(dir.path().join(LATEST)).unwrap(),
            "ckpt-3\n"
        );
        let leftovers: Vec<String> = manager
            .entries()
            .unwrap()
            .into_iter()
            .filter(|e| e.starts_with(TEMPORARY))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn an_empty_or_new_directory_has_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path().join("a/b"), None).unwrap();
        assert!(manager.latest().unwrap().is_none());
        assert!(matches!(
            manager.restore(5),
            Err(CheckpointError::Damaged { .. })
        ));
    }

    #[test]
    fn bad_keys_and_bad_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(CheckpointManager::new(dir.path(), Some(0)).is_err());
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        let mut c = checkpoint(1, 1.0);
        c.files.insert("../escape".into(), Vec::new());
        let err = manager.save(&c).unwrap_err();
        assert!(err.to_string().contains("file key"), "{err}");
        assert!(manager.steps().unwrap().is_empty());
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let err = CheckpointManager::new(file.join("sub"), None).unwrap_err();
        assert!(err.to_string().contains("not-a-dir"), "{err}");
    }
}
