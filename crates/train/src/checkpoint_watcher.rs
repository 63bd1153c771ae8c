//! Waiting for the chief's checkpoints: what an evaluator does between evaluations. The
//! Estimator's evaluator task watches a [`CheckpointManager`] directory, the
//! [`SidecarEvaluator`](crate::SidecarEvaluator) a directory of weights files; both through
//! one [`CheckpointWatcher`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockstep_checkpoint::{Checkpoint, CheckpointError, CheckpointManager};

use crate::error::TrainError;

/// A directory of numbered checkpoints, as a watcher reads it.
pub(crate) trait CheckpointSource {
    /// What reading one gives.
    type Checkpoint;

    /// The checkpoints there now, by number, with their paths. Writers rename checkpoints
    /// into place whole, so each one listed is complete.
    fn list(&self) -> Result<BTreeMap<u64, PathBuf>, TrainError>;

    /// Reads checkpoint `number` at `path`.
    fn read(&self, number: u64, path: &Path) -> Result<Self::Checkpoint, TrainError>;
}

/// The `ckpt-<step>` checkpoints of a [`CheckpointManager`] directory.
pub(crate) struct ManagedCheckpoints(pub(crate) PathBuf);

impl CheckpointSource for ManagedCheckpoints {
    type Checkpoint = Checkpoint;

    fn list(&self) -> Result<BTreeMap<u64, PathBuf>, TrainError> {
        // Opening a manager creates its directory; a watcher must not.
        if !self.0.is_dir() {
            return Ok(BTreeMap::new());
        }
        let manager = CheckpointManager::new(&self.0, None)?;
        Ok(manager
            .steps()?
            .into_iter()
            .map(|step| (step, self.0.join(format!("ckpt-{step}"))))
            .collect())
    }

    fn read(&self, number: u64, _path: &Path) -> Result<Checkpoint, TrainError> {
        Ok(CheckpointManager::new(&self.0, None)?.restore(number)?)
    }
}

/// Hands out each new checkpoint of a [`CheckpointSource`] once, the newest first: one that
/// a newer one overtook before it was looked at is skipped, as TensorFlow's evaluators skip
/// them. A damaged one is skipped with a warning, once.
pub(crate) struct CheckpointWatcher<S> {
    source: S,
    last: Option<u64>,
    damaged: BTreeSet<u64>,
    poll: Duration,
}

impl<S: CheckpointSource> CheckpointWatcher<S> {
    pub(crate) fn new(source: S, poll: Duration) -> Self {
        Self {
            source,
            last: None,
            damaged: BTreeSet::new(),
            poll,
        }
    }

    /// The newest intact checkpoint not handed out before, with its number and path, if one
    /// is there now.
    pub(crate) fn newest_unseen(
        &mut self,
    ) -> Result<Option<(u64, PathBuf, S::Checkpoint)>, TrainError> {
        let listed = self.source.list()?;
        for (&number, path) in listed.iter().rev() {
            if Some(number) <= self.last {
                break;
            }
            if self.damaged.contains(&number) {
                continue;
            }
            match self.source.read(number, path) {
                Ok(checkpoint) => {
                    self.last = Some(number);
                    return Ok(Some((number, path.clone(), checkpoint)));
                }
                Err(TrainError::Checkpoint(e @ CheckpointError::Damaged { .. })) => {
                    tracing::warn!("{e}; skipping it");
                    self.damaged.insert(number);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Waits until [`newest_unseen`](Self::newest_unseen) has one or `deadline` passes.
    pub(crate) fn wait_for_new(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<(u64, PathBuf, S::Checkpoint)>, TrainError> {
        loop {
            if let Some(found) = self.newest_unseen()? {
                return Ok(Some(found));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            std::thread::sleep(self.poll);
        }
    }
}

#[cfg(test)]
mod tests {
    use lockstep_checkpoint::{NamedTensor, Progress};

    use super::*;

    fn save(manager: &CheckpointManager, step: u64) {
        let mut checkpoint = Checkpoint::new(Progress {
            step,
            ..Progress::default()
        });
        checkpoint.files.insert(
            "model".into(),
            vec![NamedTensor::new("w", vec![1], vec![step as f32]).unwrap()],
        );
        manager.save(&checkpoint).unwrap();
    }

    fn watcher(dir: &Path) -> CheckpointWatcher<ManagedCheckpoints> {
        CheckpointWatcher::new(
            ManagedCheckpoints(dir.to_path_buf()),
            Duration::from_millis(1),
        )
    }

    #[test]
    fn each_checkpoint_is_handed_out_once_and_overtaken_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        let mut watcher = watcher(dir.path());
        assert!(watcher.newest_unseen().unwrap().is_none());
        save(&manager, 10);
        save(&manager, 20);
        let (number, _, checkpoint) = watcher.newest_unseen().unwrap().unwrap();
        assert_eq!((number, checkpoint.progress.step), (20, 20));
        assert!(watcher.newest_unseen().unwrap().is_none());
        save(&manager, 30);
        assert_eq!(watcher.newest_unseen().unwrap().unwrap().0, 30);
    }

    #[test]
    fn a_damaged_checkpoint_is_skipped_for_the_newest_intact_one() {
        let dir = tempfile::tempdir().unwrap();
        let manager = CheckpointManager::new(dir.path(), None).unwrap();
        save(&manager, 10);
        save(&manager, 20);
        std::fs::write(dir.path().join("ckpt-20/model.safetensors"), b"garbage").unwrap();
        let mut watcher = watcher(dir.path());
        assert_eq!(watcher.newest_unseen().unwrap().unwrap().0, 10);
        assert!(watcher.newest_unseen().unwrap().is_none());
    }

    #[test]
    fn waiting_ends_at_the_deadline_without_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut watcher = watcher(&dir.path().join("not-yet"));
        let found = watcher
            .wait_for_new(Some(Instant::now() + Duration::from_millis(20)))
            .unwrap();
        assert!(found.is_none());
        assert!(!dir.path().join("not-yet").exists());
    }
}
